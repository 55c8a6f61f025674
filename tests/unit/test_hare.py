"""Hare (seed 000): the LP relaxation's H order and Algorithm 1's list scheduling, on hand-sized instances."""

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.policies.hare import Hare, earliest_finish, relaxation_order
from slurmhet.policies.base import ClusterView, JobState
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.engine import capacity_of
from slurmhet.sim.traces import TraceJob
from tests.unit.sim_rates import tiny


def view_of(inventory: Inventory, jobs: list[JobState], table: dict[str, dict[str, float]],
            now: float = 0.0) -> ClusterView:
    return ClusterView(now, capacity_of(inventory), jobs, tiny(table), tuple(n.name for n in inventory.nodes))


def job(job_id: int, steps: float, weight: float = 1.0, job_type: str = "x", gpus: int = 1) -> JobState:
    return JobState(job_id, job_type, gpus, weight, 0.0, steps, steps)


def test_relaxation_orders_by_smith_rule_on_one_gpu() -> None:
    # One GPU at 1 step/s: L = P = 10 and 20. Chains C_0 >= 10, C_1 >= 20; (9) on {0, 1}:
    # 10 C_0 + 20 C_1 >= 30^2 / 2 + (10^2 + 20^2) / 2 = 700, 200 short of the chains.
    inventory = Inventory((Node("a", {"v100": 1}),))
    table = {"x": {"v100": 1.0}}
    # Equal weights: raising C_1 (20 per unit of objective) beats C_0 (10): C_1 = 30.
    # H = C - L + slowest task (1 s) / 2: job 0 starts at 0, job 1 at 10.
    h = relaxation_order(view_of(inventory, [job(0, 10.0), job(1, 20.0)], table), [job(0, 10.0), job(1, 20.0)])
    assert h == pytest.approx({0: 0.5, 1: 10.5})
    # Weight 3 on job 1: raising C_0 costs 1 per 10, C_1 3 per 20: C_0 = 30, job 1 first.
    jobs = [job(0, 10.0), job(1, 20.0, weight=3.0)]
    assert relaxation_order(view_of(inventory, jobs, table), jobs) == pytest.approx({0: 20.5, 1: 0.5})


def test_relaxation_counts_from_now() -> None:
    # The same instance at t = 1000: (9) holds for C - now, so the order does not fade with time.
    inventory = Inventory((Node("a", {"v100": 1}),))
    jobs = [job(0, 10.0), job(1, 20.0)]
    h = relaxation_order(view_of(inventory, jobs, {"x": {"v100": 1.0}}, now=1000.0), jobs)
    assert h == pytest.approx({0: 1000.5, 1: 1010.5})


def test_a_long_chain_is_listed_by_its_next_round_not_its_middle() -> None:
    # Two GPUs at 1 step/s; job 0 has 100 steps (weight 1), jobs 1-3 30 steps (weights 3, 2, 1).
    # (9) on {1, 2, 3}: 30 (C_1 + C_2 + C_3) >= 90^2 / 4 + 3 * 30^2 / 2 = 3375, met by the
    # cheapest raise, C_3 = 52.5; on all four: 100 C_0 >= 190^2 / 4 + (2700 + 10000) / 2 - 3375
    # = 12000, C_0 = 120. Job 0's next round starts at 120 - 100 = 20, before job 3's (22.5);
    # by middles (70 vs 37.5) job 3 would come first.
    inventory = Inventory((Node("a", {"v100": 2}),))
    jobs = [job(0, 100.0), job(1, 30.0, 3.0), job(2, 30.0, 2.0), job(3, 30.0, 1.0)]
    h = relaxation_order(view_of(inventory, jobs, {"x": {"v100": 1.0}}), jobs)
    assert h == pytest.approx({0: 20.5, 1: 0.5, 2: 0.5, 3: 23.0})


def test_a_round_leaves_out_a_slow_gpu_when_two_tasks_on_a_fast_one_finish_first() -> None:
    # A 2-task job, one V100 (1 s per task) and one K80 (4 s): the barrier on both takes 4 s,
    # both tasks on the V100 take 2 s, so the round runs on the V100 alone.
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    table = {"x": {"v100": 1.0, "k80": 0.25}}
    view = view_of(inventory, [job(0, 100.0, gpus=2)], table)
    assert earliest_finish(view, view.jobs[0], view.free()) == ((("a", "v100", 1),),)
    # With the K80 at 0.75 s^-1 (1.33 s per task) the barrier on both is faster than 2 s.
    table = {"x": {"v100": 1.0, "k80": 0.75}}
    view = view_of(inventory, [job(0, 100.0, gpus=2)], table)
    assert earliest_finish(view, view.jobs[0], view.free()) == ((("a", "v100", 1), ("b", "k80", 1)),)


def test_a_job_keeps_its_gpus_when_they_are_as_fast() -> None:
    # Two V100 nodes; the job runs on node b. Listing it again keeps b (no switch), not a.
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"v100": 1})))
    running = job(0, 100.0)
    running.placement = ((("b", "v100", 1),),)
    view = view_of(inventory, [running], {"x": {"v100": 1.0}})
    assert Hare().decide(view) == {0: ((("b", "v100", 1),),)}


def test_a_job_moves_to_a_faster_gpu_when_a_listed_earlier_job_ends() -> None:
    # V100 2 steps/s, K80 1 step/s, restart 10 s. Job 1 (H first) takes the V100, job 0 the K80;
    # at 50 job 1 ends and job 0 (50 steps done) moves to the V100: 50 + 10 + 150 / 2 = 135.
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 200.0), TraceJob(1, "x", 1, 0.0, 100.0)]
    run = run_policies(jobs, inventory, rates, {"hare": Hare()}, SimConfig(restart_s=10.0)).runs["hare"]
    assert {r.job_id: round(r.finish, 6) for r in run.records} == {1: 50.0, 0: 135.0}
    assert [r.restarts for r in sorted(run.records, key=lambda r: r.job_id)] == [1, 0]


def test_a_later_job_with_a_smaller_h_preempts() -> None:
    # One V100 at 1 step/s. Job 0 (100 steps) runs alone; job 1 (10 steps, weight 10) arrives
    # at 20, is listed first and takes the GPU (ends 30); job 0 resumes: 30 + 10 + 80 = 120.
    inventory = Inventory((Node("a", {"v100": 1}),))
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 20.0, 10.0, weight=10.0)]
    run = run_policies(jobs, inventory, rates, {"hare": Hare()}, SimConfig(restart_s=10.0)).runs["hare"]
    assert {r.job_id: round(r.finish, 6) for r in run.records} == {1: 30.0, 0: 120.0}
