"""The engine against hand-computed schedules, plus invariants, work conservation and determinism."""

from dataclasses import replace

import pytest

from slurmhet.cluster import Inventory, Node, parse_cluster_spec
from slurmhet.policies.registry import TIME_POLICIES
from slurmhet.sim import SimConfig, default_throughputs, generate_trace, run_policies, simulate
from slurmhet.sim.contention import ContentionModel, contenders
from slurmhet.policies.base import Decision, TimePolicy
from slurmhet.sim.engine import SimulationError, check_capacity
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import TraceJob, resolve_steps
from tests.unit.sim_rates import PairRates, tiny


def one_gpu() -> Inventory:
    return Inventory((Node("a", {"v100": 1}),))


def run(policy: str, jobs: list[TraceJob], inventory: Inventory, rates: RateModel, **cfg: float):
    instance = TIME_POLICIES[policy](seed=0, round_s=cfg.pop("round_s", 360.0))
    return run_policies(jobs, inventory, rates, {policy: instance}, SimConfig(**cfg)).runs[policy]


def finishes(run) -> dict[int, float]:
    return {r.job_id: round(r.finish, 6) for r in run.records}


def test_fifo_queues_the_second_job() -> None:
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 10.0, 50.0)]
    report = run_policies(jobs, one_gpu(), rates, {"f": TIME_POLICIES["gavel-fifo"]()}, SimConfig())
    m = report.metrics["f"]
    assert finishes(report.runs["f"]) == {0: 100.0, 1: 150.0}
    assert (m.avg_jct, m.makespan, m.avg_queue, m.utilization) == (120.0, 150.0, 45.0, 1.0)


def test_srtf_preempts_and_pays_the_restart() -> None:
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 10.0, 20.0)]
    # B preempts A at 10 and ends at 30; A resumes with a 5 s restart: 30 + 5 + 90.
    assert finishes(run("srtf", jobs, one_gpu(), rates, restart_s=5.0)) == {0: 125.0, 1: 30.0}


def test_first_start_pays_start_s_and_a_resume_pays_restart_s() -> None:
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 10.0, 50.0)]
    # FIFO: A starts up for 4 s and ends at 104; B waits, starts up for 4 s: 104 + 4 + 50.
    assert finishes(run("gavel-fifo", jobs, one_gpu(), rates, start_s=4.0)) == {0: 104.0, 1: 158.0}
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 10.0, 20.0)]
    # SRTF: A made 6 steps by 10; B starts up (4 s) and ends at 34; A resumes (restart 5 s): 34 + 5 + 94.
    assert finishes(run("srtf", jobs, one_gpu(), rates, start_s=4.0, restart_s=5.0)) == {0: 133.0, 1: 34.0}


class MoveAtFive(TimePolicy):
    """Round-based: every job on node a until t = 5, on node b after."""

    key = "move"
    round_based = True

    def decide(self, view):
        gang = (("a" if view.now < 5.0 else "b", "v100", 1),)
        return {j.job_id: (gang,) for j in view.jobs}


def test_a_move_during_start_up_does_not_skip_the_rest_of_it() -> None:
    """A job moved at 5 s into its 12 s start-up has no checkpoint to restart from: it spends the 7 s left of
    its start-up on b (to 12 s) and works 20 s, ending at 32. Paying the 2 s restart there instead skipped
    the rest (27)."""
    rates = tiny({"x": {"v100": 1.0}})
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"v100": 1})))
    run = run_policies([TraceJob(0, "x", 1, 0.0, 20.0)], inventory, rates, {"move": MoveAtFive(round_s=5.0)},
                       SimConfig(round_s=5.0, start_s=12.0, restart_s=2.0)).runs["move"]
    assert finishes(run) == {0: 32.0}
    assert run.records[0].restarts == 1


