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
   move's effect is the sum of two per-job deltas, so the best pair move is
   found from each side's two best jobs per (type, size) key: O(J) per key,
   not a J x J table (which took most of a 2,048-job decision);
3. a packer places the counts on nodes, putting jobs that gain from a single
   node (comm-heavy ones first) on one node by best fit. Jobs that wanted one
   node but did not fit are re-costed with the inter-node link and the search
   resumes; the best packed plan wins;
4. where every job's GPU count is fixed and the instance is small, the exact
   MILP (``planner.exact``) is solved too, and its packed plan wins when it
   is cheaper: the moves above change at most two jobs at a time, so a gang
   could not take GPUs that several jobs would have to leave at once.

Everything is deterministic. On the seed-001 cases it matches the exact MILP
(see bench/README.md) in milliseconds.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from slurmhet.planner.exact import all_options, solve_options
from slurmhet.planner.model import Progress
from slurmhet.planner.problem import Problem, mark_crossing, pack

#: Bulk sizes tried by the greedy start and by the exchange moves (ascending).
BULK = (1, 2, 3, 4, 5, 6, 8)
#: Sizes of the two sides of a trade (job i gives g of type t for h of type u; job j the reverse), ascending.
TRADE = (1, 2, 3)
#: Re-search rounds after packing failures.
PACK_ROUNDS = 4
_TOL = 1e-9
#: The exact MILP (:func:`_exact`) is tried up to this many binaries and kept only if proven optimal within
#: this many seconds. On Gavel's traces a decision has at most 252 (46 jobs) and solves in 23 ms or less.
#: scale-10k's 2,048 x 1,024 decision would have 14,583 (886 jobs): 1.3 s, three times the rest of the
#: decision, for a plan whose forecast is worse (bench/README.md); its larger sizes are turned away by the
#: estimate alone.
EXACT_OPTIONS = 2_000
EXACT_SECONDS = 1.0
_BULK = np.array(BULK)
#: Pair tables of up to this many cells (128 KiB of floats) are built whole: for a handful of jobs that is
#: cheaper than the column scans, whose numpy calls cost more than the table.
_TABLE_CELLS = 16_384


def best_pair(give: np.ndarray, take: np.ndarray, below: float, take_keys: np.ndarray | None = None,
              minima: tuple["ColumnMinima", "ColumnMinima"] | None = None) -> tuple[float, int, int, int] | None:
    """The best pair move ``(value, i, j, k)``: job ``i`` does ``give[i, k]``, job ``j != i`` does ``take[j, k]``.

    ``value`` is the smallest ``give[i, k] + take[j, k]`` and ``(i, j, k)`` its
    first position in ``(i, j, k)`` order, exactly what ``argmin`` over the
    J x J x K table gives; None unless ``value < below``. ``take_keys`` reads
    column ``k`` of the taking side from column ``take_keys[k]`` of ``take``
    (a trade's partner does the reverse trade, so both sides are one array).
    Small tables are built whole; beyond that the columns are scanned in
    O(J K) instead of O(J^2 K) time and memory, or read from ``minima`` (the two
    sides' :class:`ColumnMinima`, kept up to date by the caller).
    """
    jobs, keys = give.shape
    if jobs * jobs * keys <= _TABLE_CELLS:
        return _pair_by_table(give, take if take_keys is None else take[:, take_keys], below)
    return _pair_by_columns(give, take, below, take_keys, minima)


def _pair_by_table(give: np.ndarray, take: np.ndarray, below: float) -> tuple[float, int, int, int] | None:
    """:func:`best_pair` by its definition: the whole J x J x K table, the diagonal (``i == j``) excluded."""
    jobs, keys = give.shape
    table = give[:, None, :] + take[None, :, :]
    table[np.arange(jobs), np.arange(jobs)] = np.inf
    flat = int(np.argmin(table))
    value = float(table.flat[flat])
    if not value < below:
        return None
    i, rest = divmod(flat, jobs * keys)
    j, k = divmod(rest, keys)
    return value, i, j, k


