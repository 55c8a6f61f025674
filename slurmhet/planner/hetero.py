"""slurmhet's default planner: type-level local search, then node packing.

Why it beats HAS/JPS: GPUs of one type are interchangeable, so the decision is
an integer count ``x[j, t]`` per (job, type), not a worker-to-job matching over
C(K-1, S-1) categories. The objective is separable over jobs
(``sum_j w_j * JCT_j(x_j)``), and each job's compute term ``|Pi| / (rho_j . x_j)``
is convex in the throughput it receives, so

1. a greedy start hands out GPUs by marginal gain per GPU (bulk steps of
   several GPUs let a job jump over the communication step between one node
   and several);
2. exchange moves (take/release, transfer between two jobs, trade g GPUs of
   one type for h of another between two jobs) run until no move improves; thanks to separability a
   move's effect is the sum of two per-job deltas, so the best move is found
   with a few small array reductions;
3. a packer places the counts on nodes, putting jobs that gain from a single
   node (comm-heavy ones first) on one node by best fit. Jobs that wanted one
   node but did not fit are re-costed with the inter-node link and the search
   resumes; the best packed plan wins.

Everything is deterministic. On the seed-001 cases it matches the exact MILP
(see bench/README.md) in milliseconds.
"""

from __future__ import annotations

import numpy as np

from slurmhet.planner.model import Progress
from slurmhet.planner.problem import Problem, pack

#: Bulk sizes tried by the greedy start and by the exchange moves.
BULK = (1, 2, 3, 4, 5, 6, 8)
#: Sizes of the two sides of a trade (job i gives g of type t for h of type u; job j the reverse).
TRADE = (1, 2, 3)
#: Re-search rounds after packing failures.
PACK_ROUNDS = 4
_TOL = 1e-9


