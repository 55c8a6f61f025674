"""The planner on a shared cluster: other users' holds, Slurm's queue ahead of ours, per-user GPU caps.

Hand-sized cases whose answers follow from the numbers: rates v100 = 100, t4 = 50
samples/s, single-GPU jobs of 10,000 samples (100 s on a v100, 200 s on a t4).
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from slurmhet.cluster import Hold, Inventory, Node, OpenWorld, QueuedAhead
from slurmhet.errors import InputError
from slurmhet.planner import POLICIES, Allocation, PlanJob, PlanningInput
from slurmhet.throughput import ThroughputTable

W = "ResNet-18 (batch size 64)"
TABLE = ThroughputTable.from_rates({W: {"v100": 100.0, "t4": 50.0}})
NODES = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4})))
PLAN = POLICIES["slurmhet"]


def job(name: str, *, lo: int = 1, hi: int = 1, types: tuple[str, ...] = ("v100", "t4"), user: str = "u",
        samples: float = 10_000.0) -> PlanJob:
    return PlanJob(name, W, samples, 64, min_gpus=lo, max_gpus=hi, allowed_types=types, user=user)


def all_v100_held_until(end: float) -> OpenWorld:
    return OpenWorld(holds=(Hold("nodea", "v100", 4, 0.0, end, "job", "job 244 (alice)"),))


def test_a_job_goes_to_idle_t4s_when_the_v100s_are_held_for_longer_than_the_t4_run() -> None:
    plan = PLAN(PlanningInput((job("a"),), NODES, TABLE, world=all_v100_held_until(10_000.0)))
    jp = plan.job("a")
    assert jp.allocation is not None and jp.allocation.by_type() == {"t4": 1}
    assert jp.finish_s == pytest.approx(200.0)


def test_a_job_waits_for_a_v100_when_its_release_plus_the_v100_run_beats_the_t4_run() -> None:
    # v100 free at 50 s: 50 + 100 = 150 s < 200 s on a t4 now.
    plan = PLAN(PlanningInput((job("a"),), NODES, TABLE, world=all_v100_held_until(50.0)))
    jp = plan.job("a")
    assert jp.allocation is None
    assert jp.start_s == pytest.approx(50.0) and jp.finish_s == pytest.approx(150.0)
    assert "v100" in (jp.wait_reason or "") and "held by other users" in (jp.wait_reason or "")


def test_held_gpus_are_not_planned_and_waiting_jobs_start_when_the_hold_ends() -> None:
    plan = PLAN(PlanningInput((job("a", types=("v100",)),), NODES, TABLE, world=all_v100_held_until(300.0)))
    jp = plan.job("a")
    assert jp.allocation is None and jp.start_s == pytest.approx(300.0) and jp.finish_s == pytest.approx(400.0)


def test_a_narrow_job_is_predicted_to_start_in_a_gap_a_wide_job_ahead_of_it_cannot_use() -> None:
    # Admission skips a job that does not fit and admits the next, so the forecast does too: 2 v100s free at
    # 100 s hold the narrow job (100-200 s), and the wide one (first in order: 20 s on 4 v100s, 80 GPU-s) still
    # starts at 300 s, when all 4 are free. In strict order the narrow job would wait until 320 s.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 100.0, "job", "job 1 (alice)"),
                             Hold("nodea", "v100", 2, 0.0, 300.0, "job", "job 2 (alice)")))
    jobs = (job("wide", lo=4, hi=4, types=("v100",), samples=8_000.0), job("narrow", types=("v100",)))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, world=world))
    wide, narrow = plan.job("wide"), plan.job("narrow")
    assert wide.allocation is None and narrow.allocation is None
    assert wide.order < narrow.order
    assert narrow.start_s == pytest.approx(100.0) and narrow.finish_s == pytest.approx(200.0)
    assert wide.start_s == pytest.approx(300.0) and wide.finish_s == pytest.approx(320.0)


def test_a_hold_with_no_known_end_gives_no_predicted_start_instead_of_failing_the_plan() -> None:
    plan = PLAN(PlanningInput((job("a", types=("v100",)), job("b", types=("t4",))), NODES, TABLE,
                              world=all_v100_held_until(math.inf)))
    assert "no predicted start" in (plan.job("a").wait_reason or "")
    assert plan.job("b").allocation is not None


def test_a_reservation_starting_within_the_lookahead_takes_its_node_now() -> None:
    world = OpenWorld(holds=(Hold("nodeb", "t4", 4, 100.0, 3_700.0, "reservation", "reservation maint"),),
                      lookahead_s=3_600.0)
    jobs = tuple(job(f"j{i}") for i in range(6))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, world=world))
    placed = [jp.allocation for jp in plan.jobs if jp.allocation]
    assert placed and all(a.by_type() == {"v100": 1} for a in placed)
    # Without the lookahead the t4s are free now (the reservation starts in 100 s).
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, world=OpenWorld(holds=world.holds)))
    assert any(jp.allocation and "t4" in jp.allocation.by_type() for jp in plan.jobs)


def test_a_job_a_reservation_within_the_lookahead_keeps_waiting_is_predicted_to_start_after_it() -> None:
    # Admission keeps the t4-only job off nodeb now (the reservation starts within the job's time limit), so
    # the forecast may not start it in the 100 s before the reservation either: it starts when it ends.
    world = OpenWorld(holds=(Hold("nodeb", "t4", 4, 100.0, 3_700.0, "reservation", "reservation maint"),),
                      lookahead_s=3_600.0)
    jp = PLAN(PlanningInput((job("a", types=("t4",)),), NODES, TABLE, world=world)).job("a")
    assert jp.allocation is None
    assert jp.start_s == pytest.approx(3_700.0) and jp.finish_s == pytest.approx(3_900.0)
    assert "predicted start after 3700 s" in (jp.wait_reason or "")


def overdue_case(max_wait_s: float | None):
    # Now 7,200 s; 2 of the 4 v100s are held until 7,300. The wide job (4 v100s, 100 s: 400 GPU-s) was
    # submitted at 0, the narrow one (1 v100, 300 s: 300 GPU-s, so first in GPU-time order) at 7,000, the
    # elastic one (1-4 GPUs of either type) at 7,100.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 7_300.0, "job", "job 1 (alice)"),))
    jobs = (PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, allowed_types=("v100",), submitted_at=0.0),
            PlanJob("narrow", W, 30_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_000.0),
            PlanJob("elastic", W, 10_000.0, 64, min_gpus=1, max_gpus=4, submitted_at=7_100.0))
    return PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, world=world, max_wait_s=max_wait_s))


def test_without_a_wait_limit_a_narrow_job_takes_the_gpus_a_wide_one_waits_for() -> None:
    plan = overdue_case(None)
    assert plan.job("narrow").allocation is not None and plan.job("narrow").allocation.by_type() == {"v100": 1}
    assert plan.job("wide").start_s == pytest.approx(7_500.0)


def test_an_overdue_job_goes_first_and_the_free_gpus_it_may_use_are_kept_for_it() -> None:
    plan = overdue_case(3_600.0)
    wide, narrow, elastic = plan.job("wide"), plan.job("narrow"), plan.job("elastic")
    # The 2 free v100s are kept: the narrow job waits, and the elastic one gets t4s only.
    assert wide.allocation is None and narrow.allocation is None
    assert elastic.allocation is not None and set(elastic.allocation.by_type()) == {"t4"}
    assert "overdue: first in order" in (wide.wait_reason or "")
    assert "kept for 1 overdue job(s)" in (narrow.wait_reason or "")
    # The wide job starts when the hold ends; the forecast keeps the v100s from the narrow job until then.
    assert wide.start_s == pytest.approx(7_300.0) and wide.finish_s == pytest.approx(7_400.0)
    assert narrow.start_s == pytest.approx(7_400.0) and narrow.finish_s == pytest.approx(7_700.0)
    assert wide.order < narrow.order


def backfill_case(limit_s: float | None):
    # As overdue_case, the wait limit on, and a third job: 1 v100 for 50 s (5,000 samples), time limit
    # ``limit_s``. The wide job cannot start before 7,300 s, when the hold ends.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 7_300.0, "job", "job 1 (alice)"),))
    jobs = (PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, allowed_types=("v100",), submitted_at=0.0),
            PlanJob("narrow", W, 30_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_000.0),
            PlanJob("short", W, 5_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0,
                    time_limit_s=limit_s))
    return PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, world=world, max_wait_s=3_600.0))


def test_a_job_whose_time_limit_ends_before_the_overdue_job_can_start_runs_on_its_kept_gpus() -> None:
    plan = backfill_case(60.0)  # Slurm ends it by 7,260 s
    short = plan.job("short")
    assert short.allocation is not None and short.allocation.by_type() == {"v100": 1}
    assert short.start_s == pytest.approx(7_200.0) and short.finish_s == pytest.approx(7_250.0)
    # The overdue job still starts when the hold ends, and the narrow job (no time limit) still waits.
    wide, narrow = plan.job("wide"), plan.job("narrow")
    assert wide.allocation is None and wide.start_s == pytest.approx(7_300.0)
    assert narrow.allocation is None and narrow.start_s == pytest.approx(7_400.0)


@pytest.mark.parametrize("limit_s", [None, 120.0])
def test_a_job_without_a_time_limit_or_with_one_past_the_overdue_jobs_start_waits(limit_s: float | None) -> None:
    plan = backfill_case(limit_s)  # 7,320 s is past 7,300 s, though its predicted end (7,250 s) is not
    assert plan.job("short").allocation is None and plan.job("narrow").allocation is None
    assert plan.job("wide").start_s == pytest.approx(7_300.0)
    assert "kept for 1 overdue job(s)" in (plan.job("short").wait_reason or "")


@pytest.mark.parametrize("limit_s,backfilled", [(90.0, True), (150.0, False)])
def test_backfill_counts_our_own_running_jobs_predicted_ends(limit_s: float, backfilled: bool) -> None:
    # Our own job runs on 2 v100s for 100 s more (20,000 samples at 200/s): the overdue wide job cannot
    # start before 7,300 s, so a job that Slurm ends by 7,290 s may use the 2 v100s kept for it.
    running = PlanJob("running", W, 20_000.0, 64, min_gpus=2, max_gpus=2, allowed_types=("v100",),
                      current=Allocation.of({("nodea", "v100"): 2}))
    jobs = (running,
            PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, allowed_types=("v100",), submitted_at=0.0),
            PlanJob("short", W, 5_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0,
                    time_limit_s=limit_s))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, max_wait_s=3_600.0))
    assert plan.job("running").finish_s == pytest.approx(7_300.0)
    assert (plan.job("short").allocation is not None) is backfilled
    assert plan.job("wide").start_s == pytest.approx(7_300.0)


def test_the_forecast_backfills_as_admission_does_when_kept_gpus_free_up_later() -> None:
    # All 4 v100s are busy now: 2 held by another user until 7,300 s, 2 by our own job until 7,250 s. The
    # overdue wide job keeps the 2 that free up at 7,250 s; a 30 s job that Slurm ends by 40 s after its
    # start fits the gap before 7,300 s, so it is predicted to start at 7,250 s, and the wide job still at 7,300.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 7_300.0, "job", "job 1 (alice)"),))
    running = PlanJob("running", W, 10_000.0, 64, min_gpus=2, max_gpus=2, allowed_types=("v100",),
                      current=Allocation.of({("nodea", "v100"): 2}))
    jobs = (running,
            PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, allowed_types=("v100",), submitted_at=0.0),
            PlanJob("short", W, 3_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0,
                    time_limit_s=40.0),
            PlanJob("narrow", W, 3_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, world=world, max_wait_s=3_600.0))
    short, wide, narrow = plan.job("short"), plan.job("wide"), plan.job("narrow")
    assert short.allocation is None and short.start_s == pytest.approx(7_250.0)
    assert "backfill" in (short.wait_reason or "")
    assert wide.start_s == pytest.approx(7_300.0) and narrow.start_s == pytest.approx(7_400.0)


def queued_case(queued: bool, submitted_at: float = 0.0):
    # backfill_case(60 s) with the wide job already in Slurm's queue for nodea's 4 v100s (replan queued it
    # there once overdue), though it may run on t4s too.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 7_300.0, "job", "job 1 (alice)"),))
    jobs = (PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, submitted_at=submitted_at,
                    current=Allocation.of({("nodea", "v100"): 4}), queued=queued),
            PlanJob("narrow", W, 30_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_000.0),
            PlanJob("short", W, 5_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0,
                    time_limit_s=60.0))
    return PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, world=world, max_wait_s=3_600.0))


def test_an_overdue_job_queued_in_slurm_waits_first_on_its_queued_types_instead_of_holding_them() -> None:
    plan = queued_case(queued=True)
    wide, narrow, short = plan.job("wide"), plan.job("narrow"), plan.job("short")
    # It holds nothing yet: it waits, first in order, for the v100s it is queued on (not the 4 free t4s),
    # the 2 free v100s are kept for it, and the job that Slurm ends by 7,260 s backfills on one of them.
    assert wide.allocation is None and wide.waits_on == ("v100",) and wide.start_s == pytest.approx(7_300.0)
    assert "overdue: first in order" in (wide.wait_reason or "")
    assert short.allocation is not None and short.allocation.by_type() == {"v100": 1}
    assert narrow.allocation is None and narrow.start_s == pytest.approx(7_400.0)


@pytest.mark.parametrize("queued,submitted_at", [(False, 0.0), (True, 7_000.0)])
def test_a_job_in_slurm_that_is_not_queued_or_not_overdue_holds_its_gpus(queued: bool, submitted_at: float) -> None:
    # Started (or not overdue yet): pinned where it is, as every job in Slurm is; nothing is kept or backfilled.
    plan = queued_case(queued, submitted_at)
    assert plan.job("wide").allocation == Allocation.of({("nodea", "v100"): 4})
    assert plan.job("short").allocation is None and "kept for" not in (plan.job("short").wait_reason or "")


def test_an_overdue_job_that_started_keeps_its_gpus_when_the_plan_may_move_running_jobs() -> None:
    # One v100; a plan that may move running jobs (the simulator's) lists the running one as pending too.
    # Without the limit the new job, with less GPU-time left, takes the v100; with it, the running job
    # was submitted before the limit and keeps its rank (a live cluster pins it).
    one = Inventory((Node("nodea", {"v100": 1}),))
    running = Allocation.of({("nodea", "v100"): 1})
    jobs = (PlanJob("running", W, 30_000.0, 64, max_gpus=1, submitted_at=0.0, current=running),
            PlanJob("new", W, 10_000.0, 64, max_gpus=1, submitted_at=7_100.0))
    inp = PlanningInput(jobs, one, TABLE, now=7_200.0, pin_running=False)
    assert PLAN(inp).job("new").allocation is not None
    plan = PLAN(replace(inp, max_wait_s=3_600.0))
    assert plan.job("running").allocation == running and plan.job("new").allocation is None
    assert "kept for" not in (plan.job("new").wait_reason or "")  # nothing overdue waits


def test_a_wait_limit_must_be_positive() -> None:
    with pytest.raises(InputError, match="max_wait_s"):
        PlanningInput((), NODES, TABLE, max_wait_s=0.0)


def test_a_user_cap_bounds_the_gpus_of_all_their_jobs_now_and_in_the_prediction() -> None:
    world = OpenWorld(gpu_caps={"capped": 2})
    jobs = (job("a", hi=4, user="capped"), job("b", hi=4, user="capped"), job("c", user="capped"),
            job("free", hi=4, user="other"))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, world=world))
    now = sum(jp.allocation.gpus for jp in plan.jobs if jp.allocation and jp.job_id != "free")
    assert now <= 2
    waiting = [jp for jp in plan.jobs if jp.allocation is None and jp.job_id != "free"]
    assert waiting and all(jp.start_s > 0 for jp in waiting)
    # Replaying the prediction: at no time do the capped user's jobs hold more than 2 GPUs.
    spans = [(0.0, jp.finish_s, jp.allocation.gpus) for jp in plan.jobs if jp.allocation and jp.job_id != "free"]
    for jp in waiting:
        # A waiting job runs on its minimum or more; count it as its minimum (1), the cap binds on that.
        spans.append((jp.start_s, jp.finish_s, 1))
    for t in sorted({s for s, _, _ in spans}):
        assert sum(g for s, e, g in spans if s <= t < e) <= 2


def test_a_job_that_needs_more_gpus_than_its_users_cap_is_refused() -> None:
    with pytest.raises(InputError, match="may hold at most 2"):
        PLAN(PlanningInput((job("big", lo=3, hi=3, types=("v100",), user="capped"),), NODES, TABLE,
                           world=OpenWorld(gpu_caps={"capped": 2})))


def test_a_foreign_job_ahead_in_slurms_queue_takes_free_gpus_first() -> None:
    world = OpenWorld(ahead=(QueuedAhead(("v100",), 4, 500.0, "job 300 (bob)"),))
    plan = PLAN(PlanningInput((job("a", types=("v100",)),), NODES, TABLE, world=world))
    jp = plan.job("a")
    assert jp.allocation is None and jp.start_s == pytest.approx(500.0)


def test_a_foreign_job_ahead_waiting_for_one_type_does_not_delay_jobs_on_another() -> None:
    world = OpenWorld(holds=(Hold("nodea", "v100", 4, 0.0, 1_000.0, "job", "job 244 (alice)"),),
                      ahead=(QueuedAhead(("v100",), 4, 500.0, "job 300 (bob)"),
                             QueuedAhead(("t4",), 4, 100.0, "job 301 (bob)")))
    plan = PLAN(PlanningInput((job("a", types=("t4",)),), NODES, TABLE, world=world))
    assert plan.job("a").start_s == pytest.approx(100.0)   # after bob's t4 job, not after his v100 one
    plan = PLAN(PlanningInput((job("b", types=("v100",)),), NODES, TABLE, world=world))
    assert plan.job("b").start_s == pytest.approx(1_500.0)  # alice's hold ends at 1000, bob's v100 job runs 500


def test_an_empty_world_plans_as_before() -> None:
    jobs = (job("a", hi=2), job("b"))
    assert PLAN(PlanningInput(jobs, NODES, TABLE)) == PLAN(PlanningInput(jobs, NODES, TABLE, world=OpenWorld()))


# --------------------------------------------------------------------------- CPUs and memory per GPU

def test_a_node_holds_no_more_gpus_than_its_cpus_and_memory_can_feed() -> None:
    """4 GPUs but 4 CPUs: a job asking 2 CPUs per GPU gets at most 2 GPUs there (Slurm would refuse 4), and
    the CPUs a running job holds on the node count first."""
    from slurmhet.planner import Allocation

    table = ThroughputTable.from_rates({"w (batch size 8)": {"v100": 100.0}})
    inv = Inventory((Node("a", {"v100": 4}, cpus=4, memory_mb=8000), Node("b", {"v100": 4}, cpus=16, memory_mb=2000)))

    def job(name: str, cpus: int, mem: int = 0, current: Allocation | None = None, low: int = 1) -> PlanJob:
        return PlanJob(id=name, workload="w (batch size 8)", samples_remaining=1e6, global_batch=8, min_gpus=low,
                       max_gpus=4, allowed_types=("v100",), cpus_per_gpu=cpus, mem_per_gpu_mb=mem, current=current)

    fed = POLICIES["slurmhet"](PlanningInput((job("light", 1),), inv, table, now=0.0)).job("light").allocation
    assert fed is not None and fed.slots == (("a", "v100", 4),)  # the control: one CPU per GPU fits one node
    plan = POLICIES["slurmhet"](PlanningInput((job("hungry", 2, 1000),), inv, table, now=0.0))
    alloc = plan.job("hungry").allocation
    assert alloc is not None
    per_node = {n: c for n, _, c in alloc.slots}
    assert per_node.get("a", 0) <= 2 and per_node.get("b", 0) <= 2  # a: 4 CPUs / 2; b: 2000 MB / 1000
    running = job("running", 3, current=Allocation((("a", "v100", 1),)))
    plan = POLICIES["slurmhet"](PlanningInput((running, job("light", 1, low=1)), inv, table, now=0.0))
    light = plan.job("light").allocation
    assert light is not None and dict((n, c) for n, _, c in light.slots).get("a", 0) <= 1  # 4 - 3 CPUs left



@pytest.mark.parametrize("count,after,wide_start,backfilled", [
    (2, (), 7_800.0, False), (2, ("wide",), 7_300.0, True), (4, (), 7_900.0, True), (4, ("wide",), 7_300.0, True)])
def test_a_younger_foreign_job_slurm_ranks_below_our_queued_job_takes_gpus_only_after_it_starts(
        count: int, after: tuple[str, ...], wide_start: float, backfilled: bool) -> None:
    # queued_case's wide job queued on 4 v100s (2 free, alice holds 2 until 7,300 s) and a 60 s job; bob's job
    # (``count`` v100s for 600 s) pends in Slurm with no expected start. Ranked above the wide job, bob's job
    # takes the 2 free v100s now (count 2: then nothing is kept, so the 60 s job cannot backfill) or all 4 at
    # 7,300 s (count 4), and the wide job starts when it ends. Ranked below it (``after``: Slurm starts it once
    # the wide job has), it takes nothing before: the wide job starts at 7,300 s, bob's job after it.
    world = OpenWorld(holds=(Hold("nodea", "v100", 2, 0.0, 7_300.0, "job", "job 1 (alice)"),),
                      ahead=(QueuedAhead(("v100",), count, 600.0, "job 2 (bob)", after),))
    jobs = (PlanJob("wide", W, 40_000.0, 64, min_gpus=4, max_gpus=4, current=Allocation.of({("nodea", "v100"): 4}),
                    queued=True),
            PlanJob("short", W, 5_000.0, 64, max_gpus=1, allowed_types=("v100",), submitted_at=7_100.0,
                    time_limit_s=60.0),
            PlanJob("late", W, 10_000.0, 64, max_gpus=4, allowed_types=("v100",), submitted_at=7_150.0))
    plan = PLAN(PlanningInput(jobs, NODES, TABLE, now=7_200.0, world=world, max_wait_s=3_600.0))
    wide, short, late = plan.job("wide"), plan.job("short"), plan.job("late")
    assert wide.allocation is None and wide.start_s == pytest.approx(wide_start)
    assert (short.allocation is not None) is backfilled
    if after and count == 4:  # bob's job runs after the wide one, and our late job after bob's
        assert late.start_s == pytest.approx(wide.finish_s + 600.0)
