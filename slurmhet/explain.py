"""Say why a job waits or runs where it runs, in words a researcher can act on (pure: from the shared
cluster's facts and rates).

"waits for 1 v100 held by 4 other job(s) until ~14:20; t4 would start it now but run 2.3x longer"
"t4 x2 finishes 40 min later than v100 x1 but starts 3.0 h sooner"
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping, Sequence

from slurmhet.cluster import Hold, Inventory, OpenWorld
from slurmhet.planner.model import Allocation, PlanJob, allocation_run_seconds


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


# --------------------------------------------------------------------------- `slurmhet explain`


@dataclass(frozen=True)
class Option:
    """One way to run the job: ``gpus`` GPUs of one type, when they are free, and for how long."""

    gpu_type: str
    gpus: int
    run_s: float
    start_s: float
    prior: bool

    @property
    def finish_s(self) -> float:
        return self.start_s + self.run_s

    @property
    def label(self) -> str:
        return f"{self.gpu_type} x{self.gpus}"

    def to_json(self) -> dict[str, object]:
        return {"gpu_type": self.gpu_type, "gpus": self.gpus, "run_s": self.run_s, "start_s": self.start_s,
                "finish_s": self.finish_s, "throughput_prior": self.prior}


def _sizes(low: int, high: int) -> list[int]:
    """The sizes worth showing between ``low`` and ``high``: both ends and the powers of two between."""
    out = {low, high}
    size = 1
    while size < high:
        if size > low:
            out.add(size)
        size *= 2
    return sorted(s for s in out if low <= s <= high)


def _packed(gpu_type: str, gpus: int, inventory: Inventory) -> Allocation:
    """``gpus`` GPUs of one type on as few nodes as possible (for the link the job would use)."""
    counts: dict[tuple[str, str], int] = {}
    left = gpus
    for node in sorted(inventory.nodes, key=lambda n: (-n.gpus.get(gpu_type, 0), n.name)):
        take = min(left, node.gpus.get(gpu_type, 0))
        if take > 0:
            counts[(node.name, gpu_type)] = take
            left -= take
    return Allocation.of(counts)


def options(job: PlanJob, rates: Mapping[str, float], priors: Sequence[str], inventory: Inventory, world: OpenWorld,
            busy_ours: Mapping[str, int], now: float) -> list[Option]:
    """Every single-type way the job could run on its allowed types, with its start when GPUs free up."""
    usable = inventory.usable()
    total = usable.gpus_by_type()
    held = world.held(now)
    out = []
    for gpu_type in sorted(rates):
        have = total.get(gpu_type, 0)
        if have < job.min_gpus:
            continue
        theirs = [h for h in held if h.gpu_type == gpu_type]
        free = have - busy_ours.get(gpu_type, 0) - sum(h.count for h in theirs)
        for gpus in _sizes(job.min_gpus, min(job.max_gpus, have)):
            run = allocation_run_seconds(job, _packed(gpu_type, gpus, usable), rates, usable)
            out.append(Option(gpu_type, gpus, run, free_at(theirs, max(free, 0), gpus, now), gpu_type in priors))
    return sorted(out, key=lambda o: (o.finish_s, o.gpu_type, o.gpus))


def _span(seconds: float) -> str:
    if math.isinf(seconds):
        return "an unknown time"
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def reason(chosen: Option | None, opts: Sequence[Option], chosen_label: str = "") -> str:
    """Why the plan's choice, against the options: one or two sentences a researcher can check."""
    known = [o for o in opts if not math.isinf(o.finish_s)]
    if chosen is None or not known:
        return "no option has a known start: " + (", ".join(o.label for o in opts) or "no allowed type has enough GPUs")
    label = chosen_label or chosen.label
    rivals = [o for o in known if (o.gpu_type, o.gpus) != (chosen.gpu_type, chosen.gpus)]
    if not rivals:
        return f"{label} is the only option"
    best = min(rivals, key=lambda o: o.finish_s)
    if abs(chosen.finish_s - best.finish_s) < 1.0:
        return f"{label} and {best.label} finish within a second of each other"
    if chosen.finish_s <= best.finish_s:
        return (f"{label} finishes first: the next best, {best.label}, would finish {_span(best.finish_s - chosen.finish_s)}"
                " later" + ("" if best.start_s > chosen.start_s + 1.0 else
                            f" (it runs {_span(best.run_s - chosen.run_s)} longer)"))
    text = f"{label} finishes {_span(chosen.finish_s - best.finish_s)} later than {best.label}"
    if chosen.start_s + 1.0 < best.start_s:
        return text + f" but starts {_span(best.start_s - chosen.start_s)} sooner"
    return (text + " would: the plan minimises all queued jobs' completion times together, so a faster "
            "option may go to another job")
