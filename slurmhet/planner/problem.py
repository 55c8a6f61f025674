"""The numeric view planners optimise over, and node packing.

GPUs of one type are interchangeable, so a job's run time depends only on its
count vector ``x`` (GPUs per type) and on whether all its ranks sit on one node
(the bottleneck link of eq. 5). :class:`Problem` holds, for the jobs to place
now, their rate matrix ``rates[j, t]`` and the free capacity per node and type.

The objective depends on whether the plan is final for the jobs it starts:
- kept (``preemptive=False``, a live cluster where a started job stays put): the
  weighted sum of predicted run times, all starting now;
- revised at the next decision (``preemptive=True``, the plan may move or pause
  running jobs): the weighted progress now, ``sum_j w_j (1 / T*_j)^a T*_j / T_j(x_j)``
  (maximised): each job's share of its best rate (``T*_j / T_j``), weighted by
  ``w_j`` and by how little work it has left (``T*_j``: its run time on its fastest
  type), to the power ``a = SRPT_EXPONENT``. Run times overstate what an allocation
  costs here: when a short job finishes, the long one inherits its GPUs.
  ``a = 1`` is ``sum_j w_j / T_j``: for related GPUs the fastest GPUs go to the jobs
  with the least work left, SRPT-FM (Gonzalez 1977, optimal for Q|pmtn|sum C_j),
  whatever each job gains from them. ``a = 0`` is weighted normalised throughput:
  a GPU type goes to the job whose share of its best rate it raises most
  (comparative advantage, as Gavel's policies spend GPUs). Admission already runs
  the smallest jobs first, so the type choice among admitted jobs leans to the
  second (0.25; bench/README.md has both ends measured). Ties still go to the
  job with less work left. Jobs with a priority (critical ones) outrank every
  other job, as in admission, so they keep their fastest GPUs.
  A running job whose counts change loses ``move_penalty`` of its term (the restart
  it pays before the next decision), so the plan moves a job only when that pays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slurmhet.planner.model import Allocation, PlanJob

#: Preemptive objective: how far a job's remaining time ranks it against its share of its best rate (module
#: doc). On Gavel's traces 0-0.5 beat 1 on every avg JCT and on minimize_makespan's makespan; 0 loses the
#: weighted JCT of seed 000's elastic jobs, whose GPU counts only remaining time can rank. With admission by
#: GPU-time, 0.5 left generated 1 job/h and scale-10k's 2,048 x 1,024 plan behind 0.25 (bench/README.md).
SRPT_EXPONENT = 0.25


@dataclass
class Problem:
    """Jobs to place now on the free GPUs. Arrays: ``rates`` J x T, ``capacity`` N x T."""

    jobs: tuple[PlanJob, ...]
    types: tuple[str, ...]
    nodes: tuple[str, ...]
    capacity: np.ndarray
    rates: np.ndarray
    intra_gbps: float
    inter_gbps: float
    seed: int = 0
    #: The plan is revised at the next decision: maximise weighted progress (module doc) instead of minimising
    #: ``sum w_j T_j``.
    preemptive: bool = False
    #: Preemptive only: a running job whose counts change keeps ``1 - move_penalty`` of its progress term.
    move_penalty: float = 0.0

    def __post_init__(self) -> None:
        self.lo = np.array([j.min_gpus for j in self.jobs], dtype=int)
        self.hi = np.array([min(j.max_gpus, int(self.capacity.sum())) for j in self.jobs], dtype=int)
        self.allowed = self.rates > 0
        self.type_capacity = self.capacity.sum(axis=0)
        self._weights = np.array([j.weight for j in self.jobs])
        self._work = np.array([j.samples_remaining for j in self.jobs])
        self._comm = np.array([j.syncs_remaining * 2.0 * j.model_size_mb / 1000.0 for j in self.jobs])
        self._startup_list = [j.startup_s for j in self.jobs]
        # plain-Python copies for the hot path (small vectors are slower in numpy)
        self._lo, self._hi = self.lo.tolist(), self.hi.tolist()
        self._weight_list, self._work_list, self._comm_list = self._weights.tolist(), self._work.tolist(), self._comm.tolist()
        self._rate_rows = [tuple(float(v) for v in row) for row in self.rates]
        self._allowed_rows = [tuple(bool(v) for v in row) for row in self.allowed]
        rows = {tuple(int(v) for v in row) for row in self.capacity}
        self._node_rows = [r for r in rows if not any(o != r and all(a >= b for a, b in zip(o, r)) for o in rows)]
        self._fits: dict[tuple[int, ...], bool] = {}
        #: Preemptive objective: ``T*_j`` (run time on its minimum GPUs of its fastest type, one node) and
        #: ``w_j (1 / T*_j)^a`` over the largest such index, so a job's term is a dimensionless share of its
        #: best rate; priority jobs get 1 + priority and outrank the others.
        self._best_time = [self.run_time(j, max(r) * lo, lo, True) for j, (r, lo) in
                           enumerate(zip(self._rate_rows, self._lo))] if self.preemptive else []
        index = [w * t ** -SRPT_EXPONENT for w, t in zip(self._weight_list, self._best_time)]
        top = max(index, default=0.0) or 1.0
        self._index = [1.0 + job.priority if job.priority > 0 else v / top for v, job in zip(index, self.jobs)]
        #: Running jobs' current counts, for the move penalty (None: not running here, or no penalty).
        self._current = [self._held(job.current) if self.preemptive and self.move_penalty > 0 else None
                         for job in self.jobs]

    def _held(self, current: Allocation | None) -> tuple[int, ...] | None:
        if current is None or any(t not in self.types for t in current.by_type()):
            return None
        return tuple(int(v) for v in self.counts(current))

    @property
    def size(self) -> tuple[int, int]:
        return len(self.jobs), len(self.types)

    def fits_one_node(self, x: np.ndarray | tuple[int, ...]) -> bool:
        """Could some node hold all of ``x`` (ignoring other jobs)?"""
        key = x if isinstance(x, tuple) else tuple(int(v) for v in x)
        found = self._fits.get(key)
        if found is None:
            found = self._fits[key] = any(all(c >= v for c, v in zip(row, key)) for row in self._node_rows)
        return found

    def run_time(self, j: int, rate_sum: float, workers: int, single: bool) -> float:
        """Eq. (7) for job ``j`` after its start-up, as ``model.run_seconds``; ``single`` picks the intra-node link."""
        if workers <= 0 or rate_sum <= 0:
            return float("inf")
        comm = 0.0
        if workers > 1 and self._comm_list[j] > 0:
            link = self.intra_gbps if single else self.inter_gbps
            comm = self._comm_list[j] * (workers - 1) / (workers * link)
        return self._startup_list[j] + self._work_list[j] / rate_sum + comm

    def cost(self, j: int, x: np.ndarray | tuple[int, ...], single: bool) -> float:
        """Job ``j``'s term of the objective on count vector ``x``; inf when outside its limits."""
        if not isinstance(x, tuple):
            x = tuple(int(v) for v in x)
        k = sum(x)
        if k < self._lo[j] or k > self._hi[j] or min(x) < 0:
            return float("inf")
        rate = 0.0
        for v, r, ok in zip(x, self._rate_rows[j], self._allowed_rows[j]):
            if v:
                if not ok:
                    return float("inf")
                rate += v * r
        seconds = self.run_time(j, rate, k, single)
        if self.preemptive:
            # A move pays a checkpoint-restart: that share of the time to the next decision makes no progress.
            kept = 1.0 - self.move_penalty if self._current[j] not in (None, x) else 1.0
            return -kept * self.progress(j, seconds)
        return self._weight_list[j] * seconds

    def progress(self, j: int, seconds: float) -> float:
        """Preemptive objective: job ``j``'s term (to maximise) when its remaining run would take ``seconds``."""
        return self._index[j] * self._best_time[j] / seconds

    def alloc_cost(self, j: int, slots: dict[tuple[int, int], int]) -> float:
        """Weighted run time of an actual node placement (``(node, type) -> count``)."""
        x = np.zeros(len(self.types), dtype=int)
        for (_, t), c in slots.items():
            x[t] += c
        return self.cost(j, x, len({n for (n, _), c in slots.items() if c > 0}) <= 1)

    def to_allocation(self, slots: dict[tuple[int, int], int]) -> Allocation:
        return Allocation.of({(self.nodes[n], self.types[t]): c for (n, t), c in slots.items()})

    def counts(self, allocation: Allocation) -> np.ndarray:
        x = np.zeros(len(self.types), dtype=int)
        for t, c in allocation.by_type().items():
            x[self.types.index(t)] += c
        return x


