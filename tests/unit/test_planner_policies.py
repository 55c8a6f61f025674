"""Policies: invariants on hand-made instances, optimality where brute force can check it, seed 001's example."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import POLICIES, Plan, PlanJob, PlanningInput, hetero
from slurmhet.planner.has import categories, category_count, market, unrank_category
from slurmhet.planner.pipeline import build_problem
from slurmhet.throughput import ThroughputTable

FAST = ("slurmhet", "has", "jps-20", "jps-40", "jps-60", "optimus", "optimus-lb", "exhaustive")
MODELS = {"A (batch size 8)": {"v100": 900.0, "p100": 600.0, "t4": 300.0},
          "B (batch size 8)": {"v100": 1700.0, "p100": 1000.0, "t4": 850.0},
          "C (batch size 8)": {"v100": 200.0, "p100": 180.0, "t4": 60.0}}
TABLE = ThroughputTable.from_rates(MODELS)


def random_instance(seed: int, gpus_per_node: int = 2) -> PlanningInput:
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i}", {t: gpus_per_node}) for i, t in enumerate(rng.sample(["v100", "p100", "t4"], 3)))
    jobs = []
    for i in range(rng.randint(2, 3)):
        types = tuple(rng.sample(["v100", "p100", "t4"], rng.randint(2, 3)))
        jobs.append(PlanJob(f"j{i}", rng.choice(list(MODELS)), rng.uniform(1e5, 1e6), 32,
                            model_size_mb=rng.choice([0.0, 200.0, 800.0]), samples_per_sync=rng.choice([1e4, 1e5]),
                            min_gpus=1, max_gpus=rng.randint(1, 4), allowed_types=types))
    return PlanningInput(tuple(jobs), Inventory(nodes, 10.0, 1.0), TABLE)


def check_invariants(plan: Plan, inp: PlanningInput) -> None:
    used: dict[tuple[str, str], int] = {}
    jobs = {j.id: j for j in inp.jobs}
    for jp in plan.jobs:
        if jp.allocation is None:
            assert jp.wait_reason
            continue
        job = jobs[jp.job_id]
        assert job.min_gpus <= jp.allocation.gpus <= job.max_gpus
        for node, gpu_type, count in jp.allocation.slots:
            assert not job.allowed_types or gpu_type in job.allowed_types
            used[(node, gpu_type)] = used.get((node, gpu_type), 0) + count
        assert sum(jp.shard_weights) == pytest.approx(1.0)
        if plan.policy != "optimus":
            rates = [inp.throughput.rate(job.workload, t) for _, t in jp.allocation.ranks()]
            assert np.allclose(np.array(jp.shard_weights) / jp.shard_weights[0], np.array(rates) / rates[0])
    for (node, gpu_type), count in used.items():
        assert count <= inp.inventory.node(node).gpus[gpu_type]


@pytest.mark.parametrize("seed", range(6))
def test_every_policy_respects_capacity_limits_and_types(seed: int) -> None:
    inp = random_instance(seed)
    for key in FAST:
        try:
            plan = POLICIES[key](inp)
        except Exception as exc:  # HAS/JPS use every GPU (8c) and may find no category within max_gpus
            assert key in ("has", "jps-20", "jps-40", "jps-60") and "category" in str(exc)
            continue
        check_invariants(plan, inp)


@pytest.mark.parametrize("seed", range(6))
def test_slurmhet_and_exhaustive_are_optimal_on_brute_forceable_instances(seed: int) -> None:
    inp = random_instance(seed, gpus_per_node=2)
    truth = POLICIES["brute-force"](inp).avg_jct
    assert POLICIES["exhaustive"](inp).avg_jct == pytest.approx(truth, rel=1e-9)
    assert POLICIES["slurmhet"](inp).avg_jct == pytest.approx(truth, rel=1e-9)


def seed001_example() -> PlanningInput:
    """Section IV-A: 2 T4 + 2 V100, ResNet-18 and VGG-19 with eq. (9) throughputs, no communication."""
    table = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"t4": 275.0, "v100": 644.0},
                                        "VGG-19 (batch size 64)": {"t4": 884.0, "v100": 1754.0}})
    jobs = (PlanJob("resnet18", "ResNet-18 (batch size 64)", 100_000 * 200, 64, 0.0, 100_000, 100_000),
            PlanJob("vgg19", "VGG-19 (batch size 64)", 50_000 * 200, 64, 0.0, 50_000, 50_000))
    return PlanningInput(jobs, Inventory((Node("t", {"t4": 2}), Node("v", {"v100": 2}))), table)


def test_algorithm1_enumerates_categories_in_the_papers_order() -> None:
    assert list(categories(3, 5)) == [(3, 1, 1), (2, 2, 1), (1, 3, 1), (2, 1, 2), (1, 2, 2), (1, 1, 3)]
    assert [unrank_category(r, 4, 15) for r in range(category_count(4, 15))] == list(categories(4, 15))
    assert category_count(4, 15) == 364 and category_count(4, 30) == 3654


def test_has_reproduces_table2() -> None:
    """Table II: each category's market result and average JCT; HAS picks {3,1} at 11,225.8 s, 6.0% off the optimum."""
    problem = build_problem(seed001_example())  # jobs in admission order: VGG-19 first
    rho = np.array([[884.0, 884.0, 1754.0, 1754.0], [275.0, 275.0, 644.0, 644.0]])  # rows VGG-19, ResNet-18
    expected = {(3, 1): (1194.0, 1754.0, 11225.8), (2, 2): (550.0, 3508.0, 19607.1), (1, 3): (275.0, 4392.0, 37502.1)}
    for (k_resnet, k_vgg), (v_resnet, v_vgg, jct) in expected.items():
        owner = market(rho, (k_vgg, k_resnet))
        got_vgg, got_resnet = rho[0][owner == 0].sum(), rho[1][owner == 1].sum()
        assert (got_resnet, got_vgg) == (v_resnet, v_vgg)
        avg = (2e7 / got_resnet + 1e7 / got_vgg) / 2
        assert avg == pytest.approx(jct, abs=0.1)
    assert problem.jobs[0].id == "vgg19"
    plan = POLICIES["has"](seed001_example())
    assert plan.avg_jct == pytest.approx(11225.8, abs=0.1)
    assert plan.job("resnet18").allocation.by_type() == {"t4": 2, "v100": 1}


