"""Critical-path priorities for a queue planned over time (pure): no long job starts last.

The planner admits jobs in weighted smallest-GPU-time order (Smith's rule on a gang's area), which
is right for JCT but lets a long job wait behind short ones until it alone sets the makespan.
So before planning a queue, the jobs on the critical path get priorities, longest first;
the others keep the planner's order. ``slurmhet replan`` and the simulator's
``slurmhet`` policy both plan through :func:`with_critical_path`, so what the benchmarks
measure is what the replanner ships.

- A job's time is its remaining run time on its fastest allowed type at its size (an
  elastic job: at its fastest size there, see :func:`fastest_packed`), packed on the
  fewest nodes of that type (largest first), by the planner's own model (eqs. 7, 11
  with the inter-node link when it spans nodes). The one-node figure would
  hide the all-reduce a job larger than any node pays: 8-GPU LM jobs on 4-GPU nodes looked
  9x shorter than they are, never became critical and set the ``hadar`` TTD on trace
  seed 1 (bench/README.md).
- The makespan lower bound is ``max(total GPU-time / GPUs, longest time)``; a job is
  critical when its time reaches ``share`` (0.95) of it, i.e. it has at most 5% slack.
  Marking every job above the load term instead cost the ``hare`` case 14% of weighted
  JCT (under Poisson arrivals most long jobs are above it); below 1 keeps the
  near-longest jobs of a batch from starting on slow GPUs (Gavel's minimize_makespan trace).
  0.9 rather than 0.8 since co-location pairs by measured speedup (better avg JCT on every
  case but ``hadare``, no critical path there); 0.95 rather than 0.9 since the allocator solves
  rigid queues exactly (``hetero._exact``): better avg JCT on every Gavel trace with every
  makespan held, ``sjfbco``'s makespan 4.5% longer (bench/README.md). At 1.0 the guard comes
  too late for minimize_makespan's makespan.
- A user's ``priority`` still orders first: the merged priority is
  ``user x (n + 1) + rank`` with rank 0 (not critical) or 1..n (critical, longest n).
- A revisable plan's joint admission (``pin_running=False``, the simulator's; ``planner/joint.py``)
  gives critical jobs their fastest GPUs only once arrivals have stopped (:func:`arrivals_over`: the
  newest job arrived at least the makespan bound ago); before that they only must run
  (``PlanJob.must_run``), on the GPUs their progress earns them. While jobs arrive, the longest job
  present is critical at nearly every decision, and a later arrival sets the makespan anyway
  (max_min_fairness's last job arrives at 46,317 s and ends it): with gangs weighed 1, the fastest
  GPUs kept for critical jobs throughout cost avg JCT 11,925 s there against 11,654 s with this rule,
  while minimize_makespan's batch needs them for its longest jobs at its end (must-run throughout:
  makespan 73,593 s, 0.931 of Gavel's own, against 68,271 s). A live plan keeps the priority throughout.
- When load sets the makespan (the fluid LP of ``planner/fluid.py`` gives at least
  ``LOAD_BOUND`` (1.25) times the longest job's time), each job that is not critical may
  use only the types that LP books for it, and the critical path is then taken on those
  types (a long job booked on slow GPUs is timed there, so it starts on them in time). The
  K80-friendly long jobs start on the K80s instead of the short jobs that crawl there
  (Gavel's minimize_makespan trace: makespan 0.969 -> 1.005 of Gavel's own; 0.993-1.023
  with other optimal vertices of the same LP). Below that the longest job sets the
  makespan, the LP's bookings only say where capacity is spare, and narrowing there took
  generated 1 job/h from 1.032 to 0.646 of Gavel's avg JCT (bench/README.md: gates 1.0,
  1.11, 1.25, 1.5, 2.0).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.planner.fluid import fluid_booking, greedy_makespan
from slurmhet.planner.model import Allocation, PlanJob, PlanningInput, allocation_run_seconds, job_rates

#: A job whose time is at least this share of the makespan lower bound is critical.
CRITICAL_SHARE = 0.95
#: Load sets the makespan when the fluid LP's makespan is at least this many times the longest job's time.
LOAD_BOUND = 1.25


def packed_allocation(inventory: Inventory, gpu_type: str, gpus: int) -> Allocation | None:
    """``gpus`` GPUs of ``gpu_type`` on the fewest nodes (largest first, then by name); None if too few."""
    counts, need = {}, gpus
    for count, name in inventory.packing_order(gpu_type):
        if need <= 0:
            break
        counts[(name, gpu_type)] = min(count, need)
        need -= counts[(name, gpu_type)]
    return Allocation.of(counts) if need <= 0 else None


def packed_times(job: PlanJob, inp: PlanningInput,
                 packed: dict[tuple[str, int], Allocation | None] | None = None) -> dict[str, tuple[float, int]]:
    """Per allowed type, the job's least remaining run time there, packed, and the GPUs it uses (types it fits).

    An elastic job (``min_gpus < max_gpus``) is timed on the fastest of: ``min_gpus``, as many as one node
    of the type holds, and as many as the type has (each capped at ``max_gpus``), since spreading over nodes
    may cost more in all-reduce than it gains; a rigid job on its size.
    """
    packed = {} if packed is None else packed  # (type, size) -> its packed allocation, shared by the caller's jobs
    try:
        rates, _ = job_rates(job, inp.throughput, inp.inventory.gpu_types)
    except InputError:
        return {}  # the planner itself reports the job's bad type or missing throughput
    capacity = inp.inventory.gpus_by_type()
    times: dict[str, tuple[float, int]] = {}
    for gpu_type, rate in rates.items():
        if rate <= 0:
            continue
        order = inp.inventory.packing_order(gpu_type)
        node = order[0][0] if order else 0  # the largest node of the type
        sizes = {max(job.min_gpus, min(job.max_gpus, n)) for n in (job.min_gpus, node, capacity.get(gpu_type, 0))}
        for gpus in sorted(sizes):
            if (gpu_type, gpus) not in packed:
                packed[(gpu_type, gpus)] = packed_allocation(inp.inventory, gpu_type, gpus)
            allocation = packed[(gpu_type, gpus)]
            if allocation is not None:
                here = (allocation_run_seconds(job, allocation, rates, inp.inventory), gpus)
                times[gpu_type] = min(times.get(gpu_type, here), here)
    return times


def fastest_packed(job: PlanJob, inp: PlanningInput,
                   packed: dict[tuple[str, int], Allocation | None] | None = None) -> tuple[float, int]:
    """The job's least remaining run time on one allowed type, packed, and the GPUs it uses; (inf, 0) if none fits."""
    return _fastest(packed_times(job, inp, packed))