def pack(problem: Problem, counts: list[np.ndarray], benefit: list[float],
         crossing: np.ndarray | None = None) -> tuple[list[dict[tuple[int, int], int]], list[int]]:
    """Place count vectors on nodes; returns per-job ``(node, type) -> count`` and the jobs that wanted one node but got several.

    Multi-GPU jobs that can sit on one node go first, largest single-node
    benefit first, best fit (least capacity left on the node) so that big holes
    stay open; then single-GPU jobs, best fit; then the rest spread over the
    fewest nodes (see :func:`spread_fill`). ``crossing`` counts the spread jobs
    already on each node (kept running ones).
    """
    free = problem.capacity.copy()
    crossing = np.zeros(len(free), dtype=int) if crossing is None else crossing.copy()
    slots: list[dict[tuple[int, int], int]] = [dict() for _ in counts]
    wanted_single, spread = [], []
    multi = [j for j, x in enumerate(counts) if x.sum() > 1]
    ones = [j for j, x in enumerate(counts) if x.sum() == 1]
    for j in sorted(multi, key=lambda j: (-benefit[j], -int(counts[j].sum()), j)):
        x = counts[j]
        ok = np.all(free >= x, axis=1)
        if benefit[j] > 0 and ok.any():
            left = np.where(ok, (free - x).sum(axis=1), np.iinfo(np.int64).max)
            n = int(np.argmin(left))
            free[n] -= x
            slots[j] = {(n, t): int(c) for t, c in enumerate(x) if c > 0}
        else:
            if benefit[j] > 0:
                wanted_single.append(j)
            spread.append(j)
    for j in ones:
        t = int(np.argmax(counts[j]))
        col = np.where(free[:, t] > 0, free.sum(axis=1), np.iinfo(np.int64).max)
        n = int(np.argmin(col))
        free[n, t] -= 1
        slots[j] = {(n, t): 1}
    for j in spread:
        spread_fill(free, counts[j], slots[j], crossing)
        mark_crossing(crossing, slots[j])
    return slots, wanted_single


