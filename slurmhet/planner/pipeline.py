"""What every policy shares around its allocator: admission, validation and plan assembly.

A policy is an *allocator* (``Problem -> per-job node slots``) wrapped by
:func:`make_policy`. The wrapper

1. resolves throughputs (clear errors, flagged priors) and refuses infeasible requests;
2. keeps running jobs where they are when ``pin_running``;
3. admits pending jobs in weighted smallest-GPU-time order (Smith's rule with a
   job's area, its run time times its GPUs, as the size of a gang: priority
   first, then run time on the job's minimum GPUs of its fastest type times that
   minimum, over its weight) while their minimum GPU counts fit; the rest wait.
   A job that has waited ``PlanningInput.max_wait_s`` is overdue and goes first,
   oldest first; while it does not fit, the free GPUs it may use are kept for it,
   so a stream of narrower jobs cannot starve it (one the live path queued in
   Slurm, ``PlanJob.queued``, is planned so too, on the types it is queued for).
   A later job whose time limit ends before an overdue job could start anyway
   may run on them (backfill);
4. runs the allocator on the admitted jobs and checks its answer (capacity,
   min/max, allowed types) so that no policy can return an impossible plan;
5. co-locates waiting single-GPU jobs that allow it (seed 002) and predicts
   when the other waiting jobs start by replaying step 3 at each predicted
   release of GPUs (list scheduling in the same order, skipping what does not fit).

On a shared cluster (``PlanningInput.world``) GPUs other users' jobs or
reservations hold are pinned capacity like a running job of ours, until their
expected end; foreign pending jobs Slurm starts ahead of ours take GPUs first
as they free up; a per-user GPU cap bounds the sum of a user's jobs, both when
jobs are admitted now and when waiting jobs are predicted to start.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from slurmhet.cluster import Inventory, OpenWorld, QueuedAhead
from slurmhet.errors import InputError
from slurmhet.planner import colocation, joint
from slurmhet.planner.model import (
    Allocation, JobPlan, Plan, PlanJob, PlanningInput, Progress, allocation_run_seconds, effective_rate, epoch_seconds,
    is_overdue, job_rates, link_of, run_seconds, shard_weights,
)
from slurmhet.planner.problem import Problem

Slots = dict[tuple[int, int], int]
Allocator = Callable[[Problem, Progress | None], list[Slots]]
Policy = Callable[..., Plan]


def make_policy(name: str, allocator: Allocator, proportional: bool = True, jointly: bool = False) -> Policy:
    """Wrap an allocator into a planner ``(PlanningInput, progress=None) -> Plan``.

    ``proportional=False`` predicts with equal shards (Optimus splits data evenly). ``jointly``: a revisable
    plan (``pin_running=False``) admits by the joint MILP where it is small (``planner/joint.py``).
    """

    def policy(inp: PlanningInput, progress: Progress | None = None) -> Plan:
        return plan_with(name, allocator, inp, progress, proportional, jointly)

    policy.__name__ = f"plan_{name.replace('-', '_')}"
    policy.__doc__ = f"Plan with the {name!r} policy."
    return policy


def wspt_key(job: PlanJob, rates: dict[str, float], inter_gbps: float) -> tuple[float, float, float, str]:
    """Priority first, then GPU-time (predicted run time on ``min_gpus`` of the fastest type, times
    ``min_gpus``) per unit weight: a gang holds all its GPUs for its whole run, so a wide job delays as
    many others as a narrow job that long (on ``sjfbco``'s 1-32 GPU gangs run time alone left avg
    JCT 14% behind SJF-BCO's; bench/README.md)."""
    best = max(rates.values())
    alone = run_seconds(job, best * job.min_gpus, job.min_gpus, inter_gbps)
    return (-job.priority, alone * job.min_gpus / job.weight, job.submitted_at, job.id)


@dataclass
class _Context:
    """What plan assembly needs besides the Problem."""

    inventory: Inventory
    types: tuple[str, ...]
    rates: dict[str, dict[str, float]]
    priors: dict[str, tuple[str, ...]]
    pinned: list[PlanJob]
    admitted: list[PlanJob]
    waiting: list[PlanJob]
    #: Jobs that wait for a faster type held by others rather than start now on a slower one: why.
    waits_for: dict[str, str]
    #: Jobs not pinned ``max_wait_s`` after submission: first in order, and GPUs are kept for them.
    overdue: frozenset[str]
    #: Jobs started now on GPUs kept for overdue jobs, on fixed slots the allocator does not see.
    backfilled: list[tuple[PlanJob, Slots]]
    #: Per overdue job, the earliest it could start (:func:`_earliest_starts`): backfill ends by then.
    earliest: dict[str, float]
    #: The joint MILP's pairs (host, joiner, GPU type) and the admitted jobs' GPUs per type when it admitted
    #: them (``planner/joint.py``); None: greedy admission, and the allocator chooses the GPUs.
    pairs: tuple[tuple[str, str, str], ...] | None = None
    counts: list[np.ndarray] | None = None


def build_problem(inp: PlanningInput) -> Problem:
    """The Problem a policy would see: admitted jobs on the GPUs not held by pinned running jobs."""
    return _prepare(_queued_as_waiting(inp))[0]


def _queued_as_waiting(inp: PlanningInput) -> PlanningInput:
    """``inp`` with every overdue job waiting in Slurm's queue (``PlanJob.queued``) as a waiting job on the types
    it is queued for: it holds no GPUs yet, and Slurm serves it before younger jobs there and reserves GPUs
    for it, as admission puts an overdue job first and keeps GPUs for it. It is already in Slurm, so it is
    never dispatched again (its candidate keeps its stored allocation)."""
    if inp.max_wait_s is None or not any(j.queued for j in inp.jobs):
        return inp
    return replace(inp, jobs=tuple(
        replace(j, current=None, allowed_types=tuple(j.current.by_type()))
        if j.queued and j.current is not None and is_overdue(j.submitted_at, inp.now, inp.max_wait_s) else j
        for j in inp.jobs))


def _prepare(inp: PlanningInput, jointly: bool = False) -> tuple[Problem, _Context]:
    inventory = inp.inventory.usable()
    types = inventory.gpu_types
    nodes = tuple(n.name for n in inventory.nodes)
    capacity = np.array([[n.gpus.get(t, 0) for t in types] for n in inventory.nodes], dtype=int).reshape(len(nodes), len(types))
    rates: dict[str, dict[str, float]] = {}
    priors: dict[str, tuple[str, ...]] = {}
    per_type = dict(zip(types, capacity.sum(axis=0).tolist()))
    for job in inp.jobs:
        rates[job.id], priors[job.id] = job_rates(job, inp.throughput, types)
        reachable = sum(per_type[t] for t in rates[job.id])
        if job.min_gpus > reachable:
            raise InputError(f"job {job.id!r}: min_gpus {job.min_gpus} exceeds the {reachable} GPUs of its allowed types",
                             place=f"{job.id}.gpus.min", hint=f"lower gpus.min to {reachable} or allow more types")
    pinned = [j for j in inp.jobs if inp.pin_running and j.current is not None]
    unpinned = [j for j in inp.jobs if not (inp.pin_running and j.current is not None)]
    for job in pinned:
        for node, gpu_type, count in job.current.slots:  # type: ignore[union-attr]
            if node not in nodes or gpu_type not in types:
                raise InputError(f"job {job.id!r} runs on {node}:{gpu_type}, which the inventory lacks",
                                 place=f"{job.id}.current", hint="refresh the inventory before planning")
            capacity[nodes.index(node), types.index(gpu_type)] -= count
    # Pinned jobs may hold more of a node than it has for a moment on a live cluster: a pending job's planned
    # slots where Slurm has just started a requeued job, or a part the store still thinks runs there. Slurm never
    # over-commits a GPU, so such a node has nothing free: no job is planned onto it, and the plan goes on.
    np.maximum(capacity, 0, out=capacity)
    _feedable(capacity, inventory, types, unpinned, pinned, rates)
    _take_world(capacity, inp.world, inp.now, nodes, types, frozenset(j.id for j in unpinned))
    caps = inp.world.gpu_caps
    for job in inp.jobs:
        if job.user in caps and job.min_gpus > caps[job.user]:
            raise InputError(f"job {job.id!r} needs {job.min_gpus} GPUs at once but user {job.user!r} may hold at "
                             f"most {caps[job.user]}", place=f"{job.id}.gpus.min",
                             hint=f"lower gpus.min to {caps[job.user]} or ask for a larger GPU limit")
    # A plan that may move running jobs lists them here too: an overdue one that has started keeps its
    # rank, so no younger job takes its GPUs (as pinning does on a live cluster).
    overdue = frozenset(j.id for j in unpinned if is_overdue(j.submitted_at, inp.now, inp.max_wait_s))
    pending = sorted(unpinned,
                     key=lambda j: (j.id not in overdue, j.submitted_at if j.id in overdue else 0.0,
                                    wspt_key(j, rates[j.id], inventory.inter_node_gbps)))
    earliest = _earliest_starts([j for j in pending if j.id in overdue], rates, types, inp, pinned)
    free = capacity.sum(axis=0)
    held: Counter[str] = Counter()
    for job in pinned:
        held[job.user] += job.current.gpus  # type: ignore[union-attr]
    admitted, waiting = [], []
    waits_for: dict[str, str] = {}
    kept: list[tuple[float, np.ndarray]] = []  # per overdue job: its earliest start, the GPUs kept by node
    backfilled: list[tuple[PlanJob, Slots]] = []
    for job in pending:
        got = _fastest_free(job, rates[job.id], types, free)
        take = got if got.sum() == job.min_gpus else None
        over_cap = job.user in caps and held[job.user] + job.min_gpus > caps[job.user]
        if take is None and not over_cap and kept and job.time_limit_s is not None:
            slots = _backfill(job, rates[job.id], types, capacity, free, kept, inp.now + job.time_limit_s)
            if slots is not None:
                held[job.user] += job.min_gpus
                backfilled.append((job, slots))
                continue
        if take is None or over_cap:
            waiting.append(job)
            if take is None and not over_cap and job.id in overdue:
                # Kept for it, so that narrower jobs behind it cannot take each GPU that frees up.
                free -= got
                by_node = np.zeros_like(capacity)
                for t in np.flatnonzero(got):
                    by_node[:, t] = _take_from_nodes(capacity, int(t), int(got[t]))
                kept.append((earliest[job.id], by_node))
            continue
        faster = _faster_later(job, rates[job.id], types, free, take, inp) if inp.world.holds else None
        if faster is not None:
            gpu_type, waits_for[job.id] = faster
            rates[job.id] = {gpu_type: rates[job.id][gpu_type]}
            waiting.append(job)
        else:
            free -= take
            held[job.user] += job.min_gpus
            admitted.append(job)
    # A capped user's slack above the admitted jobs' minimums goes to them in admission order, so no
    # allocator can give the user more GPUs than the cap, whatever it does within [min, max].
    slack = {user: cap - held[user] for user, cap in caps.items()}
    for i, job in enumerate(admitted):
        if job.user in slack:
            top = min(job.max_gpus, job.min_gpus + slack[job.user])
            slack[job.user] -= top - job.min_gpus
            admitted[i] = replace(job, max_gpus=top) if top != job.max_gpus else job
    pairs, counts = None, None
    if jointly and not (inp.pin_running or pinned or overdue or backfilled or caps or waits_for) \
            and joint.within_size(pending, len(types), inp.colocation):
        # Every job with a priority that greedy admission let in runs; a must-run job's GPUs go by its progress.
        candidates = [replace(j, priority=0) if j.must_run else j for j in pending]
        admission = joint.admit(_problem(candidates, rates, capacity, types, nodes, inventory, inp),
                                [j.id for j in admitted if j.priority > 0], inp.throughput, inventory, inp.colocation)
        if admission is not None:
            pairs = admission.pairs
            admitted = [j for j in pending if j.id in admission.run]
            waiting = [j for j in pending if j.id not in admission.run]
            counts = [admission.run[j.id] for j in admitted]
    problem = _problem(admitted, rates, capacity, types, nodes, inventory, inp)
    return problem, _Context(inventory, types, rates, priors, pinned, admitted, waiting, waits_for, overdue,
                             backfilled, earliest, pairs, counts)


def _problem(jobs: Sequence[PlanJob], rates: Mapping[str, dict[str, float]], capacity: np.ndarray,
             types: tuple[str, ...], nodes: tuple[str, ...], inventory: Inventory, inp: PlanningInput) -> Problem:
    matrix = np.array([[rates[j.id].get(t, 0.0) for t in types] for j in jobs]).reshape(len(jobs), len(types))
    return Problem(tuple(jobs), types, nodes, capacity, matrix, inventory.intra_node_gbps, inventory.inter_node_gbps,
                   inp.seed, preemptive=not inp.pin_running, move_penalty=inp.move_penalty)


def _earliest_starts(jobs: Sequence[PlanJob], rates: Mapping[str, dict[str, float]], types: tuple[str, ...],
                     inp: PlanningInput, pinned: Sequence[PlanJob]) -> dict[str, float]:
    """Per job, the earliest time ``min_gpus`` of its types are free: pinned jobs end as predicted, other
    users' holds (counted from ``world.lookahead_s`` before their start) end when expected, and no other
    job of ours is served first. It can only start later, so a job that ends by then never delays it."""
    if not jobs:
        return {}
    timeline = _Timeline(types, capacity_total(inp.inventory.usable(), types))
    for other in pinned:
        run = allocation_run_seconds(other, other.current, rates[other.id], inp.inventory)  # type: ignore[arg-type]
        timeline.hold(inp.now, inp.now + run, other.current.by_type())  # type: ignore[union-attr]
    timeline.hold_world(inp.world, inp.now)
    return {job.id: timeline.earliest_total(inp.now, np.array([t in rates[job.id] for t in types]), job.min_gpus)
            for job in jobs}


def _backfill(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], capacity: np.ndarray, free: np.ndarray,
              kept: list[tuple[float, np.ndarray]], ends: float) -> Slots | None:
    """Node slots for ``job`` on free GPUs and on those kept for overdue jobs that cannot start before ``ends``
    (its time limit), as Slurm's backfill starts a job in a gap it leaves before the gap closes; None when
    its minimum does not fit. Takes them (in place) from ``capacity``, ``free`` and the kept pools."""
    pools = [by_node for earliest, by_node in kept if earliest >= ends]
    if not pools:
        return None
    take = _fastest_free(job, rates, types, free + sum(pools).sum(axis=0))
    if take.sum() < job.min_gpus:
        return None
    slots: Counter[tuple[int, int]] = Counter()
    for t in map(int, np.flatnonzero(take)):
        own = min(int(take[t]), int(free[t]))
        free[t] -= own
        for n, got in enumerate(_take_from_nodes(capacity, t, own)):
            slots[n, t] += int(got)
        lend = int(take[t]) - own
        for by_node in pools:
            for n in sorted(range(by_node.shape[0]), key=lambda n: (-by_node[n, t], n)):
                got = min(lend, int(by_node[n, t]))
                by_node[n, t] -= got
                slots[n, t] += got
                lend -= got
    return {key: c for key, c in slots.items() if c}


