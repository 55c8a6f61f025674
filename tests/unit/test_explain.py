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