class _Search:
    """Count vectors, free GPUs per type, and cached per-job costs and move deltas."""

    def __init__(self, problem: Problem) -> None:
        self.p = problem
        jobs, types = problem.size
        self.x = np.zeros((jobs, types), dtype=int)
        self.free = problem.type_capacity.astype(int).copy()
        self.single_ok = np.ones(jobs, dtype=bool)
        self._memo: list[dict[tuple[int, ...], float]] = [dict() for _ in range(jobs)]
        self.plus = np.full((jobs, types, len(BULK)), np.inf)
        self.minus = np.full((jobs, types, len(BULK)), np.inf)
        self.trade = np.full((jobs, types, len(TRADE), types, len(TRADE)), np.inf)

    def cost(self, j: int, x: tuple[int, ...]) -> float:
        memo = self._memo[j]
        value = memo.get(x)
        if value is None:
            value = memo[x] = self.p.cost(j, x, bool(self.single_ok[j]) and self.p.fits_one_node(x))
        return value

    def forbid_single(self, j: int) -> None:
        self.single_ok[j] = False
        self._memo[j].clear()

    def objective(self) -> float:
        return sum(self.cost(j, tuple(self.x[j].tolist())) for j in range(len(self.x)))

    # -------------------------------------------------------------- greedy start

    def give_minimum(self) -> None:
        """``min_gpus`` for every job, fastest allowed types first (the admission rule, so it fits)."""
        for j in range(len(self.x)):
            need = int(self.p.lo[j])
            for t in sorted(np.flatnonzero(self.p.allowed[j]), key=lambda t: (-self.p.rates[j, t], t)):
                got = min(need, int(self.free[t]))
                self.x[j, t] += got
                self.free[t] -= got
                need -= got
            if need:
                raise AssertionError(f"admission let in job {self.p.jobs[j].id!r} without room for its minimum")

    def _best_grow(self, j: int) -> tuple[float, int, int]:
        x = self.x[j].tolist()
        base = self.cost(j, tuple(x))
        best = (0.0, -1, 0)
        room = int(self.p.hi[j]) - sum(x)
        for t in np.flatnonzero(self.p.allowed[j]):
            for g in BULK:
                if g > self.free[t] or g > room:
                    break
                y = list(x)
                y[t] += g
                score = (base - self.cost(j, tuple(y))) / g
                if score > best[0] + _TOL * base:
                    best = (score, int(t), g)
        return best

    def grow(self) -> None:
        moves = [self._best_grow(j) for j in range(len(self.x))]
        while True:
            j = max(range(len(moves)), key=lambda i: (moves[i][0], -i), default=None)
            if j is None or moves[j][0] <= 0:
                return
            _, t, g = moves[j]
            self.x[j, t] += g
            self.free[t] -= g
            for i, (score, ti, gi) in enumerate(moves):
                if i == j or (score > 0 and ti == t and gi > self.free[t]):
                    moves[i] = self._best_grow(i)

    # -------------------------------------------------------------- exchange moves

    def refresh(self, j: int) -> None:
        x = self.x[j].tolist()
        base = self.cost(j, tuple(x))
        types = len(x)
        inf = np.inf
        for t in range(types):
            for b, g in enumerate(BULK):
                y = list(x)
                y[t] += g
                self.plus[j, t, b] = self.cost(j, tuple(y)) - base
                y[t] -= 2 * g
                self.minus[j, t, b] = self.cost(j, tuple(y)) - base if y[t] >= 0 else inf
            for a, g in enumerate(TRADE):
                for u in range(types):
                    for b, h in enumerate(TRADE):
                        if u != t and x[t] >= g:
                            y = list(x)
                            y[t] -= g
                            y[u] += h
                            self.trade[j, t, a, u, b] = self.cost(j, tuple(y)) - base
                        else:
                            self.trade[j, t, a, u, b] = inf

    def best_move(self) -> tuple[float, tuple]:
        """The most improving single move, found with whole-array reductions (costs are separable)."""
        jobs = len(self.x)
        best: tuple[float, tuple] = (0.0, ())
        bulk = np.array(BULK)
        take = np.where(bulk[None, None, :] <= self.free[None, :, None], self.plus, np.inf)
        for kind, delta in (("take", take), ("release", self.minus)):
            j, t, b = np.unravel_index(int(np.argmin(delta)), delta.shape)
            if delta[j, t, b] < best[0]:
                best = (float(delta[j, t, b]), (kind, int(j), int(t), BULK[b]))
        if jobs < 2:
            return best
        diagonal = np.eye(jobs, dtype=bool)
        pair = self.minus[:, None] + self.plus[None, :]  # i gives g of t to j
        pair[diagonal] = np.inf
        i, j, t, b = np.unravel_index(int(np.argmin(pair)), pair.shape)
        if pair[i, j, t, b] < best[0]:
            best = (float(pair[i, j, t, b]), ("move", int(i), int(j), int(t), BULK[b]))
        back = np.transpose(self.trade, (0, 3, 4, 1, 2))  # j gives h of u, receives g of t
        pair = self.trade[:, None] + back[None, :]
        pair[diagonal] = np.inf
        i, j, t, a, u, b = np.unravel_index(int(np.argmin(pair)), pair.shape)
        if pair[i, j, t, a, u, b] < best[0]:
            best = (float(pair[i, j, t, a, u, b]), ("trade", int(i), int(j), int(t), TRADE[a], int(u), TRADE[b]))
        return best

    def exchange(self, limit: int = 10_000) -> None:
        for j in range(len(self.x)):
            self.refresh(j)
        tolerance = _TOL * max(self.objective(), 1.0)
        for _ in range(limit):
            delta, move = self.best_move()
            if not move or delta > -tolerance:
                return
            kind, *args = move
            if kind == "take":
                j, t, g = args
                self.x[j, t] += g
                self.free[t] -= g
                changed = [j]
            elif kind == "release":
                j, t, g = args
                self.x[j, t] -= g
                self.free[t] += g
                changed = [j]
            elif kind == "move":
                i, j, t, g = args
                self.x[i, t] -= g
                self.x[j, t] += g
                changed = [i, j]
            else:
                i, j, t, g, u, h = args
                self.x[i, t] -= g
                self.x[i, u] += h
                self.x[j, u] -= h
                self.x[j, t] += g
                changed = [i, j]
            for j in changed:
                self.refresh(j)


def allocate(problem: Problem, progress: Progress | None = None) -> list[dict[tuple[int, int], int]]:
    """slurmhet's allocator: greedy + exchange at type level, packing, re-search after packing failures."""
    search = _Search(problem)
    search.give_minimum()
    search.grow()
    best: tuple[float, list[dict[tuple[int, int], int]]] | None = None
    for round_ in range(PACK_ROUNDS):
        if progress:
            progress(round_, PACK_ROUNDS, "slurmhet: exchange + packing")
        search.exchange()
        counts = [search.x[j].copy() for j in range(len(search.x))]
        benefit = []
        for j, x in enumerate(counts):
            wants = bool(search.single_ok[j]) and problem.fits_one_node(x)
            benefit.append(problem.cost(j, x, False) - problem.cost(j, x, True) if wants else 0.0)
        slots, failed = pack(problem, counts, benefit)
        value = sum(problem.alloc_cost(j, s) for j, s in enumerate(slots))
        if best is None or value < best[0] - _TOL * value:
            best = (value, slots)
        if not failed:
            break
        for j in failed:
            search.forbid_single(j)
    if progress:
        progress(PACK_ROUNDS, PACK_ROUNDS, "slurmhet: done")
    assert best is not None
    return best[1]
