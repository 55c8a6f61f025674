"""Gavel's policies as its own simulator runs them (stanford-futuredata/gavel, scheduler/scheduler.py).

``gavel-mmf`` (max_min_fairness_perf), ``gavel-fifo`` (fifo_perf) and ``gavel-mtd``
(min_total_duration_perf) share Gavel's round mechanism, :class:`GavelRounds`; each
policy only computes the allocation ``X[job][type]`` (the share of time the job should
run on that type). What the mechanism reproduces, with the function of Gavel's that
decides it (bench/README.md "Gavel, faithfully" lists what slurmhet did differently before):

- The allocation is recomputed only when the set of jobs changed (an arrival or a
  completion) *and* at least ``RESET_INTERVAL_S`` (1,920 s) passed since the last
  recompute, or while the last recompute was at time 0 (``_update_priorities``).
  A job that arrived since has no allocation and does not run until then.
- Every recompute resets the time accounting (``_reset_time_run_so_far``): each job's
  time on each type restarts at half a round (180 s) and each type's total at the sum
  of those; deficits grow by ``X * elapsed - received``.
- Each round, job j's priority on type w is ``X[j][w] / (time_j,w / time_w)`` since the
  last reset, ``X * 1e9`` while type w has no time yet, 0 without allocation or
  throughput. The types are visited in a fixed order (v100, p100, k80: fastest first);
  on each, the jobs sorted by (priority, deficit, X) descending take whole gangs of
  their scale factor while GPUs of that type are left (``_schedule_jobs_on_workers_helper``).
  A job without allocation can be picked there and holds its GPUs idle for the round,
  as in Gavel; ``fifo_perf`` skips jobs of priority 0 instead.
- After a round, every job it ran is credited the time it ran (to its end when it finished
  mid-round) on its type, and the type the same (``_done_callback``).
- A job keeps its GPUs when it stays on the same type and they are free; placement
  never changes a job's throughput in Gavel (its multi-GPU throughputs are the
  consolidated ones), which the simulator matches with one server per GPU type.
"""

from __future__ import annotations

from typing import Mapping

import highspy
import numpy as np

from slurmhet.planner.solver import highs
from slurmhet.policies.base import ClusterView, Free, JobState, Placement, TimePolicy

#: ``minimum_time_between_allocation_resets`` of Gavel's Scheduler (not a flag of its driver).
RESET_INTERVAL_S = 1920.0
#: Gavel's fixed visiting order of worker types; other types follow, fastest first.
GAVEL_TYPE_ORDER = ("v100", "p100", "k80")

Allocation = dict[int, dict[str, float]]