def _pair_by_columns(give: np.ndarray, take: np.ndarray, below: float, take_keys: np.ndarray | None,
                     minima: tuple["ColumnMinima", "ColumnMinima"] | None = None) -> tuple[float, int, int, int] | None:
    """Rounded addition is monotone, so column ``k``'s best pair joins the two sides' minima or, when one job
    holds both, a minimum with the other side's runner-up. Only the columns reaching the overall minimum are
    then scanned for the first ``i``, and for that ``i`` the first ``(j, k)``."""
    if minima is not None:
        give_row, give_low, give_other = minima[0].stats()
        take_row, take_low, take_other = minima[1].stats()
    else:
        give_row, give_low, give_other = stats = _two_smallest(give)
        take_row, take_low, take_other = stats if take is give else _two_smallest(take)
    if take_keys is not None:
        take_row, take_low, take_other = take_row[take_keys], take_low[take_keys], take_other[take_keys]
    per_key = np.minimum(give_low + np.where(give_row == take_row, take_other, take_low), give_other + take_low)
    value = float(per_key.min())
    if not value < below:
        return None
    i = len(give)
    for k in np.flatnonzero(per_key == value).tolist():
        i = _first_giver(give[:, k], value, int(give_row[k]), int(take_row[k]), float(take_low[k]),
                         float(take_other[k]), i)
    keys = np.flatnonzero(give[i] + np.where(take_row == i, take_other, take_low) == value)
    sums = give[i, keys] + take[:, keys if take_keys is None else take_keys[keys]]
    sums[i] = np.inf
    hits = sums == value
    j = int(np.argmax(hits.any(axis=1)))
    return value, i, j, int(keys[np.argmax(hits[j])])


def _first_minimum(delta: np.ndarray, usable: np.ndarray | None, minima: "ColumnMinima | None"
                   ) -> tuple[float, int, int] | None:
    """``(value, row, column)`` of ``delta``'s first minimum in row-major order, over the ``usable`` columns
    (all when None); None when nothing is finite. From the tracked column minima when given: each column's
    first minimum is its row's, so the first overall is the least ``(row, column)`` among the columns at the
    minimum, in O(K) instead of a scan of the J x K array at every move."""
    if minima is None:
        masked = delta if usable is None else np.where(usable.ravel()[None, :], delta, np.inf)
        row, column = divmod(int(np.argmin(masked)), delta.shape[1])
        value = float(masked[row, column])
    else:
        rows, low, _ = minima.stats()
        low = low if usable is None else np.where(usable.ravel(), low, np.inf)
        value = float(low.min())
        columns = np.flatnonzero(low == value)
        row = int(rows[columns].min())
        column = int(columns[rows[columns] == row][0])
    return (value, row, column) if np.isfinite(value) else None


def _first_giver(column: np.ndarray, value: float, first: int, taker: int, low: float, other: float,
                 limit: int) -> int:
    """The first row ``r < limit`` whose sum with its best partner, ``column[r] + (other if r == taker else
    low)``, is ``value``; ``limit`` if none. The column's first minimum (row ``first``) reaches ``value`` unless
    it is also the taker, so the scan up to it usually ends the search: one column read, where a scan of every
    row of every tied column (J x keys, each move) took most of a 10,000-job decision's pair search."""
    for lo, hi in ((0, min(first + 1, limit)), (first + 1, limit)):
        if lo >= hi:
            continue
        sums = column[lo:hi] + low
        if lo <= taker < hi:
            sums[taker - lo] = column[taker] + other
        hits = sums == value
        if hits.any():
            return lo + int(np.argmax(hits))
    return limit


