"""HAS, the heterogeneity-aware scheduler of seed 001 (section IV), implemented as written.

* Algorithm 1 enumerates the feasible solution categories Psi: every
  (K_1, ..., K_S) with K_i >= 1 and sum K_i = K, in the paper's odometer order
  (K_2 turns fastest; K_1 absorbs the rest). :func:`unrank_category` jumps to
  the r-th category directly, which JPS needs on large K.
* Algorithm 2 solves each category by a matching market: every job prefers
  its K_i most valuable workers; while a worker is wanted by several jobs its
  price rises by ``max(1, max_i (V_i - V_i^k))`` (eq. 22) and valuations become
  ``rho_ik - p_k`` (eq. 23). The category with the lowest average JCT (eq. 8)
  wins; shards follow eq. (12).

Like the paper, HAS uses every worker (constraint 8c). Categories that violate
a job's min/max GPUs or give it a type it may not use are skipped.
"""

from __future__ import annotations

import math
import time
from typing import Iterator

import numpy as np

from slurmhet.errors import InputError
from slurmhet.planner.model import Progress
from slurmhet.planner.problem import Problem

Slots = dict[tuple[int, int], int]


class PlannerTimeout(InputError):
    """A baseline ran past its time cap (the benchmark reports it as null with the cap)."""

    def __init__(self, policy: str, cap_s: float) -> None:
        super().__init__(f"{policy} ran past its {cap_s:g} s cap", place=f"policy {policy}",
                         hint="use a sampling policy (jps-*) or the default planner")
        self.cap_s = cap_s


def workers(problem: Problem) -> list[tuple[int, int]]:
    """The K workers as (node, type), node-major, so ties in the market keep a job on few nodes."""
    return [(n, t) for n in range(len(problem.nodes)) for t in range(len(problem.types))
            for _ in range(int(problem.capacity[n, t]))]


def category_count(jobs: int, gpus: int) -> int:
    """|Psi| = C(K-1, S-1) (stars and bars)."""
    return math.comb(gpus - 1, jobs - 1) if gpus >= jobs >= 1 else 0


def categories(jobs: int, gpus: int) -> Iterator[tuple[int, ...]]:
    """Algorithm 1, literally: start at (K-S+1, 1, ..., 1) and turn the odometer."""
    k = [gpus - jobs + 1] + [1] * (jobs - 1)
    seen_first = tuple(k)
    while True:
        yield tuple(k)
        if jobs == 1:
            return
        for i in range(1, jobs):  # K_2 turns fastest; a wrap to 1 carries into the next position
            cap = gpus - i - sum(k[i + 1:])  # eq. (15), 0-based position i is job i+1
            if k[i] < cap:
                k[i] += 1
                break
            k[i] = 1
        k[0] = gpus - sum(k[1:])
        if tuple(k) == seen_first:
            return


def unrank_category(rank: int, jobs: int, gpus: int) -> tuple[int, ...]:
    """The ``rank``-th category of Algorithm 1's order (0-based) without enumerating the ones before."""
    k = [0] * jobs
    remaining = gpus
    for i in range(jobs - 1, 0, -1):  # most significant digit is K_S
        value = 1
        while True:
            count = math.comb(remaining - value - 1, i - 1)  # ways to fill positions 0..i-1
            if rank < count:
                break
            rank -= count
            value += 1
        k[i] = value
        remaining -= value
    k[0] = remaining
    return tuple(k)


