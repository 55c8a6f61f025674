"""Optimus and Optimus-LB, the greedy baselines of seed 001 section VI-A.

Optimus gives every job one worker, then repeatedly adds one worker to the job
whose JCT drops most, until no addition helps. It splits data equally among a
job's workers (no load balancing), so a job runs at the pace of its slowest
GPU: ``K * min_k rho_ik`` samples/s. Optimus-LB is the same greedy with
proportional workload assignment (eqs. 11-12). Both take, for the chosen type,
a free GPU on a node the job already uses when there is one (locality), else
on the node with the most free GPUs of that type.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from slurmhet.planner.model import Progress
from slurmhet.planner.problem import Problem

Slots = dict[tuple[int, int], int]


def run_cost(problem: Problem, j: int, slots: Slots, proportional: bool) -> float:
    """Weighted run time of job ``j`` on ``slots`` under equal or proportional sharding."""
    x = np.zeros(len(problem.types), dtype=int)
    for (_, t), c in slots.items():
        x[t] += c
    k = int(x.sum())
    if k == 0:
        return float("inf")
    rate = float(problem.rates[j] @ x) if proportional else k * float(problem.rates[j][x > 0].min())
    single = len({n for (n, _) in slots}) <= 1
    return problem.jobs[j].weight * problem.run_time(j, rate, k, single)


def _candidate(problem: Problem, j: int, slots: Slots, free: np.ndarray, t: int) -> int | None:
    used = sorted({n for (n, tt) in slots if free[n, t] > 0})
    if used:
        return used[0]
    nodes = np.flatnonzero(free[:, t] > 0)
    return int(min(nodes, key=lambda n: (-free[n, t], n))) if len(nodes) else None


def optimus(problem: Problem, progress: Progress | None = None, *, proportional: bool = False) -> list[Slots]:
    free = problem.capacity.copy()
    slots: list[Slots] = [dict() for _ in problem.jobs]
    for j in range(len(problem.jobs)):
        for _ in range(int(problem.lo[j])):
            types = [t for t in np.flatnonzero(problem.allowed[j]) if free[:, t].sum() > 0]
            t = int(max(types, key=lambda t: (problem.rates[j, t], -t)))
            n = _candidate(problem, j, slots[j], free, t)
            assert n is not None
            free[n, t] -= 1
            slots[j][(n, t)] = slots[j].get((n, t), 0) + 1
    steps = 0
    while True:
        best = (0.0, -1, -1, -1)
        for j in range(len(problem.jobs)):
            if sum(slots[j].values()) >= problem.hi[j]:
                continue
            now = run_cost(problem, j, slots[j], proportional)
            for t in np.flatnonzero(problem.allowed[j]):
                n = _candidate(problem, j, slots[j], free, int(t))
                if n is None:
                    continue
                trial = dict(slots[j])
                trial[(n, int(t))] = trial.get((n, int(t)), 0) + 1
                gain = now - run_cost(problem, j, trial, proportional)
                if gain > best[0]:
                    best = (gain, j, n, int(t))
        if best[1] < 0:
            break
        _, j, n, t = best
        free[n, t] -= 1
        slots[j][(n, t)] = slots[j].get((n, t), 0) + 1
        steps += 1
        if progress and steps % 32 == 0:
            progress(steps, int(problem.capacity.sum()), "optimus: adding workers")
    return slots


#: Optimus with proportional workload assignment (eqs. 11-12).
optimus_lb = partial(optimus, proportional=True)
