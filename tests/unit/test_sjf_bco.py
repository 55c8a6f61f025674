"""SJF-BCO's pieces (seed 004, Algorithms 1-3) and FF/LS on hand-sized instances.

Rates from ``tiny``: one step per GPU per second, so a job of G GPUs and G * D steps runs D
seconds on any G GPUs, without contention unless a test sets a gradient size.
"""

from __future__ import annotations

import math

from slurmhet.cluster import Inventory, Node
from slurmhet.policies.baselines import _first_fit, _least_loaded
from slurmhet.policies.sjf_bco import (
    Gpu, GpuPlanPolicy, PlanState, SjfBco, bisect_theta, build_plan, fa_ffp, lbsgf,
)
from slurmhet.policies.base import ClusterView, JobState
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.engine import capacity_of
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import TraceJob
from tests.unit.sim_rates import TinyRates, tiny


def job(job_id: int, gpus: int, seconds: float) -> JobState:
    return JobState(job_id, "x", gpus, 1.0, 0.0, gpus * seconds, gpus * seconds)


def setup(nodes: dict[str, int], rates: RateModel | None = None) -> tuple[ClusterView, PlanState]:
    inventory = Inventory(tuple(Node(n, {"g": c}) for n, c in nodes.items()))
    view = ClusterView(0.0, capacity_of(inventory), [], rates or tiny({"x": {"g": 1.0}}), tuple(nodes))
    return view, SjfBco().initial_state(view, {})


def g(node: str, index: int) -> Gpu:
    return (node, "g", index)


def test_fa_ffp_takes_least_loaded_idle_gpus_and_packs_ties_onto_occupied_servers() -> None:
    _, state = setup({"a": 2, "b": 2})
    state.start([g("a", 0)], 5.0, 10.0)  # a0 busy until 10, U = 5
    state.start([g("b", 0)], 3.0, 0.0)  # b0 idle again, U = 3
    # Idle: a1, b1 (U 0) and b0 (U 3); the tie a1/b1 goes to a, already occupied.
    assert fa_ffp(state, job(1, 1, 1.0), 100.0, 1.0) == [g("a", 1)]
    assert fa_ffp(state, job(1, 3, 1.0), 100.0, 1.0) == [g("a", 1), g("b", 1), g("b", 0)]
    # Within theta = 3.5 only the two U = 0 GPUs qualify (3 + 1 > 3.5).
    assert fa_ffp(state, job(1, 3, 1.0), 3.5, 1.0) is None


def test_lbsgf_uses_only_the_least_busy_servers_holding_lambda_times_the_job() -> None:
    _, state = setup({"a": 2, "b": 2, "c": 4})
    state.start([g("a", 0)], 4.0, 0.0)  # a's mean U = 2: a ranks last
    state.start([g("b", 0)], 0.0, 10.0)  # b0 busy, b's mean U still 0
    # lambda = 1: server b alone holds 2 GPUs but only b1 is idle, so the job waits.
    assert lbsgf(state, job(1, 2, 1.0), 100.0, 1.0) is None
    # lambda = 2: b and c (6 >= 4), least-U idle GPUs in server order.
    assert lbsgf(state, job(1, 2, 1.0), 100.0, 1.0, lam=2.0) == [g("b", 1), g("c", 0)]


def test_first_fit_goes_server_by_server_and_list_scheduling_by_least_load() -> None:
    _, state = setup({"a": 2, "b": 2})
    state.start([g("a", 0)], 3.0, 0.0)
    assert _first_fit(state, job(1, 2, 1.0), 100.0, 1.0) == [g("a", 0), g("a", 1)]
    assert _least_loaded(state, job(1, 2, 1.0), 100.0, 1.0) == [g("a", 1), g("b", 0)]
    assert _first_fit(state, job(1, 2, 1.0), 3.5, 1.0) == [g("a", 1), g("b", 0)]


def test_build_plan_waits_for_job_exits_and_respects_theta() -> None:
    view, state = setup({"a": 2})
    jobs = [job(0, 1, 10.0), job(1, 1, 20.0), job(2, 2, 5.0)]
    # Jobs 0 and 1 start at 0; job 2 waits for both exits (t = 20) and ends at 25.
    makespan, plan = build_plan(view, jobs, state, math.inf, fa_ffp) or (0.0, {})
    assert makespan == 25.0
    assert plan == {0: [g("a", 0)], 1: [g("a", 1)], 2: [g("a", 0), g("a", 1)]}
    # U of a1 ends at 20 + 5 = 25: a limit of 24 cannot place job 2, 25 can.
    assert build_plan(view, jobs, state, 24.0, fa_ffp) is None
    assert build_plan(view, jobs, state, 25.0, fa_ffp) is not None