def _fastest(per_type: Mapping[str, tuple[float, int]]) -> tuple[float, int]:
    """The least (seconds, GPUs) of a job's :func:`packed_times`; (inf, 0) if it fits no type."""
    return min(per_type.values(), default=(math.inf, 0))


def critical_ranks(inp: PlanningInput, share: float = CRITICAL_SHARE,
                   times: Mapping[str, Mapping[str, tuple[float, int]]] | None = None) -> dict[str, int]:
    """Critical jobs' ranks, longest first n..1 (ties: the earlier submitted ranks higher).

    ``times``: each job's :func:`packed_times`, when the caller has them already.
    """
    if times is None:
        packed: dict[tuple[str, int], Allocation | None] = {}  # the same few (type, size) for thousands of jobs
        times = {job.id: packed_times(job, inp, packed) for job in inp.jobs}
    fastest = {job.id: _fastest(times[job.id]) for job in inp.jobs}
    finite = [job for job in inp.jobs if math.isfinite(fastest[job.id][0])]
    if not finite or not math.isfinite(share):
        return {}
    bound = makespan_bound(inp, times)
    critical = sorted((job for job in finite if fastest[job.id][0] >= share * bound),
                      key=lambda job: (fastest[job.id][0], -job.submitted_at, job.id))
    return {job.id: rank + 1 for rank, job in enumerate(critical)}