def _faster_later(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray,
                  take: np.ndarray, inp: PlanningInput) -> tuple[str, str] | None:
    """The job's fastest type and why, when waiting for it (held by others) finishes sooner than starting now.

    Starting now runs on ``take`` (its minimum on the fastest free types); waiting runs on its minimum
    of the fastest type from when enough of it is free: what is free now plus what other users' holds
    release, in order of their expected ends. None when starting now is as good, or nothing tells when
    the fastest type frees up.
    """
    best = max(rates, key=lambda t: (rates[t], t))
    b = types.index(best)
    if take[b] == take.sum():
        return None
    gbps = inp.inventory.inter_node_gbps
    vec = np.array([rates.get(t, 0.0) for t in types])
    run_now = run_seconds(job, float(vec @ take), int(take.sum()), gbps)
    have, ready = int(free[b]), inp.now
    for hold in sorted((h for h in inp.world.held(inp.now) if h.gpu_type == best and np.isfinite(h.end_s)),
                       key=lambda h: h.end_s):
        if have >= job.min_gpus:
            break
        have, ready = have + hold.count, hold.end_s
    if have < job.min_gpus:
        return None
    run_later = run_seconds(job, rates[best] * job.min_gpus, job.min_gpus, gbps)
    if ready + run_later >= inp.now + run_now:
        return None
    now_types = "+".join(f"{int(c)}x{t}" for t, c in zip(types, take) if c)
    return best, (f"waits for {job.min_gpus} {best} held by other users until ~{ready - inp.now:.0f} s from now: "
                  f"finishes {ready + run_later - inp.now:.0f} s from now there, vs {run_now:.0f} s starting now "
                  f"on {now_types}")