def test_build_plan_prices_contention_of_spread_jobs_running_at_the_start() -> None:
    # 1 s of compute per iteration; a 2-worker ring over 2 servers moves 2 * 1/2 * 0.5 GB at
    # 1 GB/s shared by k jobs: 0.5 s alone, 1.0 s with k = 2 (alpha = 0, xi2 = 0).
    rates = RateModel(TinyRates({"x": {"g": 1.0}}), ContentionModel(1.0, xi1=1.0, xi2=0.0, alpha=0.0), {"x": 0.5})
    view, state = setup({"a": 2, "b": 1, "c": 1}, rates)
    fixed = {0: [g("a", 0), g("b", 0)], 1: [g("a", 1), g("c", 0)]}
    jobs = [job(0, 2, 10.0), job(1, 2, 10.0)]  # 10 iterations each
    # Job 0 starts alone: 10 x 1.5 s = 15 s; job 1 shares server a with it: 10 x 2 s = 20 s.
    found = build_plan(view, jobs, state, math.inf, lambda s, j, th, rho: fixed[j.job_id])
    assert found == (20.0, fixed)


def test_bisection_moves_to_the_tightest_feasible_theta_and_keeps_the_best_plan() -> None:
    visited: list[float] = []

    def attempts(theta: float) -> list[tuple[float, dict[int, list[Gpu]]] | None]:
        visited.append(theta)
        if theta == math.inf:
            return [(50.0, {0: []})]
        if theta < 7:
            return [None]
        makespan = 60.0 if theta < 10 else 40.0 + theta / 10
        return [None, (makespan, {0: [g("a", int(theta))]})]

    # T = 50: theta 25 (42.5), 12 (41.2), 6 (infeasible), 9 (60), 7 (60); the best is theta 12.
    assert bisect_theta(attempts) == {0: [g("a", 12)]}
    assert visited == [math.inf, 25, 12, 6, 9, 7]


class FixedPlan(GpuPlanPolicy):
    """A hand-written plan, to test the executor alone."""

    key = "fixed"

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        return {0: [g("a", 0)], 1: [g("a", 0), g("a", 1)], 2: [g("a", 1), g("b", 0)]}


def test_executor_starts_jobs_in_plan_order_per_gpu() -> None:
    inventory = Inventory((Node("a", {"g": 2}), Node("b", {"g": 1})))
    jobs = [TraceJob(0, "x", 1, 0.0, 10.0), TraceJob(1, "x", 2, 0.0, 10.0), TraceJob(2, "x", 2, 0.0, 12.0)]
    run = run_policies(jobs, inventory, tiny({"x": {"g": 1.0}}), {"fixed": FixedPlan()}, SimConfig(restart_s=0.0))
    # Job 1 waits for a0 (job 0 ends at 10) and runs 10-15; job 2's GPUs are idle from 0, but
    # job 1 is queued before it on a1, so it runs 15-21.
    assert {r.job_id: r.finish for r in run.runs["fixed"].records} == {0: 10.0, 1: 15.0, 2: 21.0}


def test_sjf_bco_keeps_the_best_kappa_plan() -> None:
    # a: 2 GPUs, b: 2 GPUs; jobs of 1 GPU (10 s) and 2 GPUs (10 s). kappa = 1 sends the 2-GPU
    # job to the least busy server b (LBSGF); kappa = 2 packs it by least U onto a1 + b0.
    # Both end at 10 without contention; with a gradient, the spread ring is slower, so kappa = 1.
    rates = RateModel(TinyRates({"x": {"g": 1.0}}), ContentionModel(1.0, xi1=1.0, xi2=0.0, alpha=0.0), {"x": 0.5})
    view, state = setup({"a": 2, "b": 2}, rates)
    jobs = [job(0, 1, 10.0), job(1, 2, 10.0)]
    assert SjfBco().plan_jobs(view, jobs, state) == {0: [g("a", 0)], 1: [g("b", 0), g("b", 1)]}
    policy = SjfBco()
    policy.kappa = 2
    assert policy.plan_jobs(view, jobs, state) == {0: [g("a", 0)], 1: [g("a", 1), g("b", 0)]}
