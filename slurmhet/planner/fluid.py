"""The fluid makespan LP of a queue (pure): which GPU types each job should use when load sets the makespan.

When the queue's load, not its longest job, sets the makespan, how soon it drains depends on which jobs
run on which types over the whole run. Remaining-work order admits the short jobs first and lets them take
any free type, however slowly they run there; the long jobs that run well on slow GPUs wait, and at the
end the slow GPUs are left with jobs that crawl on them. On Gavel's minimize_makespan trace slurmhet's
K80-seconds ran at 0.30 of those jobs' best rate, Gavel's time-sharing at 0.40 (bench/README.md).

The LP, over the jobs present: ``x[j, t]`` the share of job j's remaining work done on type t, where
j runs as a gang of ``g[j, t]`` GPUs for ``s[j, t]`` seconds (its packed time there):

    min  F + eps x sum_jt x[j, t] g[j, t] s[j, t] / G
    s.t. sum_t x[j, t] >= 1                          (every job's work is done)
         sum_t x[j, t] s[j, t] <= F                  (a gang runs on one type at a time)
         sum_j x[j, t] g[j, t] s[j, t] <= C_t F      (a type's GPU-seconds)

with G the cluster's GPUs. ``eps`` picks, among the makespan-optimal fluid schedules, the one with the
least GPU-time: where a type has slack, a job is booked on its fastest type, not on whatever vertex the
solver returns (without it, under light load the booking is arbitrary).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import highspy
import numpy as np

from slurmhet.planner.solver import highs

#: A job is booked on a type when the LP does at least this share of its work there.
BOOKED_SHARE = 0.1
#: Weight of the schedule's GPU-time (per GPU of the cluster) against its makespan: a tie-break only.
TIEBREAK = 1e-3


@dataclass(frozen=True)
class FluidBooking:
    """The fluid makespan (seconds) and, per job, the types booked for it, fastest first."""

    makespan: float
    types: Mapping[str, tuple[str, ...]]


def fluid_booking(times: Mapping[str, Mapping[str, tuple[float, int]]],
                  capacity: Mapping[str, int]) -> FluidBooking | None:
    """Solve the LP above. ``times``: job -> {type: (packed seconds, GPUs)}; None when no job fits a type."""
    cells = [(job, t, seconds, gpus) for job, per_type in times.items() for t, (seconds, gpus) in per_type.items()
             if capacity.get(t, 0) >= gpus > 0 and seconds > 0]
    jobs = list(dict.fromkeys(job for job, *_ in cells))  # a job that fits no type is left out: the planner reports it
    if not jobs:
        return None
    types = sorted({t for _, t, _, _ in cells})
    n_cells, row_of = len(cells), {job: i for i, job in enumerate(jobs)}
    column = np.arange(n_cells, dtype=np.int32)
    job_row = np.array([row_of[job] for job, *_ in cells], dtype=np.int32)
    type_row = np.array([types.index(t) for _, t, _, _ in cells], dtype=np.int32)
    secs = np.array([seconds for *_, seconds, _ in cells])
    gpu_secs = secs * np.array([gpus for *_, gpus in cells], dtype=float)
    total_gpus = float(sum(capacity.get(t, 0) for t in types))
    f_col = n_cells
    model = highs()
    inf = highspy.kHighsInf
    model.addVars(n_cells + 1, np.zeros(n_cells + 1), np.full(n_cells + 1, inf))
    model.changeColsCost(n_cells + 1, np.arange(n_cells + 1, dtype=np.int32),
                         np.append(TIEBREAK * gpu_secs / total_gpus, 1.0))
    n_jobs = len(jobs)
    _add_rows(model, job_row, column, np.ones(n_cells), n_jobs, lower=1.0)  # work done
    _add_rows(model, job_row, column, -secs, n_jobs, lower=0.0, f_coef=np.ones(n_jobs), f_col=f_col)  # one type at a time
    _add_rows(model, type_row, column, -gpu_secs, len(types), lower=0.0,  # capacity
              f_coef=np.array([float(capacity[t]) for t in types]), f_col=f_col)
    model.run()
    if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = np.asarray(model.getSolution().col_value)
    booked: dict[str, list[tuple[float, str]]] = {job: [] for job in jobs}
    for (job, t, seconds, _), share in zip(cells, x[:n_cells]):
        if share >= BOOKED_SHARE:
            booked[job].append((seconds, t))
    return FluidBooking(float(x[f_col]), {job: tuple(t for _, t in sorted(b)) for job, b in booked.items()})


def greedy_makespan(times: Mapping[str, Mapping[str, tuple[float, int]]], capacity: Mapping[str, int]) -> float:
    """A fluid makespan some schedule reaches, so at least the LP's: each job whole on one type, longest
    first, on the type where the makespan grows least. Cheap (no LP): when it is already below a threshold,
    so is the LP's, and a caller that only asks "is it above?" skips the LP."""
    load = {t: 0.0 for t, c in capacity.items() if c > 0}
    makespan = 0.0
    for per_type in sorted(times.values(), key=lambda p: -min((s for s, _ in p.values()), default=0.0)):
        options = [(max(makespan, seconds, (load[t] + seconds * gpus) / capacity[t]), t, seconds * gpus)
                   for t, (seconds, gpus) in per_type.items() if t in load and capacity[t] >= gpus > 0]
        if not options:
            continue  # fits no type: the LP leaves it out as well
        makespan, t, gpu_seconds = min(options)
        load[t] += gpu_seconds
    return makespan


def _add_rows(model: highspy.Highs, rows: np.ndarray, columns: np.ndarray, values: np.ndarray, n_rows: int,
              lower: float, f_coef: np.ndarray | None = None, f_col: int = 0) -> None:
    """Rows ``lower <= f_coef[r] F + sum values`` over each row's cells, in one call (compressed rows)."""
    if f_coef is not None:
        rows = np.concatenate((rows, np.arange(n_rows, dtype=np.int32)))
        columns = np.concatenate((columns, np.full(n_rows, f_col, dtype=np.int32)))
        values = np.concatenate((values, f_coef))
    order = np.argsort(rows, kind="stable")
    starts = np.searchsorted(rows[order], np.arange(n_rows)).astype(np.int32)
    model.addRows(n_rows, np.full(n_rows, lower), np.full(n_rows, highspy.kHighsInf), len(order), starts,
                  columns[order].astype(np.int32), values[order])
