"""Every policy on a hand-computed tiny instance.

Cluster: node a with one V100 (2 steps/s), node b with one K80 (1 step/s).
Jobs at t=0: job 0 needs 200 steps, job 1 needs 100. Restart 10 s, rounds of 60 s.
"""

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.policies.registry import TIME_POLICIES
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.engine import PolicyStarved
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import TraceJob
from tests.unit.sim_rates import PairRates, TinyRates, tiny


def run(policy: str, jobs: list[TraceJob], inventory: Inventory, rates: RateModel, **cfg: float):
    instance = TIME_POLICIES[policy](seed=0, round_s=cfg.pop("round_s", 360.0))
    return run_policies(jobs, inventory, rates, {policy: instance}, SimConfig(**cfg)).runs[policy]


def finishes(run_) -> dict[int, float]:
    return {r.job_id: round(r.finish, 6) for r in run_.records}

EXPECTED = {
    # The shipped planner: bound max((100 + 50) / 2, 100) = 100 s, so job 0 is critical; its arrival is not
    # that bound ago, so it must run but does not outrank job 1 for the V100. Job 1 (less work left) takes the
    # V100 and ends at 50; job 0 runs 50 steps on the K80, then moves to the V100: 50 + 10 + 150 / 2 = 135.
    "slurmhet": {1: 50.0, 0: 135.0},
    # H lists job 1 first (V100), job 0 takes the K80; at 50 job 0 is re-listed onto the V100
    # (50 steps done): 50 + 10 + 150 / 2 = 135.
    "hare": {1: 50.0, 0: 135.0},
    # Hadar's DP gives each job a GPU, the V100 to job 0 (higher utility); both end at 100.
    "hadar": {0: 100.0, 1: 100.0},
    # No idle node to fork onto while both run.
    "hadare": {0: 100.0, 1: 100.0},
    # fifo_perf: job 0 takes the fastest type with room, job 1 the K80; both keep them.
    "gavel-fifo": {0: 100.0, 1: 100.0},
    # The LP gives each job half of each type (each 1.5 steps/s, the max-min). Round 0: equal priorities,
    # id order: job 0 on the V100, job 1 on the K80. At 60 each has had only the other type since the
    # reset (priority 0.5 / (30 / 120) = 2 vs 0.667), so they swap (restart 10): job 1 has 40 steps left,
    # ends 60 + 10 + 20 = 90; job 0 does 50 on the K80 (30 left). At 120 the job set changed and the last
    # reset was at 0, so the LP is re-solved: job 0 alone on the V100, 120 + 10 + 15 = 145.
    "gavel-mmf": {1: 90.0, 0: 145.0},
    # min_total_duration: the smallest horizon is 100 s (job 0 on the V100, job 1 on the K80), as allocated.
    "gavel-mtd": {0: 100.0, 1: 100.0},
    # SRTF: job 1 first on the V100; job 0 keeps the K80 it already runs on.
    "srtf": {1: 50.0, 0: 200.0},
    # Smith's rule (job 1 first), type-blind first fit: node a, then node b.
    "sched-homo": {1: 50.0, 0: 200.0},
    # The matching puts job 0 at the V100's later position... both start at once, one per type.
    "sched-allox": {0: 100.0, 1: 100.0},
    # Type-blind FIFO: job 0 on node a, job 1 on node b.
    "tiresias": {0: 100.0, 1: 100.0},
    "yarn-cs": {0: 100.0, 1: 100.0},
    # Smallest (then shortest) job first on the least-loaded GPU (node a first), job 0 on the other.
    "sjf-bco": {1: 50.0, 0: 200.0},
    "ff": {1: 50.0, 0: 200.0},
    "ls": {1: 50.0, 0: 200.0},
}


def _instance():
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    return [TraceJob(0, "x", 1, 0.0, 200.0), TraceJob(1, "x", 1, 0.0, 100.0)], inventory, rates


def test_every_policy_is_covered() -> None:
    assert set(EXPECTED) | {"rand"} == set(TIME_POLICIES)


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_hand_computed_schedule(policy: str) -> None:
    jobs, inventory, rates = _instance()
    assert finishes(run(policy, jobs, inventory, rates, restart_s=10.0, round_s=60.0)) == EXPECTED[policy]


def test_rand_runs_both_jobs_one_per_gpu_queue() -> None:
    jobs, inventory, rates = _instance()
    done = finishes(run("rand", jobs, inventory, rates, restart_s=10.0))
    assert set(done) == {0, 1} and max(done.values()) in (100.0, 150.0, 200.0, 300.0)