def _two_smallest(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of ``a``: the first row holding the minimum, the minimum, and the minimum of the other rows."""
    column = np.arange(a.shape[1])
    row = np.argmin(a, axis=0)
    low = a[row, column]
    a[row, column] = np.inf  # masked in place and restored: a fresh J x K copy costs page faults on every call
    try:
        other = a.min(axis=0)
    finally:
        a[row, column] = low
    return row, low, other


class ColumnMinima:
    """Per column of a J x K array, what :func:`_two_smallest` computes, kept up to date as rows change.

    A move changes two jobs' rows; rescanning the whole array per move (8,192 x 144 cells for the trades)
    was most of a large decision. A changed row is compared with each column's minimum and runner-up; only
    the columns where it held one of them are rescanned.
    """

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        columns = np.arange(a.shape[1])
        self.row, self.low, self.other_row, self.other = self._scan(columns)

    def _scan(self, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        part = self.a[:, columns]
        index = np.arange(len(columns))
        row = np.argmin(part, axis=0)
        low = part[row, index]
        part[row, index] = np.inf  # a copy: the array itself is untouched
        other_row = np.argmin(part, axis=0)
        return row, low, other_row, part[other_row, index]

    def stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.row, self.low, self.other

    def update(self, r: int) -> None:
        """Row ``r`` of the array changed."""
        v = self.a[r]
        held = (self.row == r) | (self.other_row == r)
        first = ~held & ((v < self.low) | ((v == self.low) & (r < self.row)))
        second = ~held & ~first & (v < self.other)
        self.other_row[first], self.other[first] = self.row[first], self.low[first]
        self.row[first], self.low[first] = r, v[first]
        self.other_row[second], self.other[second] = r, v[second]
        columns = np.flatnonzero(held)
        if len(columns):
            self.row[columns], self.low[columns], self.other_row[columns], self.other[columns] = self._scan(columns)


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
        #: Column minima of the minus, plus and trade deltas during :meth:`exchange` (large searches only).
        self._minima: tuple[ColumnMinima, ...] = ()
        #: Flat trade key of the reverse trade: (t, g, u, h) -> (u, h, t, g).
        self._reverse = np.arange(self.trade[0].size).reshape(self.trade.shape[1:]).transpose(2, 3, 0, 1).ravel()

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
                if score > best[0] + _TOL * abs(base):
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
        """Recompute job ``j``'s move deltas after its counts changed.

        Moves that leave the job's GPU limits or allowed types stay ``inf``
        without a cost call (most of them when ``min_gpus == max_gpus``); the
        job holds GPUs of allowed types only, and the loops stop early because
        ``BULK`` and ``TRADE`` are ascending.
        """
        x = self.x[j].tolist()
        base = self.cost(j, tuple(x))
        total, lo, hi = sum(x), int(self.p.lo[j]), int(self.p.hi[j])
        allowed = np.flatnonzero(self.p.allowed[j]).tolist()
        self.plus[j] = np.inf
        self.minus[j] = np.inf
        self.trade[j] = np.inf
        for t in allowed:
            for b, g in enumerate(BULK):
                if total + g > hi:
                    break
                y = list(x)
                y[t] += g
                self.plus[j, t, b] = self.cost(j, tuple(y)) - base
            for b, g in enumerate(BULK):
                if g > x[t] or total - g < lo:
                    break
                y = list(x)
                y[t] -= g
                self.minus[j, t, b] = self.cost(j, tuple(y)) - base
            for a, g in enumerate(TRADE):
                if g > x[t]:
                    break
                for u in allowed:
                    if u == t:
                        continue
                    for b, h in enumerate(TRADE):
                        if total - g + h > hi:
                            break
                        if total - g + h >= lo:
                            y = list(x)
                            y[t] -= g
                            y[u] += h
                            self.trade[j, t, a, u, b] = self.cost(j, tuple(y)) - base

    def best_move(self) -> tuple[float, tuple]:
        """The most improving single move and its delta; ``(0.0, ())`` when none improves.

        Ties go to the first move in the order take, release, move, trade and,
        within a kind, to the smallest ``(i, j, type, size...)`` index, so the
        search is deterministic. Pair moves cost O(J) per (type, size) key via
        :func:`best_pair`.
        """
        best: tuple[float, tuple] = (0.0, ())
        jobs = len(self.plus)
        minima = self._minima
        fits = _BULK[None, :] <= self.free[:, None]  # a take needs the GPUs free
        for kind, delta, usable, tracked in (("take", self.plus, fits, minima[1] if minima else None),
                                             ("release", self.minus, None, minima[0] if minima else None)):
            found = _first_minimum(delta.reshape(jobs, -1), usable, tracked)
            if found is not None and found[0] < best[0]:
                t, b = np.unravel_index(found[2], delta.shape[1:])
                best = (found[0], (kind, found[1], int(t), BULK[b]))
        found = best_pair(self.minus.reshape(jobs, -1), self.plus.reshape(jobs, -1), best[0],  # i gives g of t to j
                          minima=(minima[0], minima[1]) if minima else None)
        if found:
            value, i, j, key = found
            t, b = np.unravel_index(key, self.plus.shape[1:])
            best = (value, ("move", i, j, int(t), BULK[b]))
        trade = self.trade.reshape(jobs, -1)  # i gives g of t for h of u; j does the reverse trade
        found = best_pair(trade, trade, best[0], self._reverse, minima=(minima[2], minima[2]) if minima else None)
        if found:
            value, i, j, key = found
            t, a, u, b = np.unravel_index(key, self.trade.shape[1:])
            best = (value, ("trade", i, j, int(t), TRADE[a], int(u), TRADE[b]))
        return best

    def exchange(self, limit: int = 10_000) -> None:
        for j in range(len(self.x)):
            self.refresh(j)
        jobs = len(self.x)
        large = jobs * jobs * self.trade[0].size > _TABLE_CELLS
        self._minima = tuple(ColumnMinima(a.reshape(jobs, -1)) for a in (self.minus, self.plus, self.trade)) \
            if large else ()
        tolerance = _TOL * max(abs(self.objective()), 1.0)
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
                for minima in self._minima:
                    minima.update(j)


def current_slots(problem: Problem, j: int) -> dict[tuple[int, int], int] | None:
    """Job ``j``'s current allocation as ``(node, type) -> count`` indices; None when it has none in ``problem``."""
    current = problem.jobs[j].current
    if current is None:
        return None
    slots: dict[tuple[int, int], int] = {}
    for node, gpu_type, count in current.slots:
        if node not in problem.nodes or gpu_type not in problem.types:
            return None
        key = (problem.nodes.index(node), problem.types.index(gpu_type))
        slots[key] = slots.get(key, 0) + count
    return slots


def pack_in_place(problem: Problem, counts: list[np.ndarray],
                  benefit: list[float]) -> tuple[list[dict[tuple[int, int], int]], list[int], float]:
    """:func:`pack`, keeping unpinned running jobs on their current slots where their counts are unchanged.

    Only jobs that do not want to leave a spread allocation for one node stay; the
    others are packed on the capacity left. The fresh packing wins only when it
    is strictly cheaper (e.g. a kept job blocked a node another job needed whole).
    Returns the slots, the jobs that wanted one node but did not get it, and the cost.
    """
    fresh, failed = pack(problem, counts, benefit)
    fresh_value = sum(problem.alloc_cost(j, s) for j, s in enumerate(fresh))
    free = problem.capacity.copy()
    kept: dict[int, dict[tuple[int, int], int]] = {}
    for j, x in enumerate(counts):
        slots = current_slots(problem, j)
        if not slots or (benefit[j] > 0 and len({n for n, _ in slots}) > 1):
            continue
        held = np.zeros_like(x)
        for (_, t), c in slots.items():
            held[t] += c
        if np.array_equal(held, x) and all(free[n, t] >= c for (n, t), c in slots.items()):
            for (n, t), c in slots.items():
                free[n, t] -= c
            kept[j] = slots
    if not kept:
        return fresh, failed, fresh_value
    rest = [np.zeros_like(x) if j in kept else x for j, x in enumerate(counts)]
    crossing = np.zeros(len(free), dtype=int)
    for slots in kept.values():
        mark_crossing(crossing, slots)
    placed, placed_failed = pack(replace(problem, capacity=free), rest, benefit, crossing)
    placed = [kept.get(j, s) for j, s in enumerate(placed)]
    value = sum(problem.alloc_cost(j, s) for j, s in enumerate(placed))
    if fresh_value < value - _TOL * abs(value):
        return fresh, failed, fresh_value
    return placed, placed_failed, value


def single_node_benefits(problem: Problem, counts: list[np.ndarray], single_ok: list[bool]) -> list[float]:
    """What each job gains from sitting on one node (0 when it may not or cannot): the packer's order."""
    return [problem.cost(j, x, False) - problem.cost(j, x, True) if ok and problem.fits_one_node(x) else 0.0
            for j, (x, ok) in enumerate(zip(counts, single_ok))]


def _exact(problem: Problem) -> tuple[float, list[dict[tuple[int, int], int]]] | None:
    """The exact MILP's counts (``planner.exact``), packed as the search's are, with their cost; None unless
    every job's GPU count is fixed and the MILP is small enough to prove optimal within ``EXACT_SECONDS``.

    With fixed counts a job's only choice is which types, so the options stay few: on Gavel's traces
    (3 types, gangs of 1-8) at most 252 in a decision. The exchange moves trade at most ``max(TRADE)``
    GPUs between two jobs, so a gang of 4 or 8 on slow GPUs could only reach fast ones if that many
    other jobs moved at once; on max_min_fairness the search stopped short of the optimum of one type
    per job in 51 of 156 decisions (up to 6%). Elastic jobs (``min_gpus < max_gpus``) multiply the
    options by every count and are left to the search (bench/README.md has what the MILP did to them).
    """
    if not len(problem.jobs) or not np.array_equal(problem.lo, problem.hi):
        return None
    options = all_options(problem, EXACT_OPTIONS)
    solved = solve_options(problem, options, EXACT_SECONDS) if options is not None else None
    if solved is None:
        return None
    counts = [x for x, _, _ in solved[1]]
    single_ok = [n is not None for _, n, _ in solved[1]]
    slots, _, value = pack_in_place(problem, counts, single_node_benefits(problem, counts, single_ok))
    return value, slots


def allocate(problem: Problem, progress: Progress | None = None) -> list[dict[tuple[int, int], int]]:
    """slurmhet's allocator: greedy + exchange at type level, packing, re-search after packing failures; the
    exact MILP's plan instead where it is small and cheaper (:func:`_exact`)."""
    search = _Search(problem)
    search.give_minimum()
    search.grow()
    best: tuple[float, list[dict[tuple[int, int], int]]] | None = None
    for round_ in range(PACK_ROUNDS):
        if progress:
            progress(round_, PACK_ROUNDS, "slurmhet: exchange + packing")
        search.exchange()
        counts = [search.x[j].copy() for j in range(len(search.x))]
        benefits = single_node_benefits(problem, counts, search.single_ok.tolist())
        slots, failed, value = pack_in_place(problem, counts, benefits)
        if best is None or value < best[0] - _TOL * abs(value):
            best = (value, slots)
        if not failed:
            break
        for j in failed:
            search.forbid_single(j)
    assert best is not None
    exact = _exact(problem)
    if exact is not None and exact[0] < best[0] - _TOL * abs(best[0]):
        best = exact
    if progress:
        progress(PACK_ROUNDS, PACK_ROUNDS, "slurmhet: done")
    return best[1]
