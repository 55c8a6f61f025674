"""Gavel's round mechanism and policies, each semantic pinned on a hand-sized case (policies/gavel.py)."""

from __future__ import annotations

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.policies.base import ClusterView, JobState
from slurmhet.policies.gavel import GavelFifo, GavelMaxMinFairness, GavelMinTotalDuration
from slurmhet.policies.registry import TIME_POLICIES
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.engine import capacity_of
from slurmhet.sim.traces import TraceJob
from tests.unit.sim_rates import tiny


def starts(policy: str, jobs: list[TraceJob], inventory: Inventory, rates, round_s: float = 360.0):
    instance = TIME_POLICIES[policy](seed=0, round_s=round_s)
    run = run_policies(jobs, inventory, rates, {policy: instance}, SimConfig(round_s=round_s, restart_s=0.0),
                       with_bound=False).runs[policy]
    return {r.job_id: (round(r.first_start, 6), round(r.finish, 6)) for r in run.records}


def view_of(jobs: list[JobState], inventory: Inventory, rates) -> ClusterView:
    return ClusterView(0.0, capacity_of(inventory), jobs, rates, tuple(n.name for n in inventory.nodes))


@pytest.mark.parametrize("policy", ["gavel-mmf", "gavel-fifo"])
def test_a_new_job_waits_for_the_next_allocation_recompute(policy: str) -> None:
    """Recompute only on a changed job set, and at most every 1,920 s once the last one was after time 0."""
    inventory = Inventory((Node("a", {"v100": 4}),))
    rates = tiny({"x": {"v100": 1.0}})
    jobs = [TraceJob(0, "x", 1, 0.0, 100_000.0), TraceJob(1, "x", 1, 400.0, 1000.0),
            TraceJob(2, "x", 1, 1000.0, 1000.0)]
    out = starts(policy, jobs, inventory, rates)
    # Job 1 arrives at 400: the reset at 0 was "at time 0", so the next round (720) recomputes.
    assert out[1][0] == 720.0
    # Job 2 arrives at 1000 with GPUs idle, but the last recompute was at 720: not before 720 + 1920 = 2640,
    # so at the round boundary 2880.
    assert out[2][0] == 2880.0


def test_fifo_head_of_line_blocks_later_jobs_and_picks_the_fastest_type_with_room() -> None:
    inventory = Inventory((Node("a", {"v100": 2}), Node("b", {"k80": 2})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    jobs = [TraceJob(0, "x", 2, 0.0, 1440.0), TraceJob(1, "x", 4, 0.0, 100.0), TraceJob(2, "x", 1, 0.0, 100.0)]
    state = [JobState(j.job_id, j.job_type, j.gpus, 1.0, 0.0, j.total_steps, j.total_steps) for j in jobs]
    allocation = GavelFifo().allocate(view_of(state, inventory, rates), state)
    # Job 0 takes the V100s (faster); job 1 fits no type and stops the queue: job 2 gets nothing, K80s idle.
    assert allocation == {0: {"k80": 0.0, "v100": 1.0}}


def test_max_min_fairness_weighs_a_job_by_its_scale_factor() -> None:
    """Gavel's objective is k_j * sum_t T x / (w_j P_j): with 2 GPUs, a 1-GPU job and a 2-GPU job of the same
    model reach the max-min at x = 1 and x = 0.5 (without k_j it would be 2/3 each)."""
    inventory = Inventory((Node("a", {"v100": 2}),))
    rates = tiny({"x": {"v100": 1.0}})
    state = [JobState(0, "x", 1, 1.0, 0.0, 10.0, 10.0), JobState(1, "x", 2, 1.0, 0.0, 10.0, 10.0)]
    allocation = GavelMaxMinFairness().allocate(view_of(state, inventory, rates), state)
    assert allocation[0]["v100"] == pytest.approx(1.0, abs=1e-4)
    assert allocation[1]["v100"] == pytest.approx(0.5, abs=1e-4)


def test_max_min_fairness_answer_is_interior_no_exact_zero_for_a_job_left_out() -> None:
    """Like ECOS, the interior-point answer leaves a job the optimum does not need a tiny positive share, so
    it still outranks a job without allocation when GPUs are left over."""
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}, "y": {"v100": 1.0, "k80": 1.0}})
    state = [JobState(0, "x", 1, 1.0, 0.0, 10.0, 10.0), JobState(1, "y", 1, 1.0, 0.0, 10.0, 10.0)]
    allocation = GavelMaxMinFairness().allocate(view_of(state, inventory, rates), state)
    assert all(v > 0 for shares in allocation.values() for v in shares.values())


def test_types_are_visited_fastest_first_and_each_queue_by_priority() -> None:
    """With the V100 visited first, the job with the highest V100 priority gets it even where another job
    has a higher priority on the K80."""
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    policy = GavelMaxMinFairness(round_s=60.0)
    state = [JobState(0, "x", 1, 1.0, 0.0, 1e6, 1e6), JobState(1, "x", 1, 1.0, 0.0, 1e6, 1e6)]
    view = view_of(state, inventory, rates)
    first = policy.decide(view)
    assert first[0][0][0][1] == "v100" and first[1][0][0][1] == "k80"  # equal priorities: id order
    for job in state:
        job.placement = first[job.job_id]
    second = policy.decide(ClusterView(60.0, view.capacity, state, rates, view.node_order))
    assert second[1][0][0][1] == "v100" and second[0][0][0][1] == "k80"  # each had only the other type


def test_a_round_ends_when_every_job_in_it_has_finished() -> None:
    """fifo_perf gives job 1 nothing while job 0 holds the GPU; job 0 ends at 100 s, which ends the round: the
    recompute gives job 1 the GPU at 100 s, not at the 360 s boundary."""
    inventory = Inventory((Node("a", {"v100": 1}),))
    rates = tiny({"x": {"v100": 1.0}})
    out = starts("gavel-fifo", [TraceJob(0, "x", 1, 0.0, 100.0), TraceJob(1, "x", 1, 0.0, 100.0)], inventory, rates)
    assert out == {0: (0.0, 100.0), 1: (100.0, 200.0)}


def test_min_total_duration_finds_the_smallest_horizon_to_five_percent() -> None:
    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    rates = tiny({"x": {"v100": 2.0, "k80": 1.0}})
    state = [JobState(0, "x", 1, 1.0, 0.0, 300.0, 300.0), JobState(1, "x", 1, 1.0, 0.0, 300.0, 300.0)]
    allocation = GavelMinTotalDuration().allocate(view_of(state, inventory, rates), state)
    # 600 steps at 3 steps/s in all: 200 s at best, each job 1.5 steps/s. Bisection stops within 5% above.
    for shares in allocation.values():
        rate = 2.0 * shares["v100"] + 1.0 * shares["k80"]
        assert 300.0 / 210.0 <= rate + 1e-6
