"""A lower bound on the optimal weighted run time, for instances too big to solve exactly.

Lagrangian relaxation of the per-type capacity constraints with prices
``lam_t >= 0``:

    L(lam) = sum_j min_x [ c_j(x) + lam . x ] - lam . C

where x ranges over job j's integer count vectors (min/max GPUs, allowed types)
and c_j(x) is its run time with the *best* link x could have (intra-node if
some node can hold x). Node packing is relaxed, so every L(lam) is a valid
lower bound on the optimum of the job model. The inner minimum is exact
(enumeration, vectorised); the outer maximum over lam uses Kelley's cutting
planes (a small LP solved by HiGHS), stopping when the LP's upper estimate and
the best L(lam) agree. The bound is the best L(lam) seen, so stopping early
only makes it weaker, never invalid.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np

from slurmhet.errors import InputError
from slurmhet.planner.problem import Problem
from slurmhet.planner.solver import highs

#: Refuse to enumerate more count vectors than this in total.
MAX_VECTORS = 3_000_000


@dataclass(frozen=True)
class Bound:
    value: float
    iterations: int
    gap: float
    prices: tuple[float, ...]


def _vectors(problem: Problem, j: int) -> tuple[np.ndarray, np.ndarray]:
    allowed = np.flatnonzero(problem.allowed[j])
    hi, lo = int(problem.hi[j]), int(problem.lo[j])
    grids = np.meshgrid(*[np.arange(0, min(int(problem.type_capacity[t]), hi) + 1) for t in allowed], indexing="ij")
    flat = np.stack([g.ravel() for g in grids], axis=1)
    k = flat.sum(axis=1)
    flat = flat[(k >= lo) & (k <= hi)]
    x = np.zeros((len(flat), len(problem.types)), dtype=int)
    x[:, allowed] = flat
    k = x.sum(axis=1)
    rate = x @ problem.rates[j]
    fits = np.zeros(len(x), dtype=bool)
    for row in problem.capacity:
        fits |= np.all(x <= row, axis=1)
    job = problem.jobs[j]
    link = np.where(fits, problem.intra_gbps, problem.inter_gbps)
    comm = job.syncs_remaining * 2.0 * (k - 1) * (job.model_size_mb / 1000.0) / (link * np.maximum(k, 1))
    cost = job.weight * (job.startup_s + job.samples_remaining / rate + comm)
    return x, cost


def lower_bound(problem: Problem, max_iterations: int = 200, tolerance: float = 1e-7) -> Bound:
    """The Lagrangian bound on sum_j w_j * run_time_j (all jobs start now)."""
    jobs, types = problem.size
    data = []
    for j in range(jobs):
        data.append(_vectors(problem, j))
        if sum(len(c) for _, c in data) > MAX_VECTORS:
            raise InputError(f"bound would enumerate more than {MAX_VECTORS} count vectors", place="bound",
                             hint="set max_gpus on the jobs")
    capacity = problem.type_capacity.astype(float)

    def evaluate(lam: np.ndarray) -> tuple[float, list[int]]:
        picks, total = [], -float(lam @ capacity)
        for x, cost in data:
            value = cost + x @ lam
            o = int(np.argmin(value))
            picks.append(o)
            total += float(value[o])
        return total, picks

    lp = highs()
    inf = highspy.kHighsInf
    ceiling = max(float(c.min()) for _, c in data) * 10 + 1.0  # prices above any job's run time change nothing
    lp.addVars(types, np.zeros(types), np.full(types, ceiling))
    lp.addVars(jobs, np.full(jobs, -inf), np.full(jobs, inf))
    lp.changeColsCost(types + jobs, np.arange(types + jobs, dtype=np.int32),
                      np.concatenate([-capacity, np.ones(jobs)]))
    lp.changeObjectiveSense(highspy.ObjSense.kMaximize)

    def cut(j: int, o: int) -> None:  # theta_j - x.lam <= c_jo
        x, cost = data[j]
        idx = np.concatenate([np.arange(types), [types + j]]).astype(np.int32)
        lp.addRow(-inf, float(cost[o]), types + 1, idx, np.concatenate([-x[o].astype(float), [1.0]]))

    lam = np.zeros(types)
    best_value, best_lam = -np.inf, lam
    gap = np.inf
    iteration = 0
    for iteration in range(1, max_iterations + 1):
        value, picks = evaluate(lam)
        if value > best_value:
            best_value, best_lam = value, lam
        for j, o in enumerate(picks):
            cut(j, o)
        lp.run()
        upper = lp.getInfo().objective_function_value
        gap = (upper - best_value) / max(abs(best_value), 1.0)
        if gap <= tolerance:
            break
        lam = np.array(lp.getSolution().col_value[:types])
    return Bound(best_value, iteration, gap, tuple(float(v) for v in best_lam))