class GavelRounds(TimePolicy):
    """Gavel's round mechanism around an allocation (see the module docstring)."""

    round_based = True
    round_ends_when_done = True
    idle_patience_s = 2 * RESET_INTERVAL_S
    #: fifo_perf does not run jobs whose priority is 0 (``self._policy.name.startswith("FIFO")``).
    skip_zero_priority = False

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self._allocation: Allocation = {}
        self._last_reset: float | None = None
        self._changed = False
        self._known: set[int] = set()
        self._job_time: dict[int, dict[str, float]] = {}
        self._type_time: dict[str, float] = {}
        self._deficit: dict[int, dict[str, float]] = {}
        #: The round being run: its start and, per job run, (type, remaining steps, steps/s) at its start.
        self._round: tuple[float, dict[int, tuple[str, float, float]]] | None = None

    def allocate(self, view: ClusterView, jobs: list[JobState]) -> Allocation:
        """X[job][type] for the active jobs (the policy's own computation)."""
        raise NotImplementedError

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        types = _type_order(view)
        self._credit_round(view)
        self._track_jobs(view, types)
        if self._changed and (self._last_reset is None or self._last_reset == 0.0
                              or view.now - self._last_reset >= RESET_INTERVAL_S):
            self._reset(view, types)
        chosen = self._choose(view, types)
        out = self._place(view, chosen)
        by_id = {j.job_id: j for j in view.jobs}
        self._round = (view.now, {j: (t, by_id[j].remaining, view.rates.type_rate(by_id[j].job_type, by_id[j].gpus, t))
                                  for j, t in chosen.items() if j in out})
        return out

    def _credit_round(self, view: ClusterView) -> None:
        """Credit each job of the last round the seconds it ran (to its finish if it finished), and its type."""
        if self._round is None:
            return
        start, ran = self._round
        elapsed = view.now - start
        for job_id, (gpu_type, remaining, rate) in ran.items():
            seconds = min(elapsed, remaining / rate) if rate > 0 else elapsed
            if job_id in self._job_time:
                self._job_time[job_id][gpu_type] += seconds
                self._type_time[gpu_type] = self._type_time.get(gpu_type, 0.0) + seconds

    def _track_jobs(self, view: ClusterView, types: list[str]) -> None:
        active = {j.job_id for j in view.jobs}
        for job_id in sorted(active - self._known):  # add_job: half a round of credit on every type
            self._job_time[job_id] = {t: self.round_s / 2 for t in types}
            self._deficit[job_id] = {t: 0.0 for t in types}
        for job_id in self._known - active:  # _remove_job
            self._job_time.pop(job_id, None)
            self._deficit.pop(job_id, None)
            self._allocation.pop(job_id, None)
        self._changed |= active != self._known
        self._known = active

    def _reset(self, view: ClusterView, types: list[str]) -> None:
        """_reset_time_run_so_far, then a new allocation."""
        elapsed = view.now - (self._last_reset or 0.0)
        half = (self.round_s or 0.0) / 2
        for t in types:
            self._type_time[t] = 0.0
            for job_id, times in self._job_time.items():
                received = times[t] - half
                should = self._allocation.get(job_id, {}).get(t, 0.0) * elapsed
                self._deficit[job_id][t] += should - received
                times[t] = half
                self._type_time[t] += half
        self._allocation = self.allocate(view, sorted(view.jobs, key=lambda j: j.job_id))
        self._last_reset = view.now
        self._changed = False

    def priority(self, view: ClusterView, job: JobState, gpu_type: str) -> float:
        if job.job_id not in self._allocation:
            return 0.0
        x = self._allocation[job.job_id].get(gpu_type, 0.0)
        if x == 0.0 or view.rates.type_rate(job.job_type, job.gpus, gpu_type) <= 0:
            return 0.0
        total = self._type_time.get(gpu_type, 0.0)
        fraction = self._job_time[job.job_id][gpu_type] / total if total > 0 else 0.0
        return x / fraction if fraction > 0 else x * 1e9

    def _choose(self, view: ClusterView, types: list[str]) -> dict[int, str]:
        """The jobs to run this round and their type, walking the per-type queues in type order."""
        left = view.type_capacity()
        jobs = sorted(view.jobs, key=lambda j: j.job_id)
        queue: list[tuple[float, float, float, JobState, str]] = []
        for t in types:  # each type's entries sorted on their own, then concatenated (Gavel's global queue is off)
            entries = [(self.priority(view, j, t), self._deficit[j.job_id][t],
                        self._allocation.get(j.job_id, {}).get(t, 0.0), j, t) for j in jobs]
            queue += sorted(entries, key=lambda e: e[:3], reverse=True)
        chosen: dict[int, str] = {}
        picked: set[int] = set()
        for prio, _, _, job, t in queue:
            if left.get(t, 0) == 0 or job.job_id in picked:
                continue
            if view.rates.type_rate(job.job_type, job.gpus, t) <= 0:
                continue
            if self.skip_zero_priority and prio <= 0.0:
                continue
            if job.gpus > left[t]:
                continue
            left[t] -= job.gpus
            picked.add(job.job_id)
            if job.job_id in self._allocation:  # a job picked without allocation holds its GPUs idle, as in Gavel
                chosen[job.job_id] = t
        return chosen

    @staticmethod
    def _place(view: ClusterView, chosen: Mapping[int, str]) -> dict[int, Placement]:
        """Gangs for the chosen jobs: a job staying on its type keeps its GPUs when they are free, larger jobs first."""
        by_id = {j.job_id: j for j in view.jobs}
        free: Free = view.free()
        out: dict[int, Placement] = {}
        order = sorted(chosen, key=lambda j: (-by_id[j].gpus, j))
        for job_id in order:
            job = by_id[job_id]
            same = job.running and all(t == chosen[job_id] for g in job.placement for _, t, _ in g)
            if same and free.fits(job.placement):
                free.take(job.placement)
                out[job_id] = job.placement
        for job_id in order:
            if job_id in out:
                continue
            gang = free.gang_of_type(chosen[job_id], by_id[job_id].gpus)
            if gang:
                free.take((gang,))
                out[job_id] = (gang,)
        return out


