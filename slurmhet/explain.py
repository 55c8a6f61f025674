"""Say why a job waits, in words a researcher can act on (pure: from the shared cluster's facts and rates).

"waits for 1 v100 held by 4 other job(s) until ~14:20; t4 would start it now but run 2.3x longer"
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Mapping, Sequence

from slurmhet.cluster import Hold, Inventory, OpenWorld


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).astimezone().strftime("%H:%M")


def free_at(hold_list: Sequence[Hold], have: int, need: int, now: float) -> float:
    """When ``need`` GPUs are free, given ``have`` free now and holds that release theirs at their ends."""
    if have >= need:
        return now
    for hold in sorted(hold_list, key=lambda h: h.end_s):
        have += hold.count
        if have >= need:
            return hold.end_s
    return math.inf


def why_waiting(need: int, waits_on: Sequence[str], allowed: Sequence[str], rates: Mapping[str, float],
                inventory: Inventory, world: OpenWorld, busy_ours: Mapping[str, int], now: float) -> str:
    """Why a job needing ``need`` GPUs waits on ``waits_on`` types, and what its other allowed types offer.

    ``busy_ours`` counts GPUs per type held by this store's own jobs; other users' and reservations'
    holds come from ``world``.
    """
    usable = inventory.usable()
    total = usable.gpus_by_type()
    held = world.held(now)
    phrases = []
    for gpu_type in waits_on:
        theirs = [h for h in held if h.gpu_type == gpu_type]
        free = total.get(gpu_type, 0) - busy_ours.get(gpu_type, 0) - sum(h.count for h in theirs)
        owners = {h.owner for h in theirs if h.kind == "job"}
        reserved = {h.owner for h in theirs if h.kind == "reservation"}
        who = [f"{len(owners)} other job(s)"] if owners else []
        who += sorted(reserved)
        if free >= need:
            phrases.append(f"{need} {gpu_type} free now")  # what holds it back is Slurm's reason, shown beside
            continue
        until = free_at(theirs, max(free, 0), need, now)
        when = "" if not theirs else (" with no known end" if math.isinf(until)
                                      else f" until ~{_clock(until)}" + (" (estimated)" if any(
                                          h.estimated for h in theirs) else ""))
        phrases.append(f"waits for {need} {gpu_type} held by " + (" and ".join(who) or "slurmhet's own jobs") + when)
    fastest = max((rates.get(t, 0.0) for t in waits_on), default=0.0)
    for gpu_type in allowed:
        if gpu_type in waits_on or rates.get(gpu_type, 0.0) <= 0:
            continue
        theirs = sum(h.count for h in held if h.gpu_type == gpu_type)
        if total.get(gpu_type, 0) - busy_ours.get(gpu_type, 0) - theirs >= need:
            slower = fastest / rates[gpu_type] if fastest else 0.0
            phrases.append(f"{gpu_type} would start it now" + (f" but run {slower:.1f}x longer" if slower > 1.0
                                                              else f" and run {1 / slower:.1f}x faster" if slower
                                                              else ""))
    return "; ".join(phrases)
