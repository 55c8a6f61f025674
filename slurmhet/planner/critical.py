"""Critical-path priorities for a queue planned over time (pure): no long job starts last.

The planner admits jobs in weighted-shortest-predicted-time order (Hare's idea), which is
right for JCT but lets a long job wait behind short ones until it alone sets the makespan.
So before planning a queue, the jobs on the critical path get priorities, longest first;
the others keep the planner's WSPT order. ``slurmhet replan`` and the simulator's
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
  critical when its time reaches ``share`` (0.9) of it, i.e. it has at most 10% slack.
  Marking every job above the load term instead cost the ``hare`` case 14% of weighted
  JCT (under Poisson arrivals most long jobs are above it); below 1 keeps the
  near-longest jobs of a batch from starting on slow GPUs (Gavel's minimize_makespan trace).
  0.9 rather than 0.8 since co-location pairs by measured speedup: in one full
  ``bench reproduce`` run each, 0.9 gave better avg JCT on every case but ``hadare`` (no
  critical path there) and ``sjfbco`` makespan 0.2% longer (bench/README.md).
- A user's ``priority`` still orders first: the merged priority is
  ``user x (n + 1) + rank`` with rank 0 (not critical) or 1..n (critical, longest n).
"""

from __future__ import annotations

import math
from dataclasses import replace

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.planner.model import Allocation, PlanJob, PlanningInput, allocation_run_seconds, job_rates

#: A job whose time is at least this share of the makespan lower bound is critical.
CRITICAL_SHARE = 0.9


def packed_allocation(inventory: Inventory, gpu_type: str, gpus: int) -> Allocation | None:
    """``gpus`` GPUs of ``gpu_type`` on the fewest nodes (largest first, then by name); None if too few."""
    counts, need = {}, gpus
    for count, name in inventory.packing_order(gpu_type):
        if need <= 0:
            break
        counts[(name, gpu_type)] = min(count, need)
        need -= counts[(name, gpu_type)]
    return Allocation.of(counts) if need <= 0 else None


def fastest_packed(job: PlanJob, inp: PlanningInput,
                   packed: dict[tuple[str, int], Allocation | None] | None = None) -> tuple[float, int]:
    """The job's least remaining run time on one allowed type, packed, and the GPUs it uses; (inf, 0) if none fits.

    An elastic job (``min_gpus < max_gpus``) is timed on the fastest of: ``min_gpus``, as many as one node
    of the type holds, and as many as the type has (each capped at ``max_gpus``), since spreading over nodes
    may cost more in all-reduce than it gains; a rigid job on its size.
    """
    packed = {} if packed is None else packed  # (type, size) -> its packed allocation, shared by the caller's jobs
    try:
        rates, _ = job_rates(job, inp.throughput, inp.inventory.gpu_types)
    except InputError:
        return math.inf, 0  # the planner itself reports the job's bad type or missing throughput
    capacity = inp.inventory.gpus_by_type()
    best = (math.inf, 0)
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
                best = min(best, (allocation_run_seconds(job, allocation, rates, inp.inventory), gpus))
    return best


def critical_ranks(inp: PlanningInput, share: float = CRITICAL_SHARE) -> dict[str, int]:
    """Critical jobs' ranks, longest first n..1 (ties: the earlier submitted ranks higher)."""
    packed: dict[tuple[str, int], Allocation | None] = {}  # the same few (type, size) for thousands of jobs
    fastest = {job.id: fastest_packed(job, inp, packed) for job in inp.jobs}
    times = {job_id: seconds for job_id, (seconds, _) in fastest.items()}
    finite = [job for job in inp.jobs if math.isfinite(times[job.id])]
    if not finite or not math.isfinite(share):
        return {}
    gpus = sum(inp.inventory.gpus_by_type().values())
    load = sum(seconds * used for seconds, used in (fastest[job.id] for job in finite)) / max(gpus, 1)
    bound = max(load, *(times[job.id] for job in finite))
    critical = sorted((job for job in finite if times[job.id] >= share * bound),
                      key=lambda job: (times[job.id], -job.submitted_at, job.id))
    return {job.id: rank + 1 for rank, job in enumerate(critical)}


def with_critical_path(inp: PlanningInput, share: float = CRITICAL_SHARE) -> PlanningInput:
    """``inp`` with the critical jobs' ranks merged into every job's priority (see the module doc)."""
    ranks = critical_ranks(inp, share)
    if not ranks:
        return inp
    scale = len(inp.jobs) + 1
    jobs = tuple(replace(job, priority=job.priority * scale + ranks.get(job.id, 0)) for job in inp.jobs)
    return replace(inp, jobs=jobs)