def mark_crossing(crossing: np.ndarray, slots: dict[tuple[int, int], int]) -> None:
    """Count a job on every node it uses when it uses several (its all-reduce crosses their links)."""
    nodes = {n for (n, _), c in slots.items() if c > 0}
    if len(nodes) > 1:
        for n in nodes:
            crossing[n] += 1


def spread_fill(free: np.ndarray, x: np.ndarray, slots: dict[tuple[int, int], int],
                crossing: np.ndarray | None = None) -> None:
    """Take ``x`` from ``free`` over the fewest nodes: nodes the job already uses, then the fullest ones.

    Contention-aware (seed 004, eq. 6): when several nodes could each take all that is
    left, the one fewest spread jobs cross gets it, since spread jobs on one node share
    its link; that costs no extra node.
    """
    for t, need in enumerate(x):
        need = int(need)
        while need > 0:
            used = {n for (n, _) in slots}
            candidates = np.flatnonzero(free[:, t] > 0)
            whole = candidates[free[candidates, t] >= need]
            if crossing is not None and len(whole) and not used.intersection(candidates.tolist()):
                n = int(min(whole, key=lambda n: (crossing[n], -free[n, t], n)))
            else:
                n = int(min(candidates, key=lambda n: (n not in used, -free[n, t], n)))
            take = min(need, int(free[n, t]))
            free[n, t] -= take
            slots[(n, t)] = slots.get((n, t), 0) + take
            need -= take