def test_slurmhet_finds_the_examples_optimum() -> None:
    plan = POLICIES["slurmhet"](seed001_example())
    assert plan.avg_jct == pytest.approx(10592.0, abs=0.5)
    assert plan.job("resnet18").allocation.by_type() == {"v100": 2}
    assert plan.job("vgg19").allocation.by_type() == {"t4": 2}


def test_jps_is_deterministic_for_a_fixed_seed() -> None:
    inp = random_instance(3)
    inp = PlanningInput(tuple(PlanJob(j.id, j.workload, j.samples_remaining, 32) for j in inp.jobs), inp.inventory,
                        TABLE, seed=11)
    first, second = POLICIES["jps-20"](inp), POLICIES["jps-20"](inp)
    assert first == second


def test_more_jobs_than_gpus_wait_in_wspt_order() -> None:
    inv = Inventory((Node("n", {"v100": 2}),))
    jobs = tuple(PlanJob(f"j{i}", "A (batch size 8)", size, 8, weight=w)
                 for i, (size, w) in enumerate([(9e5, 1.0), (1e5, 1.0), (5e5, 1.0), (4e5, 4.0)]))
    plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, TABLE))
    running = {jp.job_id for jp in plan.jobs if jp.allocation is not None}
    assert running == {"j1", "j3"}  # shortest weighted run time first
    waiting = sorted((jp for jp in plan.jobs if jp.allocation is None), key=lambda jp: jp.order)
    assert [jp.job_id for jp in waiting] == ["j2", "j0"]
    assert all(jp.wait_reason and jp.start_s > 0 for jp in waiting)
    assert waiting[0].start_s <= waiting[1].start_s