def _preferred(gamma: np.ndarray, sizes: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Preferred graph with multi-unit demand: per job, the workers it must have (valued above its
    K_i-th best value) and the ones tied at that value, among which it needs the rest."""
    out = []
    for i, size in enumerate(sizes):
        threshold = np.partition(gamma[i], -size)[-size]
        out.append((np.flatnonzero(gamma[i] > threshold + 1e-9), np.flatnonzero(np.abs(gamma[i] - threshold) <= 1e-9)))
    return out


def _match(prefer: list[tuple[np.ndarray, np.ndarray]], sizes: tuple[int, ...],
           count: int) -> tuple[np.ndarray, list[int], list[int]]:
    """Give every job its must-have workers and the rest from its tied ones (augmenting paths).

    Returns the owner per worker and, when that fails, the constricted set:
    the over-demanded workers and the jobs competing for them.
    """
    owner = np.full(count, -1)
    fixed = np.zeros(count, dtype=bool)
    clash: dict[int, set[int]] = {}
    for i, (must, _) in enumerate(prefer):
        for k in must:
            if fixed[k]:
                clash.setdefault(int(k), {int(owner[k])}).add(i)
            owner[k], fixed[k] = i, True
    if clash:
        workers_c = sorted(clash)
        return owner, workers_c, sorted(set().union(*clash.values()))
    held = [len(must) for must, _ in prefer]

    def augment(i: int, seen: set[int]) -> bool:
        for k in prefer[i][1]:
            if k in seen or fixed[k] or owner[k] == i:
                continue
            seen.add(int(k))
            if owner[k] < 0 or augment(int(owner[k]), seen):
                if owner[k] >= 0:
                    held[owner[k]] -= 1
                owner[k] = i
                held[i] += 1
                return True
        return False

    for i in range(len(sizes)):
        while held[i] < sizes[i] and augment(i, set()):
            pass
    short = [i for i in range(len(sizes)) if held[i] < sizes[i]]
    if not short:
        return owner, [], []
    jobs, workers_c, frontier = set(short), set(), list(short)
    while frontier:
        i = frontier.pop()
        for k in prefer[i][1]:
            if owner[k] != i and int(k) not in workers_c:
                workers_c.add(int(k))
                if owner[k] >= 0 and int(owner[k]) not in jobs:
                    jobs.add(int(owner[k]))
                    if not fixed[k]:
                        frontier.append(int(owner[k]))
    return owner, sorted(workers_c), sorted(jobs)


def _top(values: np.ndarray, size: int) -> float:
    return float(np.sort(values)[::-1][:size].sum())


def market(rho: np.ndarray, sizes: tuple[int, ...], deadline: tuple[str, float, float] | None = None) -> np.ndarray:
    """Algorithm 2, lines 2-15: the owner (job index) of each worker after the price process.

    ``deadline`` is (policy name, monotonic time, cap) and raises PlannerTimeout when passed.

    The preferred graph keeps ties (as in the matching markets of Easley and
    Kleinberg that the paper builds on); with strict top-K_i lists two jobs
    that both want the cheaper of two equal workers raise prices forever.
    """
    jobs, count = rho.shape
    prices = np.zeros(count)
    gamma = rho.astype(float).copy()
    while True:
        if deadline and time.monotonic() > deadline[1]:
            raise PlannerTimeout(deadline[0], deadline[2])
        prefer = _preferred(gamma, sizes)
        owner, constricted, competing = _match(prefer, sizes, count)
        if not constricted:
            return owner
        wants = {i: set(prefer[i][0]) | set(prefer[i][1]) for i in competing}
        contested = [k for k in constricted if sum(k in w for w in wants.values()) > 1]
        k = contested[0] if contested else constricted[0]
        loss = max((_top(gamma[i], sizes[i]) - _top(np.delete(gamma[i], k), sizes[i])
                    for i in competing if k in wants[i]), default=0.0)
        if loss > 1.0:
            prices[k] += loss  # eq. (22)
            gamma[:, k] = rho[:, k] - prices[k]  # eq. (23)
            continue
        # Equal workers make eq. (22)'s loss zero and its unit steps crawl (thousands of rounds per
        # category); raise the whole constricted set at once until some competing job's preferred
        # graph changes (at least one unit): Easley and Kleinberg's rule, batched.
        inside = np.zeros(count, dtype=bool)
        inside[constricted] = True
        step = np.inf
        for i in competing:
            mine = np.zeros(count, dtype=bool)
            mine[np.concatenate(prefer[i])] = True
            outside = gamma[i][~mine & ~inside]
            if outside.size and (mine & inside).any():
                step = min(step, float(gamma[i][mine & inside].min() - outside.max()))
        step = max(1.0, step if np.isfinite(step) else 1.0)
        prices[inside] += step
        gamma[:, inside] = rho[:, inside] - prices[inside]


def category_slots(problem: Problem, sizes: tuple[int, ...], order: list[int], gpus: list[tuple[int, int]],
                   deadline: tuple[str, float, float] | None = None) -> list[Slots] | None:
    """Solve one category (``sizes[p]`` workers for job ``order[p]``); None if it breaks a job's limits."""
    for p, j in enumerate(order):
        if not problem.lo[j] <= sizes[p] <= problem.hi[j]:
            return None
    rho = np.array([[problem.rates[j, t] for _, t in gpus] for j in order])
    owner = market(rho, sizes, deadline)
    slots: list[Slots] = [dict() for _ in problem.jobs]
    for (n, t), p in zip(gpus, owner):
        j = order[p]
        if not problem.allowed[j, t]:
            return None
        slots[j][(n, t)] = slots[j].get((n, t), 0) + 1
    return slots


def total_cost(problem: Problem, slots: list[Slots]) -> float:
    return sum(problem.alloc_cost(j, s) for j, s in enumerate(slots))


def category_space(problem: Problem, policy: str) -> tuple[list[tuple[int, int]], int, int]:
    """The workers, job count and |Psi| that HAS and JPS enumerate; both need a GPU for every job."""
    gpus = workers(problem)
    jobs = len(problem.jobs)
    total = category_count(jobs, len(gpus))
    if total == 0:
        raise InputError(f"{policy.upper()} needs at least one GPU per job ({len(gpus)} GPUs, {jobs} jobs)",
                         place=f"policy {policy}", hint="use the default planner, which lets jobs wait")
    return gpus, jobs, total


def has(problem: Problem, progress: Progress | None = None, cap_s: float = 60.0) -> list[Slots]:
    """HAS over every category of Psi; raises PlannerTimeout past ``cap_s`` seconds."""
    gpus, jobs, total = category_space(problem, "has")
    deadline = ("has", time.monotonic() + cap_s, cap_s)
    order = list(range(jobs))
    best: tuple[float, list[Slots]] | None = None
    for done, sizes in enumerate(categories(jobs, len(gpus))):
        if time.monotonic() > deadline[1]:  # also while skipping categories that break GPU limits
            raise PlannerTimeout("has", cap_s)
        slots = category_slots(problem, sizes, order, gpus, deadline)
        if slots is not None:
            value = total_cost(problem, slots)
            if best is None or value < best[0]:
                best = (value, slots)
        if progress and done % 64 == 0:
            progress(done, total, "has: categories")
    if best is None:
        raise InputError("no category of Psi respects the jobs' GPU limits", place="policy has",
                         hint="HAS uses every GPU; relax max_gpus or use the default planner")
    return best[1]
