"""Why a job waits, in words (slurmhet/explain.py), on hand-made capacity facts."""

from __future__ import annotations

import math
from datetime import datetime, timezone

from slurmhet.cluster import Hold, Inventory, Node, OpenWorld
from slurmhet.explain import free_at, why_waiting

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc).timestamp()
INV = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4})))
RATES = {"v100": 300.0, "t4": 120.0}


def held_v100(end_s: float, jobs: int = 1, estimated: bool = False) -> OpenWorld:
    return OpenWorld(tuple(Hold("nodea", "v100", 4 // jobs, NOW - 60, end_s, "job", f"job {100 + i} (bob)", estimated)
                           for i in range(jobs)))


def clock(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).astimezone().strftime("%H:%M")


def test_free_at_counts_releases_in_order_of_their_ends() -> None:
    holds = [Hold("n", "v100", 2, NOW, NOW + 300, "job", "b"), Hold("n", "v100", 1, NOW, NOW + 100, "job", "a")]
    assert free_at(holds, 3, 2, NOW) == NOW  # enough free already
    assert free_at(holds, 0, 1, NOW) == NOW + 100
    assert free_at(holds, 0, 3, NOW) == NOW + 300
    assert math.isinf(free_at(holds, 0, 4, NOW))


def test_a_job_waiting_for_foreign_v100s_names_them_their_end_and_the_slower_idle_type() -> None:
    why = why_waiting(1, ["v100"], ["v100", "t4"], RATES, INV, held_v100(NOW + 1200, jobs=2), {}, NOW)
    assert why == f"waits for 1 v100 held by 2 other job(s) until ~{clock(NOW + 1200)}; t4 would start it now " \
                  f"but run 2.5x longer"


def test_an_estimated_end_is_labelled_and_an_unknown_one_said() -> None:
    assert "(estimated)" in why_waiting(1, ["v100"], ["v100"], RATES, INV, held_v100(NOW + 600, estimated=True), {},
                                        NOW)
    assert "with no known end" in why_waiting(1, ["v100"], ["v100"], RATES, INV, held_v100(math.inf), {}, NOW)


def test_own_jobs_and_reservations_are_told_apart_from_other_users() -> None:
    # A reservation made "StartTime=now" starts at this very second: it holds its GPUs already.
    reserved = OpenWorld((Hold("nodeb", "t4", 4, NOW, NOW + 3600, "reservation", "reservation maint"),))
    why = why_waiting(2, ["t4"], ["t4"], RATES, INV, reserved, {}, NOW)
    assert why == f"waits for 2 t4 held by reservation maint until ~{clock(NOW + 3600)}"
    assert why_waiting(2, ["t4"], ["t4"], RATES, INV, OpenWorld(), {"t4": 3}, NOW) == \
        "waits for 2 t4 held by slurmhet's own jobs"


def test_free_gpus_leave_the_wait_to_slurms_reason_and_a_faster_idle_type_is_said_so() -> None:
    assert why_waiting(1, ["t4"], ["t4", "v100"], RATES, INV, OpenWorld(), {}, NOW) == \
        "1 t4 free now; v100 would start it now and run 2.5x faster"


# --------------------------------------------------------------------------- explain ID: options and the reason

from slurmhet.explain import Option, options, reason  # noqa: E402
from slurmhet.planner.model import PlanJob  # noqa: E402


def _job(samples: float = 360_000.0, low: int = 1, high: int = 2) -> PlanJob:
    return PlanJob(id="1", workload="w (batch size 8)", samples_remaining=samples, global_batch=8, model_size_mb=0.0,
                   samples_per_sync=8.0, samples_per_epoch=samples, sync="allreduce", min_gpus=low, max_gpus=high,
                   allowed_types=("v100", "t4"), weight=1.0, priority=0, colocate=False, gpu_memory_gb=None,
                   submitted_at=NOW)


def test_options_cover_each_type_and_size_with_their_starts() -> None:
    opts = options(_job(), RATES, ["t4"], INV, held_v100(NOW + 3600), {}, NOW)
    assert [(o.label, round(o.run_s), o.start_s - NOW, o.prior) for o in opts] == [
        ("t4 x2", 1500, 0.0, True),         # 360000 / (2 x 120), now
        ("t4 x1", 3000, 0.0, True),
        ("v100 x2", 600, 3600.0, False),    # once bob's v100s free up
        ("v100 x1", 1200, 3600.0, False),   # 360000 / 300
    ]  # by finish


def test_reason_compares_the_choice_with_the_best_other_option() -> None:
    opts = options(_job(), RATES, [], INV, held_v100(NOW + 3600), {}, NOW)
    by = {o.label: o for o in opts}
    assert reason(by["t4 x2"], opts) == "t4 x2 finishes first: the next best, t4 x1, would finish 25 min later " \
                                        "(it runs 25 min longer)"
    late = Option("t4", 1, 3000.0, NOW, False)
    assert reason(late, opts) == "t4 x1 finishes 25 min later than t4 x2 would: the plan minimises all queued " \
                                 "jobs' completion times together, so a faster option may go to another job"
    slow_now = Option("t4", 2, 1500.0, NOW, False)
    v100_later = Option("v100", 2, 600.0, NOW + 7200, False)
    assert reason(slow_now, [v100_later, slow_now]) == "t4 x2 finishes first: the next best, v100 x2, would " \
                                                        "finish 1.8 h later"
    v100_soon = Option("v100", 1, 1200.0, NOW + 600, False)
    assert reason(late, [v100_soon, late]) == "t4 x1 finishes 20 min later than v100 x1 but starts 10 min sooner"
    assert reason(late, [late]) == "t4 x1 is the only option"
    assert reason(late, [Option("v100", 1, 2999.5, NOW, False), late]) == \
        "t4 x1 and v100 x1 finish within a second of each other"
    never = Option("v100", 1, 1200.0, math.inf, False)
    assert reason(None, [never]) == "no option has a known start: v100 x1"