def test_a_gang_is_admitted_by_its_gpu_time_not_its_run_time() -> None:
    # 4 v100s; a 4-GPU gang of 100 s (400 GPU-s) and three 1-GPU jobs of 150 s (150 GPU-s each). By run time
    # the gang goes first and the three wait for it: JCTs 100 + 3 x 250 = 850 s. By GPU-time the three start
    # now and the gang waits for them: 3 x 150 + 250 = 700 s. A gang holds every GPU it has for its whole run.
    inv = Inventory((Node("n", {"v100": 4}),))
    gang = PlanJob("gang", "A (batch size 8)", 4 * 900.0 * 100.0, 8, min_gpus=4, max_gpus=4)
    narrow = [PlanJob(f"n{i}", "A (batch size 8)", 900.0 * 150.0, 8, min_gpus=1, max_gpus=1) for i in range(3)]
    inp = PlanningInput((gang, *narrow), inv, TABLE)
    plan = POLICIES["slurmhet"](inp)
    assert [j.id for j in build_problem(inp).jobs] == ["n0", "n1", "n2"]
    assert all(plan.job(j.id).finish_s == pytest.approx(150.0) for j in narrow)
    assert plan.job("gang").allocation is None and plan.job("gang").start_s == pytest.approx(150.0)
    assert plan.avg_jct * 4 == pytest.approx(700.0)


