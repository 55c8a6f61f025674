"""Co-location of small jobs on one GPU under MPS (seed 002, chapters 4-5).

The speedup of a group S sharing a GPU is eq. (4.1):
``delta = sum_j t_j / max_j t'_j`` with t the per-iteration time alone and t'
co-located. Where Gavel measured the pair on that GPU type, t' comes from the
measurement; otherwise from the thesis's linear model over the summed kernel
occupancy C (eq. 4.3) and weighted memory-bandwidth M (eq. 4.2) of the
members' profiles (see :class:`~slurmhet.planner.model.ColocationSettings`).
Without either, nothing is predicted and nothing is co-located.

Grouping follows Algorithm 2 of chapter 5: candidates in ascending occupancy go
to the GPU whose summed occupancy is lowest; the loop stops at the first
placement predicted below ``delta = 1 + margin``. That order and stop rest on
the profiles (a later candidate only adds more occupancy); candidates without a
profile, whose pairs are measured, follow instead in the planner's order, each
onto the GPU of its best measured pair when that reaches ``1 + margin`` (the
first GPU tells nothing of the others: Gavel's pair speedups on one type range
from about 0.5 to 2.0). Only jobs whose spec allows
co-location, that use exactly one GPU and that state their GPU memory are
candidates; a group never exceeds the GPU's memory. Groups run under MPS.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.planner.model import Allocation, ColocationSettings, JobPlan, PlanJob, run_seconds
from slurmhet.throughput import ThroughputTable


@dataclass(frozen=True)
class ColocationGroup:
    """Jobs sharing one GPU; ``slowdown[i]`` is t'_i / t_i of member i."""

    id: str
    node: str
    gpu_type: str
    job_ids: tuple[str, ...]
    delta: float
    slowdown: tuple[float, ...]
    source: str


def eligible(job: PlanJob) -> bool:
    """Only jobs that allow it, run on one GPU and declare their memory (so it can be checked)."""
    return job.colocate and job.max_gpus == 1 and job.gpu_memory_gb is not None


def speedup(jobs: Sequence[PlanJob], gpu_type: str, table: ThroughputTable,
            settings: ColocationSettings) -> tuple[float, tuple[float, ...], str] | None:
    """Predicted (delta, per-member slowdown, source) of running ``jobs`` together, or None if unknown."""
    try:
        alone = [table.get(j.workload, gpu_type).value for j in jobs]
    except InputError:
        return None
    t = [j.global_batch / r for j, r in zip(jobs, alone)]
    if len(jobs) == 2:
        pair = table.colocated(jobs[0].workload, jobs[1].workload, gpu_type)
        if pair is not None:
            t_co = [j.global_batch / r for j, r in zip(jobs, pair)]
            return sum(t) / max(t_co), tuple(tc / ti for tc, ti in zip(t_co, t)), f"measured pair on {gpu_type}"
    profiles = [table.profile(j.workload) for j in jobs]
    if any(p is None for p in profiles):
        return None
    occupancy = sum(p.occupancy for p in profiles)  # type: ignore[union-attr]
    membw = sum(p.membw for p in profiles)  # type: ignore[union-attr]
    delta = settings.delta0 - settings.per_occupancy * occupancy - settings.per_membw * membw
    if delta <= 0:
        return 0.0, tuple(math.inf for _ in jobs), "occupancy/bandwidth model"
    # every member slows alike so that the longest co-located iteration is sum(t) / delta
    factor = sum(t) / (delta * max(t))
    return delta, tuple(factor for _ in jobs), "occupancy/bandwidth model"


def _memory(inventory: Inventory, node: str, gpu_type: str, table: ThroughputTable) -> float | None:
    return inventory.node(node).gpu_memory_gb.get(gpu_type) or table.gpu_memory_gb.get(gpu_type)


def type_memory(inventory: Inventory, gpu_type: str, table: ThroughputTable) -> float | None:
    """The least memory of a GPU of ``gpu_type`` on any node (None if unknown anywhere): a group that fits it
    fits every GPU of the type."""
    sizes = [_memory(inventory, n.name, gpu_type, table) for n in inventory.nodes if n.gpus.get(gpu_type, 0) > 0]
    return None if not sizes or any(s is None for s in sizes) else min(sizes)  # type: ignore[type-var]


def colocate(hosts: Sequence[JobPlan], jobs: Mapping[str, PlanJob], candidates: Sequence[PlanJob],
             table: ThroughputTable, inventory: Inventory, settings: ColocationSettings) -> list[ColocationGroup]:
    """Algorithm 2: put waiting candidates onto GPUs that already run one eligible job."""
    if not settings.enabled:
        return []
    gpus: list[tuple[str, str, list[PlanJob]]] = []
    for plan in hosts:
        if plan.allocation is not None and eligible(jobs[plan.job_id]):
            node, gpu_type, _ = plan.allocation.slots[0]
            gpus.append((node, gpu_type, [jobs[plan.job_id]]))

    def occupancy(job: PlanJob) -> float:
        prof = table.profile(job.workload)
        return prof.occupancy if prof else math.inf

    profiled: list[PlanJob] = []
    measured: list[PlanJob] = []
    for job in candidates:
        if eligible(job):
            (profiled if table.profile(job.workload) else measured).append(job)
    for job in sorted(profiled, key=lambda j: (occupancy(j), j.id)):
        gpus.sort(key=lambda g: (sum(occupancy(m) for m in g[2]), g[0], g[2][0].id))
        room = [g for g in gpus if has_room(job, g[1], len(g[2]), _memory(inventory, g[0], g[1], table),
                                             sum(m.gpu_memory_gb or 0 for m in g[2]), settings)]
        if not room:
            break
        node, gpu_type, members = room[0]
        predicted = speedup(members + [job], gpu_type, table, settings)
        if predicted is None or predicted[0] < 1 + settings.margin:
            break  # Algorithm 2, line 26: stop before a slowdown
        members.append(job)
    _join_best_pairs(gpus, measured, table, inventory, settings)
    chosen: list[tuple[str, str, list[PlanJob], float, tuple[float, ...], str]] = []
    for node, gpu_type, members in gpus:
        if len(members) > 1:
            delta, slow, source = speedup(members, gpu_type, table, settings)  # type: ignore[misc]
            chosen.append((node, gpu_type, members, delta, slow, source))
    chosen.sort(key=lambda c: (c[0], c[2][0].id))
    return [ColocationGroup(f"coloc-{i + 1}", node, gpu_type, tuple(m.id for m in members), delta, slow, source)
            for i, (node, gpu_type, members, delta, slow, source) in enumerate(chosen)]