def test_slurmhet_runs_the_critical_job_at_once_and_takes_its_fastest_gpus_once_arrivals_stop() -> None:
    jobs, inventory, rates = _instance()
    jobs = [jobs[0], TraceJob(1, "x", 1, 0.0, 20.0), TraceJob(2, "x", 1, 0.0, 20.0)]
    # Bound max((100 + 10 + 10) / 2, 100) = 100: job 0 is critical. Jobs arrived 0 s ago, less than the bound,
    # so it must run but the V100 goes by progress: job 1 (10 s left) there, ends 10; job 0 on the K80.
    # At 10 job 2 takes the V100 (ends 20). At 20 (180 steps left, 90 s: arrivals 20 s ago) job 0 moves
    # to the V100: 20 + 10 + 90 = 120.
    assert finishes(run("slurmhet", jobs, inventory, rates, restart_s=10.0)) == {1: 10.0, 2: 20.0, 0: 120.0}


def test_slurmhet_a_job_with_slack_waits_until_it_is_critical() -> None:
    jobs, inventory, rates = _instance()
    jobs = [TraceJob(0, "x", 1, 0.0, 120.0), TraceJob(1, "x", 1, 0.0, 100.0), TraceJob(2, "x", 1, 0.0, 100.0)]
    # Bound max((60 + 50 + 50) / 2, 60) = 80; job 0 (60 s on the V100) is below 0.95 * 80 = 76, so it has
    # slack and waits; job 1 takes the V100 (ends 50), job 2 the K80. At 50 the bound is
    # max((60 + 25) / 2, 60) = 60 and job 0 is critical, but the jobs arrived 50 s ago, less than that: it
    # must run, and job 2 (25 s left) takes the V100 (restart 10, ends 85) while job 0 runs on the K80
    # (35 steps). At 85 the arrivals are 85 s ago, more than job 0's 42.5 s: it takes the V100,
    # 85 + 10 + 85 / 2 = 137.5.
    assert finishes(run("slurmhet", jobs, inventory, rates, restart_s=10.0)) == {1: 50.0, 2: 85.0, 0: 137.5}


def test_slurmhet_runs_the_shipped_planner_on_the_engine_rates() -> None:
    from slurmhet.planner.registry import POLICIES
    from slurmhet.policies.base import ClusterView, JobState
    from slurmhet.sim.engine import capacity_of

    inventory = Inventory((Node("a", {"v100": 2, "k80": 2}), Node("b", {"k80": 2})))
    rates = RateModel(TinyRates({"x": {"v100": 2.0, "k80": 1.0}}), ContentionModel(1.0, xi2=0.0), {"x": 0.2})
    jobs = [JobState(0, "x", 2, 1.0, 0.0, 400.0, 400.0), JobState(1, "x", 1, 2.0, 0.0, 100.0, 100.0),
            JobState(2, "x", 4, 1.0, 0.0, 900.0, 900.0)]
    view = ClusterView(0.0, capacity_of(inventory), jobs, rates, ("a", "b"), 1.0)
    policy = TIME_POLICIES["slurmhet"]()
    inp = policy.planning_input(view)
    # Per-GPU samples/s = the engine's rate / scale, per (job type, scale); work in worker-steps.
    assert inp.throughput.rate("x @2", "v100") == pytest.approx(rates.type_rate("x", 2, "v100") / 2)
    assert [j.min_gpus for j in inp.jobs] == [j.max_gpus for j in inp.jobs] == [2, 1, 4]
    assert inp.jobs[0].model_size_mb == pytest.approx(200.0) and not inp.pin_running
    plan = POLICIES["slurmhet"](inp)
    decision = policy.decide(view)
    assert {int(p.job_id): ((tuple(p.allocation.slots),)) for p in plan.jobs if p.allocation} == dict(decision)


def test_slurmhet_colocates_a_waiting_job_on_a_measured_pair() -> None:
    inventory = Inventory((Node("a", {"v100": 1}),))
    rates = RateModel(PairRates({"x": {"v100": 1.0}, "y": {"v100": 1.0}}), ContentionModel(1.0, xi2=0.0),
                      {"x": 0.0, "y": 0.0})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "y", 1, 0.0, 50.0)]
    # Job 1 is shorter (Smith order; the bound (100 + 50) / 1 = 150 makes neither critical) and takes the
    # GPU; job 0 joins it (delta 1.6): both at 0.8/s,
    # job 1 ends at 62.5, job 0 (50 steps left) then alone at 1/s: 112.5 instead of 150 in sequence.
    assert finishes(run("slurmhet", jobs, inventory, rates, restart_s=10.0)) == {1: 62.5, 0: 112.5}