def test_a_gang_reaches_the_fast_gpus_that_only_a_move_of_every_narrow_job_frees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 v100s on one node, 4 k80s on another, a slow link between them. Four 1-GPU jobs (50 s on a v100,
    # 62.5 s on a k80) are admitted before a 4-GPU gang (25 s on the v100s, 250 s on the k80s; 15 s of
    # all-reduce within a node, 1,500 s across), so the greedy start gives them the v100s. Sum of run times:
    # 4 x 50 + 265 = 465 s; the gang on the v100s: 40 + 4 x 62.5 = 290 s. A trade of 1-3 GPUs between the gang
    # and one job spreads the gang over both nodes, so the exchange moves stop at 465 s; only the exact MILP
    # of fixed GPU counts moves all four at once.
    table = ThroughputTable.from_rates({"g": {"v100": 10.0, "k80": 1.0}, "s": {"v100": 2.0, "k80": 1.6}})
    inv = Inventory((Node("a", {"v100": 4}), Node("b", {"k80": 4})), 10.0, 0.1)
    gang = PlanJob("gang", "g", 1000.0, 4, model_size_mb=1000.0, samples_per_sync=10.0, min_gpus=4, max_gpus=4)
    narrow = [PlanJob(f"n{i}", "s", 100.0, 1, min_gpus=1, max_gpus=1) for i in range(4)]
    inp = PlanningInput((gang, *narrow), inv, table)
    assert [j.id for j in build_problem(inp).jobs] == ["n0", "n1", "n2", "n3", "gang"]

    def total_and_gang(plan: Plan) -> tuple[float, dict[str, int]]:
        return round(sum(j.finish_s for j in plan.jobs), 6), plan.job("gang").allocation.by_type()

    assert total_and_gang(POLICIES["slurmhet"](inp)) == (290.0, {"v100": 4})
    assert total_and_gang(POLICIES["exhaustive"](inp)) == (290.0, {"v100": 4})
    exact = hetero._exact
    assert exact(build_problem(inp)) is not None
    monkeypatch.setattr(hetero, "_exact", lambda problem: None)
    assert total_and_gang(POLICIES["slurmhet"](inp)) == (465.0, {"k80": 4})
    # Elastic jobs are left to the search: their counts multiply the MILP's options.
    elastic = replace(inp, jobs=(gang, *(replace(j, max_gpus=2) for j in narrow)))
    assert exact(build_problem(elastic)) is None


def test_comm_heavy_job_is_packed_on_one_node() -> None:
    nodes = (Node("a", {"v100": 2, "t4": 2}), Node("b", {"v100": 2, "t4": 2}))
    heavy = PlanJob("heavy", "B (batch size 8)", 1e6, 64, model_size_mb=1000.0, samples_per_sync=64, max_gpus=4)
    plan = POLICIES["slurmhet"](PlanningInput((heavy,), Inventory(nodes, 50.0, 1.0), TABLE))
    assert plan.job("heavy").allocation.single_node


def test_running_jobs_stay_pinned() -> None:
    from slurmhet.planner import Allocation

    inv = Inventory((Node("n", {"v100": 2}), Node("m", {"t4": 2})))
    running = PlanJob("r", "A (batch size 8)", 1e5, 8, current=Allocation.of({("n", "v100"): 2}), max_gpus=4)
    new = PlanJob("p", "A (batch size 8)", 1e5, 8, max_gpus=4)
    plan = POLICIES["slurmhet"](PlanningInput((running, new), inv, TABLE))
    assert plan.job("r").allocation == running.current
    assert plan.job("p").allocation.by_type() == {"t4": 2}


def test_pinned_jobs_that_overcommit_a_node_leave_it_full_instead_of_failing_the_plan() -> None:
    """A chaos run's submit exited 2 ("running jobs hold more GPUs than the inventory has") while a node came
    back: the store's pinned jobs over-committed it for a moment. Slurm never over-commits, so the node is full."""
    from slurmhet.planner import Allocation

    inv = Inventory((Node("n", {"v100": 2}), Node("m", {"t4": 2})))
    a = PlanJob("a", "A (batch size 8)", 1e5, 8, current=Allocation.of({("n", "v100"): 2}), max_gpus=2)
    b = PlanJob("b", "A (batch size 8)", 1e5, 8, current=Allocation.of({("n", "v100"): 1}), max_gpus=1)
    new = PlanJob("p", "A (batch size 8)", 1e5, 8, max_gpus=4)
    plan = POLICIES["slurmhet"](PlanningInput((a, b, new), inv, TABLE))
    assert plan.job("a").allocation == a.current and plan.job("b").allocation == b.current
    assert plan.job("p").allocation.by_type() == {"t4": 2}


def test_unpinned_job_keeps_its_node_when_its_counts_do_not_change() -> None:
    from slurmhet.planner import Allocation

    # A fresh packing puts a single-GPU job on the first of two equal nodes (a); the job runs on b.
    inv = Inventory((Node("a", {"v100": 1}), Node("b", {"v100": 1})))
    running = PlanJob("r", "A (batch size 8)", 1e5, 8, max_gpus=1, current=Allocation.of({("b", "v100"): 1}))
    plan = POLICIES["slurmhet"](PlanningInput((running,), inv, TABLE, pin_running=False))
    assert plan.job("r").allocation == running.current


def test_kept_jobs_give_way_to_a_job_that_needs_a_whole_node() -> None:
    from slurmhet.planner import Allocation

    # Keeping r0 on a and r1 on b would spread the comm-heavy pair; the fresh packing (pair on a, both
    # single-GPU jobs on b) is strictly cheaper, so the two single-GPU jobs move.
    inv = Inventory((Node("a", {"v100": 2}), Node("b", {"v100": 2})), 50.0, 1.0)
    r0 = PlanJob("r0", "A (batch size 8)", 1e5, 8, max_gpus=1, current=Allocation.of({("a", "v100"): 1}))
    r1 = PlanJob("r1", "A (batch size 8)", 1e5, 8, max_gpus=1, current=Allocation.of({("b", "v100"): 1}))
    pair = PlanJob("pair", "B (batch size 8)", 1e6, 64, model_size_mb=1000.0, samples_per_sync=64,
                   min_gpus=2, max_gpus=2)
    plan = POLICIES["slurmhet"](PlanningInput((r0, r1, pair), inv, TABLE, pin_running=False))
    (node,) = plan.job("pair").allocation.nodes
    assert {plan.job(j).allocation.nodes for j in ("r0", "r1")} == {tuple({"a", "b"} - {node})}


def test_a_revisable_plan_gives_the_fast_gpu_to_the_shortest_job() -> None:
    # One V100 (2/s), one K80 (1/s). Kept to the end, the long job on the V100 minimises
    # w*T: 200 + 100 < 400 + 50. Revised at the next decision (pin_running=False), both gain 2x on the
    # V100, so the short job takes it (SRPT-FM): with indices (1/T*)^0.5 normalised (short 1, long 1/2)
    # 50/50 + 1/2 x 200/400 = 1.25 > 50/100 + 1/2 x 200/200 = 1, and the long job inherits the V100
    # at 50. A priority (critical) job outranks it.
    table = ThroughputTable.from_rates({"x": {"v100": 2.0, "k80": 1.0}})
    inv = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    jobs = (PlanJob("long", "x", 400.0, 1, max_gpus=1), PlanJob("short", "x", 100.0, 1, max_gpus=1))

    def v100_job(jobs: tuple[PlanJob, ...], pin: bool) -> str:
        plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, table, pin_running=pin))
        return next(p.job_id for p in plan.jobs if p.allocation.by_type() == {"v100": 1})

    assert v100_job(jobs, True) == "long"
    assert v100_job(jobs, False) == "short"
    assert v100_job((replace(jobs[0], priority=1), jobs[1]), False) == "long"