def _type_order(view: ClusterView) -> list[str]:
    """Gavel's order (v100, p100, k80); types it does not know after them, by mean per-GPU rate, fastest first."""
    present = view.gpu_types()
    known = [t for t in GAVEL_TYPE_ORDER if t in present]

    def speed(t: str) -> float:
        rates = [view.rates.type_rate(j.job_type, j.gpus, t) / j.gpus for j in view.jobs]
        return sum(rates) / len(rates) if rates else 0.0

    return known + sorted((t for t in present if t not in known), key=lambda t: (-speed(t), t))


def _interior_lp(n_cols: int, cost: np.ndarray, rows: list[tuple[float, float, list[int], list[float]]],
                 upper: np.ndarray, maximize: bool) -> np.ndarray | None:
    """Solve an LP with HiGHS's interior-point method and no crossover; None unless optimal.

    Gavel solves its LPs with ECOS, an interior-point solver: its answer lies inside the optimal
    face (many tiny positive shares, no exact zeros), and which jobs run each round depends on
    that. A simplex vertex has the same objective but puts the slack on other jobs.
    """
    model = highs()
    model.setOptionValue("solver", "ipm")
    model.setOptionValue("run_crossover", "off")
    model.addVars(n_cols, np.zeros(n_cols), upper)
    model.changeColsCost(n_cols, np.arange(n_cols, dtype=np.int32), cost)
    if maximize:
        model.changeObjectiveSense(highspy.ObjSense.kMaximize)
    for lower, up, cols, values in rows:
        model.addRow(lower, up, len(cols), np.array(cols, dtype=np.int32), np.array(values, dtype=float))
    model.run()
    if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return np.clip(np.array(model.getSolution().col_value), 0.0, None)


def _base_rows(jobs: list[JobState], types: list[str], capacity: Mapping[str, int]) -> list[
        tuple[float, float, list[int], list[float]]]:
    """Gavel's base constraints on x[j, t] (column j * len(types) + t): sum_t x <= 1, sum_j k_j x <= GPUs of t."""
    m = len(types)
    rows = [(0.0, 1.0, [j * m + t for t in range(m)], [1.0] * m) for j in range(len(jobs))]
    rows += [(0.0, float(capacity[types[t]]), [j * m + t for j in range(len(jobs))], [float(job.gpus) for job in jobs])
             for t in range(m)]
    return rows


def _as_allocation(jobs: list[JobState], types: list[str], x: np.ndarray | None) -> Allocation:
    m = len(types)
    if x is None:
        return {}
    return {job.job_id: {t: min(1.0, float(x[j * m + k])) for k, t in enumerate(types)} for j, job in enumerate(jobs)}


def _lp_inputs(view: ClusterView, jobs: list[JobState]) -> tuple[dict[str, int], list[str], np.ndarray]:
    """GPUs per type, the types in Gavel's column order (alphabetical), and T[j, t]: the job's throughput on its
    scale factor's GPUs of type t (the table's consolidated cell)."""
    capacity = view.type_capacity()
    types = sorted(capacity)
    rates = [[view.rates.type_rate(j.job_type, j.gpus, t) for t in types] for j in jobs]
    return capacity, types, np.array(rates).reshape(len(jobs), len(types))