@pytest.mark.parametrize("flag,value", [("restart_s", -1.0), ("start_s", float("nan")), ("start_s", float("inf"))])
def test_simulate_refuses_bad_overheads(flag: str, value: float) -> None:
    from slurmhet.errors import InputError

    with pytest.raises(InputError, match=flag.replace("_", "-")):
        simulate([TraceJob(0, "x", 1, 0.0, 10.0)], one_gpu(), tiny({"x": {"v100": 1.0}}).source, ["srtf"],
                 **{flag: value})


def test_round_policy_waits_for_the_round_boundary() -> None:
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 10.0, 50.0)]
    # Tiresias (type-blind LAS, 60 s rounds): A runs to 100 mid-round, B starts at the 120 s boundary.
    assert finishes(run("tiresias", jobs, one_gpu(), rates, round_s=60.0)) == {0: 100.0, 1: 170.0}


def test_barrier_and_proportional_sharding() -> None:
    rates = tiny({"x": {"v100": 3.0, "k80": 1.0}})
    gang = (("a", "k80", 1), ("a", "v100", 1))
    # tau_v100 = 1/3 s, tau_k80 = 1 s for a 2-task iteration.
    assert rates.iteration_seconds("x", 2, gang, "barrier") == pytest.approx(1.0)
    assert rates.iteration_seconds("x", 2, gang, "proportional") == pytest.approx(2 / 4)
    # Relaxed scale-fixed sync: 2 tasks on one V100 run back to back.
    assert rates.iteration_seconds("x", 2, (("a", "v100", 1),), "barrier") == pytest.approx(2 / 3)


def test_ring_allreduce_under_contention() -> None:
    model = ContentionModel(inter_gbps=1.0, xi1=1.0, xi2=0.0, alpha=0.5)
    placements = {1: ((("a", "v", 1), ("b", "v", 1)),), 2: ((("b", "v", 1), ("c", "v", 1)),), 3: ((("c", "v", 2),),)}
    p = contenders(placements)
    assert p == {(1, 0): 2, (2, 0): 2}
    # 2 (w-1)/w m / (b / f(2)), f(2) = 2 + 0.5 = 2.5
    assert model.comm_seconds(2, 2, 0.4, p[(1, 0)]) == pytest.approx(2 * 0.5 * 0.4 * 2.5)
    assert model.comm_seconds(2, 1, 0.4, 5) == 0.0


def test_capacity_check_rejects_overcommit() -> None:
    with pytest.raises(RuntimeError):
        check_capacity({1: ((("a", "v100", 1),),), 2: ((("a", "v100", 1),),)}, {("a", "v100"): 1})
    # A co-located group's GPU counts once.
    check_capacity({1: ((("a", "v100", 1),),), 2: ((("a", "v100", 1),),)}, {("a", "v100"): 1}, ((1, 2),))


class ShareOne(TimePolicy):
    """Puts every active job on node a's V100 as one co-located group."""

    key = "share"
    colocates = True

    def decide(self, view):
        gang = (("a", "v100", 1),)
        group = tuple(j.job_id for j in view.jobs)
        return Decision({j: (gang,) for j in group}, [group] if len(group) > 1 else [])


def test_colocated_jobs_share_a_gpu_at_the_measured_pair_rates() -> None:
    rates = RateModel(PairRates({"x": {"v100": 1.0}, "y": {"v100": 1.0}, "z": {"v100": 1.0}}),
                      ContentionModel(1.0, xi2=0.0), {"x": 0.0, "y": 0.0, "z": 0.0})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "y", 1, 0.0, 40.0)]
    report = run_policies(jobs, one_gpu(), rates, {"share": ShareOne()}, SimConfig())
    # Both at 0.8/s: job 1 ends at 50 with job 0 at 40 steps; job 0 then runs alone at 1/s (no restart): 110.
    assert finishes(report.runs["share"]) == {1: 50.0, 0: 110.0}
    assert report.metrics["share"].utilization == pytest.approx(1.0)  # the shared GPU counts once
    unmeasured = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "z", 1, 0.0, 40.0)]
    with pytest.raises(SimulationError, match="cannot co-locate"):
        run_policies(unmeasured, one_gpu(), rates, {"share": ShareOne()}, SimConfig())