def has_room(job: PlanJob, gpu_type: str, size: int, memory: float | None, used: float,
              settings: ColocationSettings) -> bool:
    """Whether ``job`` may join a GPU of ``gpu_type`` holding ``size`` members that use ``used`` of its ``memory``."""
    return (size < settings.max_group and (not job.allowed_types or gpu_type in job.allowed_types)
            and memory is not None and used + (job.gpu_memory_gb or 0) <= memory)


def _join_best_pairs(gpus: list[tuple[str, str, list[PlanJob]]], joiners: Sequence[PlanJob], table: ThroughputTable,
                     inventory: Inventory, settings: ColocationSettings) -> None:
    """Each joiner, in order, onto the GPU of its best predicted group (at least ``1 + margin``; ties: the
    earlier GPU in ``gpus``), appended to that GPU's members in place.

    GPUs whose type, memory and members' (workload, batch) and memory agree predict alike, so they share a
    bucket and each joiner prices one GPU per bucket: a decision with thousands of joiners and hosts stays
    linear in them instead of pricing every pair (140 s at 10,000 jobs on 10,000 GPUs).
    """
    def key(gpu: tuple[str, str, list[PlanJob]]) -> tuple[str, float | None, tuple[tuple[str, int], ...], float]:
        node, gpu_type, members = gpu
        return (gpu_type, _memory(inventory, node, gpu_type, table),
                tuple((m.workload, m.global_batch) for m in members), sum(m.gpu_memory_gb or 0 for m in members))

    buckets: dict[tuple[str, float | None, tuple[tuple[str, int], ...], float],
                  list[tuple[int, tuple[str, str, list[PlanJob]]]]] = defaultdict(list)
    for position, gpu in enumerate(gpus):
        if len(gpu[2]) < settings.max_group:
            buckets[key(gpu)].append((position, gpu))  # ascending positions: already a heap
    predicted: dict[tuple[str, int, str, tuple[tuple[str, int], ...]], float | None] = {}
    for job in joiners:
        best: tuple[float, int, tuple[str, float | None, tuple[tuple[str, int], ...], float]] | None = None
        for bucket, heap in buckets.items():
            gpu_type, memory, members, used = bucket
            if not heap or not has_room(job, gpu_type, len(members), memory, used, settings):
                continue
            cached = (job.workload, job.global_batch, gpu_type, members)
            if cached not in predicted:
                guess = speedup(heap[0][1][2] + [job], gpu_type, table, settings)
                predicted[cached] = None if guess is None else guess[0]
            delta = predicted[cached]
            if delta is not None and delta >= 1 + settings.margin and (
                    best is None or (delta, -heap[0][0]) > (best[0], -best[1])):
                best = (delta, heap[0][0], bucket)
        if best is not None:
            position, gpu = heapq.heappop(buckets[best[2]])
            gpu[2].append(job)
            if len(gpu[2]) < settings.max_group:
                heapq.heappush(buckets[key(gpu)], (position, gpu))


def apply_group(group: ColocationGroup, plans: Mapping[str, JobPlan], jobs: Mapping[str, PlanJob],
                order: int, table: ThroughputTable | None = None, inter_gbps: float = 1.0) -> dict[str, JobPlan]:
    """Plans of a group's members: the host keeps its GPU and slows down; joiners start now beside it."""
    host = plans[group.job_ids[0]]
    out: dict[str, JobPlan] = {}
    allocation = Allocation(((group.node, group.gpu_type, 1),))
    for i, job_id in enumerate(group.job_ids):
        job = jobs[job_id]
        plan = plans.get(job_id)
        if plan is None:
            assert table is not None, "joiners need the table for their run time alone"
            entry = table.get(job.workload, group.gpu_type)
            plan = JobPlan(job_id=job_id, allocation=allocation, shard_weights=(1.0,), epoch_seconds=0.0,
                           run_seconds=run_seconds(job, entry.value, 1, inter_gbps), start_s=host.start_s,
                           finish_s=host.start_s, jct_s=0.0, order=order + i - 1, weight=job.weight,
                           priors=(group.gpu_type,) if entry.is_prior else ())
        # Sharing the GPU slows the work, not the start-up before it.
        work = (plan.run_seconds - job.startup_s) * group.slowdown[i]
        run = job.startup_s + work
        epoch = work * job.samples_per_epoch / job.samples_remaining
        out[job_id] = replace(plan, run_seconds=run, epoch_seconds=epoch, finish_s=plan.start_s + run,
                              jct_s=plan.start_s + run - job.submitted_at, colocation_group=group.id,
                              needs_mps=True, wait_reason=None)
    return out