def test_hadare_forks_onto_idle_nodes() -> None:
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    # One job alone: a copy on each node, 3 steps/s aggregated, 10 s consolidation each 60 s round.
    run_ = run("hadare", [TraceJob(0, "x", 1, 0.0, 300.0)], inventory, rates, round_s=60.0, consolidate_s=10.0)
    # Round 1: 50 s x 3 = 150; round 2 (60 s): 10 s pause then 150 / 3 = 50 s -> 120.
    assert finishes(run_) == {0: 120.0}


def test_slurmhet_forking_copies_a_lone_job_onto_the_idle_node_each_round() -> None:
    from slurmhet.policies.default import SlurmhetForking

    _, inventory, rates = _instance()
    jobs = [TraceJob(0, "x", 1, 0.0, 300.0)]
    config = SimConfig(round_s=60.0, restart_s=10.0, consolidate_s=5.0)
    out = run_policies(jobs, inventory, rates, {"s": SlurmhetForking(round_s=60.0)}, config).runs["s"]
    # Copies on the V100 and the K80: 3 steps/s, 5 s of consolidation per 60 s round (55 s of work):
    # 165 steps a round, 135 left after round 1 take 5 + 45 s: 60 + 50 = 110 (alone on the V100: 150).
    assert finishes(out) == {0: 110.0}


def test_slurmhet_forking_leaves_a_full_cluster_alone() -> None:
    from slurmhet.policies.default import SlurmhetForking

    jobs, inventory, rates = _instance()
    config = SimConfig(round_s=1000.0, restart_s=10.0, consolidate_s=5.0)
    out = run_policies(jobs, inventory, rates, {"s": SlurmhetForking(round_s=1000.0)}, config).runs["s"]
    # Both GPUs are planned: no copy. The revisable plan gives the V100 to the shorter job 1 (ends 50)
    # and the K80 to job 0 (forking has no critical jobs); the next decision is the 1,000 s round, so
    # job 0 stays on the K80 (200 steps at 1/s: ends 200) and nothing restarts.
    assert finishes(out) == {1: 50.0, 0: 200.0} and all(r.restarts == 0 for r in out.records)


def test_sched_allox_matches_the_jobs_that_fit_beside_one_no_type_holds() -> None:
    """A 2-GPU job on one V100 + one K80 fits no single type: it must not make the matching LP infeasible
    and stall the 1-GPU jobs (they run as in the two-job schedule); the engine then reports it starved."""
    jobs, inventory, rates = _instance()
    policy = TIME_POLICIES["sched-allox"](seed=0, round_s=60.0)
    with pytest.raises(PolicyStarved) as starved:
        run_policies(jobs + [TraceJob(2, "x", 2, 0.0, 100.0)], inventory, rates, {"sched-allox": policy},
                     SimConfig(restart_s=10.0))
    assert [j.job_id for j in starved.value.waiting] == [2] and starved.value.now == pytest.approx(100.0)


def test_slurmhet_relaxed_starts_a_gang_on_the_gpus_that_are_free() -> None:
    """Node a has two V100s (2 steps/s per GPU). Job 1 (scale 2, 400 worker-steps, 100 s on both GPUs) is
    critical (bound max((10 + 2 x 100) / 2, 100) = 105 s, 100 >= 0.9 x 105), so the rigid planner runs it
    first and job 0 (20 steps) waits for it. Relaxed, job 1 starts on one GPU beside job 0: at 10 job 0 ends
    and job 1 (20 steps done) takes both GPUs after a 10 s restart: 20 + 380 / 4 = 115."""
    from slurmhet.policies.default import SlurmhetRelaxed

    inventory = Inventory((Node("a", {"v100": 2}),))
    rates = tiny({"x": {"v100": 2.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 20.0), TraceJob(1, "x", 2, 0.0, 400.0)]
    config = SimConfig(restart_s=10.0)
    assert finishes(run("slurmhet", jobs, inventory, rates, restart_s=10.0)) == {1: 100.0, 0: 110.0}
    relaxed = run_policies(jobs, inventory, rates, {"s": SlurmhetRelaxed(round_s=360.0)}, config).runs["s"]
    assert finishes(relaxed) == {0: 10.0, 1: 115.0}


def test_a_ratio_over_a_zero_metric_is_none_not_nan() -> None:
    """slurmhet starts both jobs at once (no queueing), so every avg_queue ratio has nothing to divide by."""
    jobs, inventory, rates = _instance()
    policies = {p: TIME_POLICIES[p](seed=0, round_s=60.0) for p in ("slurmhet", "srtf")}
    ratios = run_policies(jobs, inventory, rates, policies, SimConfig(restart_s=10.0)).ratios("slurmhet")
    assert ratios["srtf"]["avg_queue"] is None and ratios["srtf"]["makespan"] == round(200.0 / 135.0, 4)