class GavelMaxMinFairness(GavelRounds):
    """``max_min_fairness_perf``: maximise min_j k_j sum_t T[j, t] x[j, t] / (w_j P_j), with P_j the job's
    throughput on the cluster's type shares (x = GPUs of t / all GPUs; Gavel's ``ProportionalPolicy``)."""

    key = "gavel-mmf"

    def allocate(self, view: ClusterView, jobs: list[JobState]) -> Allocation:
        if not jobs:
            return {}
        capacity, types, T = _lp_inputs(view, jobs)
        share = np.array([capacity[t] for t in types], dtype=float) / sum(capacity.values())
        proportional = T @ share
        m, n = len(types), len(jobs)
        floor = n * m  # the column of the min
        rows = _base_rows(jobs, types, capacity)
        for j, job in enumerate(jobs):
            scale = job.gpus / (job.weight * proportional[j]) if proportional[j] > 0 else 0.0
            rows.append((0.0, highspy.kHighsInf, [j * m + t for t in range(m)] + [floor],
                         [scale * T[j, t] for t in range(m)] + [-1.0]))
        upper = np.append(np.where(T.ravel() > 0, 1.0, 0.0), highspy.kHighsInf)
        cost = np.zeros(n * m + 1)
        cost[floor] = 1.0
        x = _interior_lp(n * m + 1, cost, rows, upper, maximize=True)
        return _as_allocation(jobs, types, x)


class GavelFifo(GavelRounds):
    """``fifo_perf``: at every recompute, jobs in arrival (id) order each take all their time on the fastest
    type with room for their gang; the first job that fits nowhere stops the queue."""

    key = "gavel-fifo"
    skip_zero_priority = True

    def allocate(self, view: ClusterView, jobs: list[JobState]) -> Allocation:
        capacity = view.type_capacity()
        types = sorted(capacity)
        available = dict(capacity)
        out: Allocation = {}
        for job in jobs:
            fits = [t for t in types if available[t] >= job.gpus]
            if not fits:
                break
            best = fits[0]
            for t in fits[1:]:  # strictly faster only: ties keep the alphabetically first type, as Gavel
                if view.rates.type_rate(job.job_type, job.gpus, t) > view.rates.type_rate(job.job_type, job.gpus, best):
                    best = t
            out[job.job_id] = {t: 1.0 if t == best else 0.0 for t in types}
            available[best] -= job.gpus
        return out


class GavelMinTotalDuration(GavelRounds):
    """``min_total_duration_perf``: the smallest horizon T (bisection on [100 s, 1e6 s] to 5%, widened tenfold
    while infeasible) for which every job's remaining steps fit: sum_t T[j, t] x[j, t] >= remaining_j / T."""

    key = "gavel-mtd"

    def allocate(self, view: ClusterView, jobs: list[JobState]) -> Allocation:
        if not jobs:
            return {}
        capacity, types, T = _lp_inputs(view, jobs)
        m, n = len(types), len(jobs)
        upper = np.where(T.ravel() > 0, 1.0, 0.0)
        base = _base_rows(jobs, types, capacity)

        def feasible(horizon: float) -> np.ndarray | None:
            rows = base + [(job.remaining / horizon, highspy.kHighsInf, [j * m + t for t in range(m)],
                            [T[j, t] for t in range(m)]) for j, job in enumerate(jobs)]
            return _interior_lp(n * m, np.zeros(n * m), rows, upper, maximize=True)

        low, high, best = 100.0, 1e6, None
        for _ in range(6):  # Gavel widens the range tenfold while nothing in it is feasible
            while 1.05 * low < high:
                mid = (low + high) / 2
                x = feasible(mid)
                if x is None:
                    low = mid
                else:
                    best, high = x, mid
            if best is not None:
                break
            low, high = high, high * 10
        return _as_allocation(jobs, types, best)