def test_a_revisable_plan_gives_the_fast_gpu_to_the_job_it_speeds_up_most(monkeypatch: pytest.MonkeyPatch) -> None:
    # One V100, one K80. The short job (100 samples) runs 2/s on the V100 and 1.6/s on the K80, the long one
    # (400) 2/s and 0.5/s. Index (1/T*)^0.5 normalised: short 1 (T* 50), long 1/2 (T* 200). Short on the
    # V100: 50/50 + 1/2 x 200/800 = 1.125; long on the V100: 50/62.5 + 1/2 x 200/200 = 1.3, so the V100 goes
    # where it gains 4x, not 1.25x. Ranked by remaining time alone (exponent 1: 1 + 1/4 x 1/4 = 1.0625
    # against 0.8 + 1/4 = 1.05), the short job would take it.
    from slurmhet.planner import problem

    table = ThroughputTable.from_rates({"s": {"v100": 2.0, "k80": 1.6}, "l": {"v100": 2.0, "k80": 0.5}})
    inv = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    jobs = (PlanJob("short", "s", 100.0, 1, max_gpus=1), PlanJob("long", "l", 400.0, 1, max_gpus=1))

    def on_v100() -> str:
        plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, table, pin_running=False))
        return next(p.job_id for p in plan.jobs if p.allocation.by_type() == {"v100": 1})

    assert on_v100() == "long"
    monkeypatch.setattr(problem, "SRPT_EXPONENT", 1.0)
    assert on_v100() == "short"


def test_a_revisable_plan_moves_running_jobs_only_when_the_move_pays_its_restart() -> None:
    # One V100 (2/s), one K80 (1/s); the short job (100) runs on the K80, the long one (400) on the V100.
    # Progress terms -index x T*/T, the index (1/T*)^0.5 normalised by the largest (short: T* 50, index 1;
    # long: T* 200, index 1/2): swapped -(50/50 + 1/2 x 200/400) = -1.25, as they are -(50/100 + 1/2 x
    # 200/200) = -1. Both move in a swap, so it pays while (1 - penalty) x 1.25 > 1: at 0.1, not at 0.5.
    from slurmhet.errors import InputError
    from slurmhet.planner import Allocation

    table = ThroughputTable.from_rates({"x": {"v100": 2.0, "k80": 1.0}})
    inv = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    jobs = (PlanJob("short", "x", 100.0, 1, max_gpus=1, current=Allocation.of({("b", "k80"): 1})),
            PlanJob("long", "x", 400.0, 1, max_gpus=1, current=Allocation.of({("a", "v100"): 1})))

    def on_v100(penalty: float) -> str:
        plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, table, pin_running=False, move_penalty=penalty))
        return next(p.job_id for p in plan.jobs if p.allocation.by_type() == {"v100": 1})

    assert on_v100(0.0) == on_v100(0.1) == "short"
    assert on_v100(0.5) == "long"
    with pytest.raises(InputError, match="move_penalty"):
        PlanningInput(jobs, inv, table, move_penalty=1.0)


def crowded_instance(seed: int) -> PlanningInput:
    """8-14 jobs, some identical (tied moves), on 24 GPUs of three types: enough for transfers and trades."""
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i}", {t: 4}) for i, t in enumerate(("v100", "p100", "t4") * 2))
    jobs: list[PlanJob] = []
    for i in range(rng.randint(8, 14)):
        if jobs and rng.random() < 0.3:
            jobs.append(replace(jobs[-1], id=f"j{i}"))
            continue
        lo = rng.randint(1, 2)
        jobs.append(PlanJob(f"j{i}", rng.choice(list(MODELS)), rng.uniform(1e5, 1e6), 32,
                            model_size_mb=rng.choice([0.0, 200.0, 800.0]), samples_per_sync=rng.choice([1e4, 1e5]),
                            min_gpus=lo, max_gpus=rng.randint(lo, 6),
                            allowed_types=tuple(rng.sample(["v100", "p100", "t4"], rng.randint(2, 3)))))
    return PlanningInput(tuple(jobs), Inventory(nodes, 10.0, 1.0), TABLE)