def _feedable(capacity: np.ndarray, inventory: Inventory, types: tuple[str, ...], pending: Sequence[PlanJob],
              pinned: Sequence[PlanJob], rates: Mapping[str, Mapping[str, float]]) -> None:
    """Cap (in place) each node's free GPUs at what its CPUs and memory left can feed.

    Each GPU of a job comes with its task's CPUs and memory (``cpus_per_gpu``, ``mem_per_gpu_mb``). What the
    pinned jobs on a node hold is taken first; the free GPUs of a type then count only as many as the largest
    demand among the waiting jobs that may use the type can be fed with what is left. So no allocator can
    ask Slurm for more CPUs or memory than a node has, whichever jobs it puts where; the price is that a
    hungry job makes its types' nodes look smaller to lighter jobs for this decision. Nodes whose CPUs or
    memory the inventory does not know (simulated clusters) are not capped.
    """
    if not pending or not any(n.cpus or n.memory_mb for n in inventory.nodes):
        return
    need_cpu = {t: max((j.cpus_per_gpu for j in pending if t in rates[j.id]), default=1) for t in types}
    need_mem = {t: max((j.mem_per_gpu_mb for j in pending if t in rates[j.id]), default=0) for t in types}
    for i, node in enumerate(inventory.nodes):
        cpus_left, mem_left = node.cpus, node.memory_mb
        for job in pinned:
            on_node = sum(c for n, _, c in job.current.slots if n == node.name)  # type: ignore[union-attr]
            cpus_left -= on_node * job.cpus_per_gpu
            mem_left -= on_node * job.mem_per_gpu_mb
        room = []
        for t, gpu_type in enumerate(types):
            fits = [int(capacity[i, t])]
            if node.cpus:
                fits.append(max(cpus_left, 0) // need_cpu[gpu_type])
            if node.memory_mb and need_mem[gpu_type]:
                fits.append(max(mem_left, 0) // need_mem[gpu_type])
            room.append(min(fits))
        # Types sharing a node share its CPUs and memory: together they may not feed more than the hungriest.
        hungriest = max((t for t in range(len(types)) if capacity[i, t] > 0),
                        key=lambda t: (need_cpu[types[t]], need_mem[types[t]]), default=None)
        if hungriest is not None:
            total = room[hungriest]
            for t in range(len(types)):
                capacity[i, t] = min(room[t], total)
                total -= int(capacity[i, t])


def _take_world(capacity: np.ndarray, world: OpenWorld, now: float, nodes: tuple[str, ...],
                types: tuple[str, ...], waiting: frozenset[str]) -> None:
    """Take from ``capacity`` (in place) what other users hold now and what Slurm starts ahead of ours now.

    Holds count from now (or from within ``world.lookahead_s``); a node or type the inventory
    lacks (drained, or not a GPU type here) holds nothing. A foreign job ahead of ours that fits
    in what is left takes it, on the nodes with most free GPUs of its type, as Slurm would start
    it first; one that does not fit yet waits for GPUs to free up (see :func:`_list_schedule`), and
    so does one that Slurm starts only after a job of ours in its queue that is still ``waiting``.
    """
    node_index = {n: i for i, n in enumerate(nodes)}
    for hold in world.held(now, world.lookahead_s):
        if hold.node in node_index and hold.gpu_type in types:
            i, t = node_index[hold.node], types.index(hold.gpu_type)
            capacity[i, t] = max(0, capacity[i, t] - hold.count)
    for job in world.ahead:
        fits = [types.index(t) for t in job.gpu_types if t in types and capacity[:, types.index(t)].sum() >= job.count]
        if not fits or waiting.intersection(job.after):
            continue
        _take_from_nodes(capacity, fits[0], job.count)


def _take_from_nodes(capacity: np.ndarray, t: int, count: int) -> np.ndarray:
    """Take ``count`` GPUs of type ``t`` from ``capacity`` (in place), nodes with most free ones first; how
    many from each node."""
    taken = np.zeros(capacity.shape[0], dtype=capacity.dtype)
    for i in sorted(range(capacity.shape[0]), key=lambda i: (-capacity[i, t], i)):
        got = min(count, int(capacity[i, t]))
        capacity[i, t] -= got
        taken[i] = got
        count -= got
    return taken


def plan_with(name: str, allocator: Allocator, inp: PlanningInput, progress: Progress | None,
              proportional: bool = True, jointly: bool = False) -> Plan:
    inp = _queued_as_waiting(inp)
    problem, ctx = _prepare(inp, jointly)
    inventory, types, rates, priors = ctx.inventory, ctx.types, ctx.rates, ctx.priors
    pinned, admitted, waiting = ctx.pinned, ctx.admitted, ctx.waiting
    if ctx.counts is not None:
        slots = joint.place(problem, ctx.counts)
    else:
        slots = allocator(problem, progress) if admitted else []
    _verify(name, problem, slots)
    plans: dict[str, JobPlan] = {}
    order = 0
    for job in pinned:
        plans[job.id] = _job_plan(job, job.current, rates[job.id], inp, order, priors[job.id])  # type: ignore[arg-type]
        order += 1
    for j, job in enumerate(admitted):
        plans[job.id] = _job_plan(job, problem.to_allocation(slots[j]), rates[job.id], inp, order, priors[job.id],
                                  proportional=proportional)
        order += 1
    for job, job_slots in ctx.backfilled:  # not co-location hosts: a joiner would outlive the time limit
        plans[job.id] = _job_plan(job, problem.to_allocation(job_slots), rates[job.id], inp, order, priors[job.id],
                                  proportional=proportional)
        order += 1
    by_id = {j.id: j for j in inp.jobs}
    if ctx.pairs is not None:  # the joint MILP chose who shares a GPU, and that no one else should
        groups = joint.groups(ctx.pairs, plans, by_id, inp.throughput, inp.colocation)
    else:
        groups = colocation.colocate(
            hosts=[plans[j.id] for j in pinned + admitted if plans[j.id].allocation and plans[j.id].allocation.gpus == 1],
            jobs=by_id, candidates=waiting, table=inp.throughput, inventory=inventory, settings=inp.colocation,
        )
    for group in groups:
        for job_id, plan in colocation.apply_group(group, plans, by_id, order, inp.throughput,
                                                   inventory.inter_node_gbps).items():
            if job_id not in plans:
                order += 1
            plans[job_id] = plan
    still = [j for j in waiting if j.id not in plans]
    for plan in _list_schedule(still, plans, rates, priors, capacity_total(inventory, types), types, inp, order,
                               ctx.waits_for, ctx.overdue, ctx.earliest):
        plans[plan.job_id] = plan
    return Plan(name, tuple(plans[j.id] for j in inp.jobs), inp.now)


def capacity_total(inventory: Inventory, types: tuple[str, ...]) -> np.ndarray:
    return np.array([sum(n.gpus.get(t, 0) for n in inventory.nodes) for t in types], dtype=int)


def _min_counts(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray) -> np.ndarray | None:
    """``min_gpus`` GPUs from the free pool, fastest allowed types first; None when they do not fit."""
    take = _fastest_free(job, rates, types, free)
    return take if take.sum() == job.min_gpus else None


def _fastest_free(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray) -> np.ndarray:
    """Up to ``min_gpus`` GPUs from the free pool, fastest allowed types first."""
    take = np.zeros(len(types), dtype=int)
    need = job.min_gpus
    for t in sorted(rates, key=lambda t: (-rates[t], t)):
        i = types.index(t)
        got = min(need, int(free[i]))
        take[i] += got
        need -= got
    return take


def _verify(name: str, problem: Problem, slots: list[Slots]) -> None:
    """A policy's answer must respect capacity, min/max and allowed types; a violation is a bug."""
    if len(slots) != len(problem.jobs):
        raise AssertionError(f"policy {name!r} returned {len(slots)} allocations for {len(problem.jobs)} jobs")
    used = np.zeros_like(problem.capacity)
    for j, job_slots in enumerate(slots):
        total = 0
        for (n, t), c in job_slots.items():
            if c < 0 or not problem.allowed[j, t]:
                raise AssertionError(f"policy {name!r} gave job {problem.jobs[j].id!r} {c} GPUs of type {problem.types[t]}")
            used[n, t] += c
            total += c
        if not problem.lo[j] <= total <= problem.hi[j]:
            raise AssertionError(f"policy {name!r} gave job {problem.jobs[j].id!r} {total} GPUs outside "
                                 f"[{problem.lo[j]}, {problem.hi[j]}]")
    if (used > problem.capacity).any():
        raise AssertionError(f"policy {name!r} exceeded node capacity")


def _job_plan(job: PlanJob, allocation: Allocation, rates: dict[str, float], inp: PlanningInput, order: int,
              priors: tuple[str, ...], start: float | None = None, proportional: bool = True) -> JobPlan:
    run = allocation_run_seconds(job, allocation, rates, inp.inventory, proportional)
    rate_sum = effective_rate(rates, allocation, proportional)
    begin = inp.now if start is None else start
    weights = shard_weights(rates, allocation) if proportional else tuple(1.0 / allocation.gpus for _ in range(allocation.gpus))
    return JobPlan(
        job_id=job.id, allocation=allocation, shard_weights=weights,
        epoch_seconds=epoch_seconds(job, rate_sum, allocation.gpus, link_of(allocation, inp.inventory)),
        run_seconds=run, start_s=begin, finish_s=begin + run, jct_s=begin + run - job.submitted_at, order=order,
        weight=job.weight, priors=tuple(t for t in priors if t in allocation.by_type()),
    )


def _list_schedule(waiting: list[PlanJob], plans: dict[str, JobPlan], rates: dict[str, dict[str, float]],
                   priors: dict[str, tuple[str, ...]], total: np.ndarray, types: tuple[str, ...],
                   inp: PlanningInput, order: int, waits_for: dict[str, str],
                   overdue: frozenset[str], earliest: Mapping[str, float]) -> list[JobPlan]:
    """Predict start times of waiting jobs by replaying admission each time GPUs free up.

    At now and at each predicted release, the waiting jobs are taken in order and each one whose
    minimum fits what is free starts then, as admission at that replan would admit it (it skips a job
    that does not fit and goes on, so a narrow job may start before a wide one ahead of it). GPUs are
    counted by type only; the job gets the fastest allowed free GPUs, one at a time while that shortens
    its run (the node placement is decided when it actually starts). Other users' holds take their GPUs
    from ``world.lookahead_s`` before their start (as admission counts them: a job started then would
    still run when the hold begins) to their expected end, and foreign jobs Slurm starts ahead of ours
    take GPUs first, each at the earliest time they fit. A capped user's job also waits until the user's
    own jobs leave room under the cap. An ``overdue`` job (first in order) that does not fit keeps the
    free GPUs it may use from every job after it, as admission keeps them; a job whose time limit ends
    by the overdue job's ``earliest`` start (the one admission used) may start on them, as admission
    backfills.
    """
    users = {j.id: j.user for j in inp.jobs}
    caps = inp.world.gpu_caps
    timeline = _Timeline(types, total)
    for p in plans.values():
        if p.allocation:
            timeline.hold(inp.now, p.finish_s, p.allocation.by_type(), users.get(p.job_id, ""))
    timeline.hold_world(inp.world, inp.now)
    # A foreign job Slurm starts only after waiting jobs of ours (queued in Slurm) is placed once they start.
    index = {job.id: i for i, job in enumerate(waiting)}
    blockers: dict[int, list[tuple[QueuedAhead, set[int]]]] = {}
    free_now = []
    for ahead in inp.world.ahead:
        of = {index[j] for j in ahead.after if j in index}
        for i in of:
            blockers.setdefault(i, []).append((ahead, of))
        if not of:
            free_now.append(ahead)
    _place_ahead(timeline, free_now, inp.now)
    # Jobs alike in what they may take (types, minimum, a capped user) fit or not together, so only the
    # first waiting one of each kind is tried: a pass costs the number of kinds, not of waiting jobs.
    kinds: dict[tuple[tuple[str, ...], int, str], deque[int]] = {}
    for i, job in enumerate(waiting):
        kinds.setdefault((tuple(rates[job.id]), job.min_gpus, job.user if job.user in caps else ""), deque()).append(i)
    queues = list(kinds.values())
    kind_of = {i: g for g, queue in enumerate(queues) for i in queue}
    late = [i for i, job in enumerate(waiting) if job.id in overdue]
    limited = [i for i, job in enumerate(waiting) if job.time_limit_s is not None and job.id not in overdue]
    backfills: set[int] = set()
    need = np.array([k[1] for k in kinds], dtype=int)
    allowed = np.array([[t in k[0] for t in types] for k in kinds], dtype=int).reshape(len(kinds), len(types))
    started: dict[int, tuple[float, np.ndarray, JobPlan]] = {}
    clock = inp.now
    timeline.settle(clock)
    while any(queues):
        capped: set[int] = set()
        while True:
            left, g = timeline.free(), None
            keeps: list[tuple[int, np.ndarray]] = []
            for i in late:  # overdue jobs first: each that fits starts, each that does not keeps what is free
                cap = caps.get(waiting[i].user)
                if i in started or (cap is not None and timeline.used_by(waiting[i].user) + waiting[i].min_gpus > cap):
                    continue
                kept = _fastest_free(waiting[i], rates[waiting[i].id], types, left)
                if kept.sum() == waiting[i].min_gpus:
                    g = kind_of[i]
                    break
                left = left - kept
                keeps.append((i, kept))
            if g is None:
                fits = [g for g in np.flatnonzero(allowed @ left >= need)
                        if queues[g] and g not in capped and waiting[queues[g][0]].id not in overdue]
                if not fits:
                    pick = _backfill_pick(waiting, limited, started, keeps, earliest, timeline, clock, left, rates,
                                          types, caps)
                    if pick is None:
                        break
                    i, take = pick
                    job = waiting[i]
                    plan = _job_plan(job, _at_start(take, types), rates[job.id], inp, order + i, priors[job.id],
                                     start=clock)
                    timeline.hold(clock, plan.finish_s, {types[t]: int(c) for t, c in enumerate(take) if c}, job.user)
                    timeline.settle(clock)
                    queues[kind_of[i]].remove(i)
                    started[i] = (clock, take, plan)
                    backfills.add(i)
                    _place_ahead(timeline, _unblocked(blockers, i), clock)
                    continue
                g = min(fits, key=lambda g: queues[g][0])
            i = queues[g][0]
            job, cap = waiting[i], caps.get(waiting[i].user)
            used = timeline.used_by(job.user)
            if cap is not None and used + job.min_gpus > cap:
                capped.add(g)
                continue
            take = _min_counts(job, rates[job.id], types, left)
            assert take is not None  # its kind's minimum fits what is free
            take = _grow(job, rates[job.id], types, left, take, inp, None if cap is None else cap - used)
            plan = _job_plan(job, _at_start(take, types), rates[job.id], inp, order + i, priors[job.id], start=clock)
            timeline.hold(clock, plan.finish_s, {types[t]: int(c) for t, c in enumerate(take) if c}, job.user)
            timeline.settle(clock)
            started[queues[g].popleft()] = (clock, take, plan)
            _place_ahead(timeline, _unblocked(blockers, i), clock)
        if not timeline.events:
            break
        clock = timeline.next_change(clock)
    out = []
    for i, job in enumerate(waiting):
        if i in started:
            clock, take, plan = started[i]
            order_note = ("overdue: first in order, free GPUs kept for it" if job.id in overdue
                          else "backfill: its time limit ends before the overdue job(s) it passes can start"
                          if i in backfills
                          else "GPU-time order" + (f"; free GPUs are kept for {len(late)} overdue job(s)" if late
                                                   else ""))
            reason = (f"waits for {job.min_gpus} GPU(s) of {', '.join(sorted(rates[job.id]))}; "
                      f"predicted start after {clock - inp.now:.0f} s ({order_note})")
        else:
            # Held with no known end (or a cap nothing frees): the run time is on its minimum, the start unknown.
            take = _min_counts(job, rates[job.id], types, total)
            assert take is not None  # min_gpus fits the allowed types' capacity: checked in _prepare
            plan = _job_plan(job, _at_start(take, types), rates[job.id], inp, order + i, priors[job.id])
            reason = (f"waits for {job.min_gpus} GPU(s) of {', '.join(sorted(rates[job.id]))}, held with no known "
                      f"end: no predicted start")
        out.append(JobPlan(**{**plan.__dict__, "allocation": None, "shard_weights": (),
                              "wait_reason": waits_for.get(job.id, reason),
                              "waits_on": tuple(sorted(types[t] for t, c in enumerate(take) if c))}))
    return out


def _place_ahead(timeline: _Timeline, aheads: Sequence[QueuedAhead], clock: float) -> None:
    """Hold GPUs for foreign jobs Slurm starts ahead of our waiting ones, each at its earliest fit from ``clock``."""
    for ahead in aheads:
        start, gpu_type = timeline.earliest(clock, ahead.gpu_types, ahead.count)
        if gpu_type is not None:
            timeline.hold(start, start + ahead.duration_s, {gpu_type: ahead.count})
    timeline.settle(clock)


def _unblocked(blockers: dict[int, list[tuple[QueuedAhead, set[int]]]], started: int) -> list[QueuedAhead]:
    """The foreign jobs ahead whose last waiting blocker (by index) is ``started``, so they may be placed now;
    updates ``blockers``."""
    out = []
    for ahead, of in blockers.pop(started, ()):
        of.discard(started)
        if not of:
            out.append(ahead)
    return out


def _backfill_pick(waiting: list[PlanJob], limited: list[int], started: Mapping[int, object],
                   keeps: list[tuple[int, np.ndarray]], earliest: Mapping[str, float], timeline: _Timeline,
                   clock: float, left: np.ndarray, rates: dict[str, dict[str, float]], types: tuple[str, ...],
                   caps: Mapping[str, int]) -> tuple[int, np.ndarray] | None:
    """The first waiting job with a time limit that fits, at ``clock``, what is free and what is kept for the
    overdue jobs whose ``earliest`` start its limit ends by (admission's backfill); and its GPUs by type."""
    if not keeps:
        return None
    for i in limited:
        job = waiting[i]
        cap = caps.get(job.user)
        if i in started or (cap is not None and timeline.used_by(job.user) + job.min_gpus > cap):
            continue
        ends = clock + job.time_limit_s  # type: ignore[operator]
        pool = left.copy()
        for o, kept in keeps:
            if earliest[waiting[o].id] >= ends:
                pool += kept
        take = _fastest_free(job, rates[job.id], types, pool)
        if take.sum() == job.min_gpus:
            return i, take
    return None


def _at_start(take: np.ndarray, types: tuple[str, ...]) -> Allocation:
    """A waiting job's predicted GPUs, by type only: its nodes are chosen when it starts."""
    return Allocation.of({("(at start)", types[i]): int(c) for i, c in enumerate(take) if c})


class _Timeline:
    """GPUs in use by type over time, as a heap of future changes (holds starting and ending)."""

    def __init__(self, types: tuple[str, ...], total: np.ndarray) -> None:
        self.types, self.total = types, total
        self.busy = np.zeros(len(types), dtype=int)
        self.by_user: Counter[str] = Counter()
        self.clock = -np.inf
        self.events: list[tuple[float, int, int, tuple[tuple[int, int], ...], str]] = []
        self.sequence = 0

    def _push(self, at: float, sign: int, counts: tuple[tuple[int, int], ...], user: str) -> None:
        # Releases (-1) before acquisitions (+1) at equal times, then insertion order.
        heapq.heappush(self.events, (at, sign, self.sequence, counts, user))
        self.sequence += 1

    def hold(self, start: float, end: float, by_type: dict[str, int], user: str = "") -> None:
        counts = tuple((self.types.index(t), c) for t, c in by_type.items() if c)
        self._push(start, 1, counts, user)
        if np.isfinite(end):
            self._push(end, -1, counts, user)

    def _advance(self) -> float:
        at, sign, _, counts, user = heapq.heappop(self.events)
        for t, c in counts:
            self.busy[t] += sign * c
        if user:
            self.by_user[user] += sign * sum(c for _, c in counts)
        self.clock = max(self.clock, at)
        return at

    def settle(self, clock: float) -> None:
        """Apply every change up to ``clock``."""
        while self.events and self.events[0][0] <= clock:
            self._advance()

    def next_change(self, clock: float) -> float:
        """Move to the next time after ``clock`` at which use changes, and apply all changes then."""
        clock = max(clock, self._advance())
        self.settle(clock)
        return clock

    def free(self) -> np.ndarray:
        return np.maximum(self.total - self.busy, 0)

    def used_by(self, user: str) -> int:
        return self.by_user[user]

    def hold_world(self, world: OpenWorld, now: float) -> None:
        """Other users' holds of known types, from ``world.lookahead_s`` before their start (as admission
        counts them: a job started then would still run when the hold begins) to their expected end."""
        for hold in world.holds:
            if hold.gpu_type in self.types and hold.end_s > now:
                self.hold(max(hold.start_s - world.lookahead_s, now), hold.end_s, {hold.gpu_type: hold.count})

    def _probe(self) -> _Timeline:
        """A copy to look ahead in without consuming this timeline's events."""
        probe = _Timeline(self.types, self.total)
        probe.busy, probe.events, probe.sequence = self.busy.copy(), list(self.events), self.sequence
        return probe

    def earliest_total(self, clock: float, allowed: np.ndarray, count: int) -> float:
        """When ``count`` GPUs of the ``allowed`` types (a mask) are first free together from ``clock`` on, without
        consuming time; inf when they never are."""
        probe = self._probe()
        probe.settle(clock)
        while probe.free()[allowed].sum() < count:
            if not probe.events:
                return np.inf
            clock = probe.next_change(clock)
        return clock

    def earliest(self, clock: float, gpu_types: tuple[str, ...], count: int) -> tuple[float, str | None]:
        """When ``count`` GPUs of one of ``gpu_types`` are first free from ``clock`` on, without consuming time.

        Used for foreign jobs ahead of ours: each is placed at its own earliest fit, so one waiting for a
        busy type does not delay the others on the timeline.
        """
        probe = self._probe()
        known = [self.types.index(t) for t in gpu_types if t in self.types]
        probe.settle(clock)
        while True:
            free = probe.free()
            ok = [t for t in known if free[t] >= count]
            if ok:
                return clock, self.types[ok[0]]
            if not probe.events:
                return clock, None
            clock = probe.next_change(clock)


def _grow(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray, take: np.ndarray,
          inp: PlanningInput, room: int | None = None) -> np.ndarray:
    """Add GPUs to ``take`` one at a time while that shortens the run, within ``max_gpus`` and a cap's ``room``."""
    take = take.copy()
    left = free - take
    vec = np.array([rates.get(t, 0.0) for t in types])
    top = job.max_gpus if room is None else min(job.max_gpus, max(room, int(take.sum())))
    while take.sum() < top:
        options = [i for i in range(len(types)) if left[i] > 0 and vec[i] > 0]
        if not options:
            break
        i = max(options, key=lambda i: (vec[i], -i))
        now_t = run_seconds(job, float(vec @ take), int(take.sum()), inp.inventory.inter_node_gbps)
        after = take.copy()
        after[i] += 1
        if run_seconds(job, float(vec @ after), int(after.sum()), inp.inventory.inter_node_gbps) >= now_t:
            break
        take, left[i] = after, left[i] - 1
    return take