def makespan_bound(inp: PlanningInput, times: Mapping[str, Mapping[str, tuple[float, int]]]) -> float:
    """``max(total GPU-time / GPUs, longest time)`` of the jobs' :func:`packed_times` (0 when none fits)."""
    fastest = [_fastest(per_type) for per_type in times.values()]
    finite = [(seconds, used) for seconds, used in fastest if math.isfinite(seconds)]
    if not finite:
        return 0.0
    gpus = sum(inp.inventory.gpus_by_type().values())
    return max(sum(seconds * used for seconds, used in finite) / max(gpus, 1), max(s for s, _ in finite))


def arrivals_over(inp: PlanningInput, times: Mapping[str, Mapping[str, tuple[float, int]]]) -> bool:
    """Whether the queue's last job arrived at least the makespan bound ago: a batch whose arrivals have
    stopped, whose makespan its longest jobs now set. While jobs still arrive, a later one may set it anyway."""
    newest = max((job.submitted_at for job in inp.jobs), default=inp.now)
    return inp.now - newest >= makespan_bound(inp, times)


def booked_types(inp: PlanningInput, times: Mapping[str, Mapping[str, tuple[float, int]]],
                 load_bound: float = LOAD_BOUND) -> dict[str, tuple[str, ...]]:
    """Each job's types booked by the fluid makespan LP (``planner/fluid.py``), when that LP's makespan is at
    least ``load_bound`` times the longest job's fastest time, i.e. when load sets the makespan; else none.

    Near the longest job, the LP's makespan is that job's time, and the other jobs' bookings only say where
    the capacity has slack; a job then keeps every type.
    """
    if not math.isfinite(load_bound):
        return {}
    longest = max((_fastest(per_type)[0] for per_type in times.values() if per_type), default=0.0)
    if longest <= 0:
        return {}
    capacity = inp.inventory.gpus_by_type()
    if greedy_makespan(times, capacity) < load_bound * longest:
        return {}  # so is the LP's makespan: no LP to solve (most queues at the largest sizes)
    booking = fluid_booking(times, capacity)
    if booking is None or booking.makespan < load_bound * longest:
        return {}
    return dict(booking.types)


def with_critical_path(inp: PlanningInput, share: float = CRITICAL_SHARE,
                       load_bound: float = LOAD_BOUND) -> PlanningInput:
    """``inp`` with, when load sets the makespan, each job that is not critical narrowed to the types the fluid
    LP books for it, and then the critical jobs' ranks (on the narrowed types) merged into every job's priority.

    A running job that stays pinned (``pin_running``) keeps its types: it runs where it runs.
    """
    packed: dict[tuple[str, int], Allocation | None] = {}
    times = {job.id: packed_times(job, inp, packed) for job in inp.jobs}
    booked = booked_types(inp, times, load_bound)
    if booked:
        first = critical_ranks(inp, share, times)
        narrowed = {job.id: booked[job.id] for job in inp.jobs
                    if booked.get(job.id) and job.id not in first and len(booked[job.id]) < len(times[job.id])
                    and not (inp.pin_running and job.current is not None)}
        if narrowed:
            inp = replace(inp, jobs=tuple(replace(job, allowed_types=narrowed[job.id]) if job.id in narrowed else job
                                          for job in inp.jobs))
            times = {job_id: {t: times[job_id][t] for t in narrowed[job_id]} if job_id in narrowed else per_type
                     for job_id, per_type in times.items()}
    ranks = critical_ranks(inp, share, times)
    if not ranks:
        return inp
    arriving = not inp.pin_running and not arrivals_over(inp, times)
    scale = len(inp.jobs) + 1
    jobs = tuple(replace(job, priority=job.priority * scale + ranks.get(job.id, 0),
                         must_run=arriving and job.id in ranks) for job in inp.jobs)
    return replace(inp, jobs=jobs)