def full_table_pair(give: np.ndarray, take: np.ndarray, below: float) -> tuple[float, int, int, int] | None:
    """The J x J x K table of every pair ``i != j``, and its first minimum."""
    table = give[:, None, :] + take[None, :, :]
    table[np.arange(len(give)), np.arange(len(give))] = np.inf
    i, j, k = np.unravel_index(int(np.argmin(table)), table.shape)
    return (float(table[i, j, k]), int(i), int(j), int(k)) if table[i, j, k] < below else None


def full_table_move(search: hetero._Search) -> tuple[float, tuple]:
    """What ``_Search.best_move`` must return, with every pair move in one J x J table (the former search)."""
    best: tuple[float, tuple] = (0.0, ())
    take = np.where(np.array(hetero.BULK)[None, None, :] <= search.free[None, :, None], search.plus, np.inf)
    for kind, delta in (("take", take), ("release", search.minus)):
        j, t, b = np.unravel_index(int(np.argmin(delta)), delta.shape)
        if delta[j, t, b] < best[0]:
            best = (float(delta[j, t, b]), (kind, int(j), int(t), hetero.BULK[b]))
    pair = search.minus[:, None] + search.plus[None, :]
    pair[np.eye(len(search.x), dtype=bool)] = np.inf
    i, j, t, b = np.unravel_index(int(np.argmin(pair)), pair.shape)
    if pair[i, j, t, b] < best[0]:
        best = (float(pair[i, j, t, b]), ("move", int(i), int(j), int(t), hetero.BULK[b]))
    pair = search.trade[:, None] + np.transpose(search.trade, (0, 3, 4, 1, 2))[None, :]
    pair[np.eye(len(search.x), dtype=bool)] = np.inf
    i, j, t, a, u, b = np.unravel_index(int(np.argmin(pair)), pair.shape)
    if pair[i, j, t, a, u, b] < best[0]:
        best = (float(pair[i, j, t, a, u, b]),
                ("trade", int(i), int(j), int(t), hetero.TRADE[a], int(u), hetero.TRADE[b]))
    return best


