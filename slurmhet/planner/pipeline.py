"""What every policy shares around its allocator: admission, validation and plan assembly.

A policy is an *allocator* (``Problem -> per-job node slots``) wrapped by
:func:`make_policy`. The wrapper

1. resolves throughputs (clear errors, flagged priors) and refuses infeasible requests;
2. keeps running jobs where they are when ``pin_running``;
3. admits pending jobs in weighted-shortest-predicted-JCT order (Hare's idea:
   priority first, then run time on the job's minimum GPUs over its weight)
   while their minimum GPU counts fit; the rest wait;
4. runs the allocator on the admitted jobs and checks its answer (capacity,
   min/max, allowed types) so that no policy can return an impossible plan;
5. co-locates waiting single-GPU jobs that allow it (seed 002) and predicts
   when the other waiting jobs start by list-scheduling them in the same order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.planner import colocation
from slurmhet.planner.model import (
    Allocation, JobPlan, Plan, PlanJob, PlanningInput, Progress, allocation_run_seconds, effective_rate, epoch_seconds,
    job_rates, link_of, run_seconds, shard_weights,
)
from slurmhet.planner.problem import Problem

Slots = dict[tuple[int, int], int]
Allocator = Callable[[Problem, Progress | None], list[Slots]]
Policy = Callable[..., Plan]


def make_policy(name: str, allocator: Allocator, proportional: bool = True) -> Policy:
    """Wrap an allocator into a planner ``(PlanningInput, progress=None) -> Plan``.

    ``proportional=False`` predicts with equal shards (Optimus splits data evenly).
    """

    def policy(inp: PlanningInput, progress: Progress | None = None) -> Plan:
        return plan_with(name, allocator, inp, progress, proportional)

    policy.__name__ = f"plan_{name.replace('-', '_')}"
    policy.__doc__ = f"Plan with the {name!r} policy."
    return policy


def wspt_key(job: PlanJob, rates: dict[str, float], inter_gbps: float) -> tuple[float, float, float, str]:
    """Priority first, then predicted run time on ``min_gpus`` of the fastest type per unit weight."""
    best = max(rates.values())
    alone = run_seconds(job, best * job.min_gpus, job.min_gpus, inter_gbps)
    return (-job.priority, alone / job.weight, job.submitted_at, job.id)


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


def build_problem(inp: PlanningInput) -> Problem:
    """The Problem a policy would see: admitted jobs on the GPUs not held by pinned running jobs."""
    return _prepare(inp)[0]


def _prepare(inp: PlanningInput) -> tuple[Problem, _Context]:
    inventory = inp.inventory.usable()
    types = inventory.gpu_types
    nodes = tuple(n.name for n in inventory.nodes)
    capacity = np.array([[n.gpus.get(t, 0) for t in types] for n in inventory.nodes], dtype=int).reshape(len(nodes), len(types))
    rates: dict[str, dict[str, float]] = {}
    priors: dict[str, tuple[str, ...]] = {}
    for job in inp.jobs:
        rates[job.id], priors[job.id] = job_rates(job, inp.throughput, types)
        reachable = int(sum(capacity[:, types.index(t)].sum() for t in rates[job.id]))
        if job.min_gpus > reachable:
            raise InputError(f"job {job.id!r}: min_gpus {job.min_gpus} exceeds the {reachable} GPUs of its allowed types",
                             place=f"{job.id}.gpus.min", hint=f"lower gpus.min to {reachable} or allow more types")
    pinned = [j for j in inp.jobs if inp.pin_running and j.current is not None]
    for job in pinned:
        for node, gpu_type, count in job.current.slots:  # type: ignore[union-attr]
            if node not in nodes or gpu_type not in types:
                raise InputError(f"job {job.id!r} runs on {node}:{gpu_type}, which the inventory lacks",
                                 place=f"{job.id}.current", hint="refresh the inventory before planning")
            capacity[nodes.index(node), types.index(gpu_type)] -= count
    if (capacity < 0).any():
        raise InputError("running jobs hold more GPUs than the inventory has", place="inventory",
                         hint="refresh the inventory before planning")
    pending = sorted((j for j in inp.jobs if j not in pinned),
                     key=lambda j: wspt_key(j, rates[j.id], inventory.inter_node_gbps))
    free = capacity.sum(axis=0)
    admitted, waiting = [], []
    for job in pending:
        take = _min_counts(job, rates[job.id], types, free)
        if take is None:
            waiting.append(job)
        else:
            free -= take
            admitted.append(job)
    matrix = np.array([[rates[j.id].get(t, 0.0) for t in types] for j in admitted]).reshape(len(admitted), len(types))
    problem = Problem(tuple(admitted), types, nodes, capacity, matrix, inventory.intra_node_gbps,
                      inventory.inter_node_gbps, inp.seed, preemptive=not inp.pin_running,
                      move_penalty=inp.move_penalty)
    return problem, _Context(inventory, types, rates, priors, pinned, admitted, waiting)


def plan_with(name: str, allocator: Allocator, inp: PlanningInput, progress: Progress | None,
              proportional: bool = True) -> Plan:
    problem, ctx = _prepare(inp)
    inventory, types, rates, priors = ctx.inventory, ctx.types, ctx.rates, ctx.priors
    pinned, admitted, waiting = ctx.pinned, ctx.admitted, ctx.waiting
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
    groups = colocation.colocate(
        hosts=[plans[j.id] for j in pinned + admitted if plans[j.id].allocation and plans[j.id].allocation.gpus == 1],
        jobs={j.id: j for j in inp.jobs}, candidates=waiting, table=inp.throughput, inventory=inventory,
        settings=inp.colocation,
    )
    for group in groups:
        for job_id, plan in colocation.apply_group(group, plans, {j.id: j for j in inp.jobs}, order, inp.throughput,
                                                             inventory.inter_node_gbps).items():
            if job_id not in plans:
                order += 1
            plans[job_id] = plan
    still = [j for j in waiting if j.id not in plans]
    for plan in _list_schedule(still, plans, rates, priors, capacity_total(inventory, types), types, inp, order):
        plans[plan.job_id] = plan
    return Plan(name, tuple(plans[j.id] for j in inp.jobs), inp.now)


def capacity_total(inventory: Inventory, types: tuple[str, ...]) -> np.ndarray:
    return np.array([sum(n.gpus.get(t, 0) for n in inventory.nodes) for t in types], dtype=int)


def _min_counts(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray) -> np.ndarray | None:
    """``min_gpus`` GPUs from the free pool, fastest allowed types first; None when they do not fit."""
    take = np.zeros(len(types), dtype=int)
    need = job.min_gpus
    for t in sorted(rates, key=lambda t: (-rates[t], t)):
        i = types.index(t)
        got = min(need, int(free[i]))
        take[i] += got
        need -= got
    return take if need == 0 else None


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
                   inp: PlanningInput, order: int) -> list[JobPlan]:
    """Predict start times of waiting jobs: in order, each starts once its GPUs are free (no backfilling).

    GPUs are counted by type only; the job gets the fastest allowed free GPUs,
    one at a time while that shortens its run (the node placement is decided
    when it actually starts, at a later replan).
    """
    # A heap of (finish, sequence, GPUs by type): the sequence number keeps equal finish times in insertion order.
    events = [(p.finish_s, n, p.allocation.by_type()) for n, p in enumerate(plans.values()) if p.allocation]
    heapq.heapify(events)
    sequence = len(plans)
    busy = np.zeros(len(types), dtype=int)
    for _, _, by_type in events:
        for t, c in by_type.items():
            busy[types.index(t)] += c
    clock, out = inp.now, []
    for job in waiting:
        take = None
        while True:
            take = _min_counts(job, rates[job.id], types, total - busy)
            if take is not None or not events:
                break
            finish, _, by_type = heapq.heappop(events)
            clock = max(clock, finish)
            for t, c in by_type.items():
                busy[types.index(t)] -= c
        if take is None:
            raise AssertionError(f"job {job.id!r} can never start")  # excluded by the min_gpus check above
        take = _grow(job, rates[job.id], types, total - busy, take, inp)
        counts = {("(at start)", types[i]): int(c) for i, c in enumerate(take) if c}
        plan = _job_plan(job, Allocation.of(counts), rates[job.id], inp, order, priors[job.id], start=clock)
        plan = JobPlan(**{**plan.__dict__, "allocation": None, "shard_weights": (),
                          "wait_reason": f"waits for {job.min_gpus} GPU(s) of {', '.join(sorted(rates[job.id]))}; "
                                         f"predicted start after {clock - inp.now:.0f} s (WSPT order)"})
        out.append(plan)
        order += 1
        busy += take
        heapq.heappush(events, (plan.finish_s, sequence, {types[i]: int(c) for i, c in enumerate(take) if c}))
        sequence += 1
    return out


def _grow(job: PlanJob, rates: dict[str, float], types: tuple[str, ...], free: np.ndarray, take: np.ndarray,
          inp: PlanningInput) -> np.ndarray:
    take = take.copy()
    left = free - take
    vec = np.array([rates.get(t, 0.0) for t in types])
    while take.sum() < job.max_gpus:
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