@pytest.mark.parametrize("policy", sorted(TIME_POLICIES))
def test_invariants_and_work_conservation(policy: str) -> None:
    inventory = parse_cluster_spec("v100:8,k80:8", 4)
    rates = RateModel(default_throughputs(), ContentionModel(inventory.inter_node_gbps))
    jobs = [replace(j, duration_s=j.duration_s / 20) for j in generate_trace(12, 3, "poisson", mean_interarrival_s=200.0)]
    jobs = resolve_steps(jobs, lambda t, k: rates.type_rate(t, k, "v100"))
    seen = []

    def observer(now, placements, capacity):
        check_capacity(placements, capacity, placements.shared)
        seen.append(now)

    report = run_policies(jobs, inventory, rates, {policy: TIME_POLICIES[policy](seed=1, round_s=120.0)},
                          SimConfig(round_s=120.0, observer=observer))
    records = report.runs[policy].records
    assert seen == sorted(seen) and len(seen) == report.metrics[policy].decisions
    assert sorted(r.job_id for r in records) == list(range(12))  # every job finishes exactly once
    for rec in records:
        assert rec.done_steps == pytest.approx(rec.total_steps, rel=1e-9)
    assert report.metrics[policy].utilization <= 1.0 + 1e-9


def test_simulate_is_deterministic_under_a_seed() -> None:
    inventory = parse_cluster_spec("v100:4,p100:4,k80:4", 4)
    jobs = generate_trace(15, 9, "poisson", mean_interarrival_s=300.0)

    def strip(report):
        out = report.to_json()["policies"]
        return {p: {k: v for k, v in m.items() if not k.startswith("plan_seconds")} for p, m in out.items()}

    policies = ["slurmhet", "rand", "hadar"]
    assert strip(simulate(jobs, inventory, None, policies, seed=4)) == strip(simulate(jobs, inventory, None, policies, seed=4))


def test_report_json_and_plots(tmp_path) -> None:
    from slurmhet.sim import write_plots

    inventory = parse_cluster_spec("v100:4,k80:4", 4)
    report = simulate(generate_trace(6, 2, "zero"), inventory, None, ["slurmhet", "gavel-fifo"])
    out = report.to_json()
    assert set(out["policies"]["slurmhet"]) >= {"avg_jct", "weighted_jct", "makespan", "utilization", "avg_queue",
                                                "jain", "plan_seconds"}
    paths = write_plots(report, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)



def test_a_wait_limit_stops_a_stream_of_narrow_jobs_from_starving_a_wide_one() -> None:
    # Two v100s; a 2-GPU job of 100 s and, from 0, a 1-GPU job of 100 s every 50 s (two at 0), each with less
    # GPU-time than the wide one: they keep both GPUs busy until the stream ends, so the wide job starts at
    # 1,000 s. With a 300 s limit it is overdue at 300 s, goes first, and once started keeps its GPUs.
    inventory = Inventory((Node("a", {"v100": 2}),))
    jobs = [TraceJob(0, "x", 2, 0.0, 200.0)] + [TraceJob(i, "x", 1, 50.0 * max(i - 2, 0), 100.0) for i in range(1, 22)]
    source = tiny({"x": {"v100": 1.0}}).source

    def wide(max_wait_s: float | None) -> tuple[float, float]:
        report = simulate(jobs, inventory, source, ["slurmhet"], restart_s=0.0, max_wait_s=max_wait_s)
        (record,) = [r for r in report.runs["slurmhet"].records if r.job_id == 0]
        return record.first_start, record.finish

    assert wide(None) == (1000.0, 1100.0)
    assert wide(300.0) == (300.0, 400.0)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan")])
def test_simulate_refuses_a_wait_limit_that_is_not_positive(value: float) -> None:
    from slurmhet.errors import InputError

    with pytest.raises(InputError, match="--max-wait-h"):
        simulate([TraceJob(0, "x", 1, 0.0, 10.0)], one_gpu(), tiny({"x": {"v100": 1.0}}).source, ["slurmhet"],
                 max_wait_s=value)