@pytest.mark.parametrize("table_cells", [0, hetero._TABLE_CELLS])
@pytest.mark.parametrize("seed", range(5))
def test_fast_move_search_matches_the_full_pair_table(seed: int, table_cells: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Every move of a whole slurmhet run, by the column scans (0 cells) and by small tables, as a J x J search."""
    monkeypatch.setattr(hetero, "_TABLE_CELLS", table_cells)
    fast = hetero._Search.best_move
    moves = []

    def checked(search: hetero._Search) -> tuple[float, tuple]:
        move = fast(search)
        assert move == full_table_move(search)
        moves.append(move[1][0] if move[1] else "none")
        return move

    monkeypatch.setattr(hetero._Search, "best_move", checked)
    hetero.allocate(build_problem(crowded_instance(seed)))
    assert {"move", "trade"} & set(moves)


@pytest.mark.parametrize("seed", range(30))
def test_best_pair_matches_the_full_table_with_ties_and_infeasible_moves(seed: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    jobs, keys = int(rng.integers(2, 30)), int(rng.integers(1, 20))
    # Few distinct values give exact ties; -1e17 absorbs small addends, so sums also tie by rounding.
    values = np.array([-1e17, -3.0, -1.0, -0.1, 0.0, 0.2, 1.0, np.inf])
    give, take = (rng.choice(values, size=(jobs, keys), p=[.1, .1, .1, .1, .1, .1, .1, .3]) for _ in range(2))
    reverse = rng.permutation(keys)
    for table_cells in (0, 1 << 30):
        monkeypatch.setattr(hetero, "_TABLE_CELLS", table_cells)
        for below in (0.0, 2.0):
            assert hetero.best_pair(give, take, below) == full_table_pair(give, take, below)
            assert hetero.best_pair(give, give, below, reverse) == full_table_pair(give, give[:, reverse], below)


def test_a_spread_job_takes_its_last_node_where_fewest_spread_jobs_cross() -> None:
    """Nodes a-d of one type with 2, 2, 4, 2 GPUs free; a kept spread job crosses a and b. A 6-GPU job takes
    c whole, and its last 2 GPUs from d (crossed by no spread job), not from a (first in order)."""
    from slurmhet.planner.problem import mark_crossing, spread_fill

    free = np.array([[2], [2], [4], [2]])
    crossing = np.zeros(4, dtype=int)
    mark_crossing(crossing, {(0, 0): 2, (1, 0): 2})
    mark_crossing(crossing, {(3, 0): 2})  # one node: crosses nothing
    assert crossing.tolist() == [1, 1, 0, 0]
    slots: dict[tuple[int, int], int] = {}
    spread_fill(free.copy(), np.array([6]), slots, crossing)
    assert slots == {(2, 0): 4, (3, 0): 2}
    blind: dict[tuple[int, int], int] = {}
    spread_fill(free.copy(), np.array([6]), blind)
    assert blind == {(2, 0): 4, (0, 0): 2}


@pytest.mark.parametrize("seed", range(20))
def test_column_minima_stay_equal_to_a_fresh_scan_as_rows_change(seed: int) -> None:
    """The incremental per-column minima (exchange moves) answer as a full rescan would, ties and inf included,
    so best_pair on them picks the same move."""
    rng = np.random.default_rng(seed)
    jobs, keys = int(rng.integers(2, 40)), int(rng.integers(1, 30))
    values = np.array([-5.0, -1.0, 0.0, 0.5, 2.0, np.inf])
    give = rng.choice(values, size=(jobs, keys))
    take = rng.choice(values, size=(jobs, keys))
    minima = (hetero.ColumnMinima(give), hetero.ColumnMinima(take))
    for _ in range(60):
        array, tracker = (give, minima[0]) if rng.random() < 0.5 else (take, minima[1])
        row = int(rng.integers(jobs))
        array[row] = rng.choice(values, size=keys)
        tracker.update(row)
        fresh = hetero._two_smallest(array.copy())
        assert all(np.array_equal(a, b) for a, b in zip(tracker.stats(), fresh))
        assert hetero._pair_by_columns(give, take, 1.0, None, minima) == full_table_pair(give, take, 1.0)


def test_the_best_giver_may_come_before_the_first_minimum_of_its_column() -> None:
    # Row 1 holds both columns' minima, so its best partner is row 0 (1 + 0); row 0 gives 5 to row 1's -10.
    give, take = np.array([[5.0], [1.0]]), np.array([[0.0], [-10.0]])
    assert hetero.best_pair(give, take, 0.0) == (-5.0, 0, 1, 0) == full_table_pair(give, take, 0.0)


@pytest.mark.parametrize("seed", range(200))
def test_best_pair_on_few_rows_where_one_row_often_holds_both_minima(seed: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    jobs, keys = int(rng.integers(2, 6)), int(rng.integers(1, 5))
    values = np.array([-1e17, -10.0, -1.0, 0.0, 1.0, 5.0, np.inf])
    give, take = (rng.choice(values, size=(jobs, keys)) for _ in range(2))
    monkeypatch.setattr(hetero, "_TABLE_CELLS", 0)
    expected = full_table_pair(give, take, 1.0)
    assert hetero.best_pair(give, take, 1.0) == expected
    minima = (hetero.ColumnMinima(give), hetero.ColumnMinima(take))
    assert hetero.best_pair(give, take, 1.0, minima=minima) == expected


@pytest.mark.parametrize("seed", range(40))
def test_the_first_minimum_from_column_minima_is_argmins(seed: int) -> None:
    """Take and release moves read the tracked column minima instead of scanning the array: the same cell,
    the first in row-major order among ties, with unusable columns (takes of GPUs not free) left out."""
    rng = np.random.default_rng(seed)
    jobs, keys = int(rng.integers(1, 12)), int(rng.integers(1, 10))
    delta = rng.choice(np.array([-2.0, -1.0, 0.0, np.inf]), size=(jobs, keys))
    tracked = hetero.ColumnMinima(delta)
    for usable in (None, rng.random(keys) < 0.6):
        masked = delta if usable is None else np.where(usable[None, :], delta, np.inf)
        flat = int(np.argmin(masked))
        value = float(masked.flat[flat])
        expected = (value, *divmod(flat, keys)) if np.isfinite(value) else None
        assert hetero._first_minimum(delta, usable, None) == expected
        assert hetero._first_minimum(delta, usable, tracked) == expected
