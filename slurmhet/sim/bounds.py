"""Lower bounds on a simulated instance's makespan, average JCT and weighted JCT.

A bound holds for every schedule the engine can run on the instance (the jobs with
their arrivals, steps and weights, the cluster's GPUs per type, the rate model), so
``metric / bound >= 1`` for every policy and the ratio says how far a policy is from
the best any scheduler could do. The engine's facts the proofs rest on:

(E1) A job holding GPUs ``G`` progresses at most ``sum_{i in G} u[j, type(i)]``
     worker-steps/s, where ``u[j, g] = 1 / tau_g`` is its per-GPU task rate at its
     requested scale (``RateModel.task_seconds``): barrier, proportional and relaxed
     (fewer GPUs than tasks) gangs all take at least ``k / sum 1/tau`` per iteration,
     communication, contention, restarts, start-up and consolidation only subtract.
(E2) A GPU serves one job, except a co-located pair of single-GPU jobs (the engine
     refuses a shared group with a member asking more than one GPU) on one GPU of type
     ``g`` running at the measured ``(r_a, r_b)``. The *gain* ``e[j, g] >= 1`` of a
     single-GPU job is the largest ``r_a / u[a, g] + r_b / u[b, g]`` over the pairs its job
     type ``a`` forms on ``g`` with the instance's single-GPU job types ``b`` (itself only
     when the instance has two such jobs); it is 1 for a multi-GPU job and when the run has
     no co-locating policy. ``q[j, g] = u[j, g] e[j, g]`` is its work per GPU-second: a pair
     sharing a GPU of type ``g`` for ``z`` seconds can be booked as
     ``y_a = r_a z / (u[a, g] e[a, g])`` and ``y_b = r_b z / (u[b, g] e[b, g])`` GPU-seconds,
     so ``y_a q[a, g] = r_a z`` and ``y_b q[b, g] = r_b z`` with
     ``y_a + y_b <= (r_a / u[a, g] + r_b / u[b, g]) z / min(e[a, g], e[b, g]) <= z``, both
     members' gains being at least their pair's (and each at most ``z``); a job alone on a GPU-second does at most
     ``u <= q`` on it; and a multi-GPU job never shares, so the GPU-seconds it holds are
     its own and each yields at most ``u[j, g] = q[j, g]``. Booked GPU-seconds so never
     exceed the GPUs' (nor, per job, the GPUs it holds). A co-located job's own rate is
     at most ``v[j, g] = max(u[j, g], its best measured co-located rate)``.
(E3) Without forking (``forks`` false, checked by the engine) a job holds at most ``k_j``
     GPUs at a time; with forking, any number.
(E4) A job's first start costs ``start_s`` without progress, on the GPUs it holds; a move or pause before any
     progress does not skip what is left of it, so a job works only after holding GPUs for ``start_s``.

Charging every job ``p_j = S_j / max_g q[j, g]`` GPU-seconds (its steps at the best work
per GPU-second it can get anywhere: ``u e`` for a single-GPU job, ``u`` for a
multi-GPU one) turns any schedule into a *pooled* one on a single machine of speed
``C`` = all GPUs, in which a job runs at most at rate ``rho_j C`` with
``rho_j = min(1, k_j / C)`` (``rho_j = 1`` with forking): by (E1)-(E2) the charged rate
of all jobs together never exceeds ``C`` (a shared GPU is charged
``r_a / max q_a + r_b / max q_b <= r_a / (u_a e_a) + r_b / (u_b e_b) <= 1``, a GPU one job
holds alone at most ``u / max q <= 1``, ``q = u`` for a multi-GPU job).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import highspy
import numpy as np

from slurmhet.planner.solver import highs
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import TraceJob

#: The makespan LP is solved for at most this many arrival thresholds (any subset is valid).
MAX_THRESHOLDS = 48
#: The interval-indexed JCT LP's grid: points growing geometrically by this factor, at most this many release
#: times (the others round down to a grid point, which only relaxes), ...
GRID_RATIO = 1.15
MAX_RELEASE_POINTS = 200
#: ... plus this many equal intervals up to the horizon (halved while the LP is too large).
GRID_INTERVALS = 80
#: The makespan LP prices co-location pair by pair up to this many pairs (beyond, by the gains).
MAX_PAIRS = 20_000
#: Rounds of tangent cuts at the interval LP's own solution (each valid), stopping once a round adds less
#: than this share to the bound.
CUT_ROUNDS = 4
CUT_GAIN = 1e-3
#: No LP above this many columns.
MAX_LP_COLUMNS = 150_000


@dataclass(frozen=True)
class InstanceBounds:
    """Valid lower bounds, in seconds, on the metrics ``sim.metrics`` reports."""

    makespan: float
    avg_jct: float
    weighted_jct: float

    def to_json(self) -> dict[str, float]:
        return {"avg_jct": round(self.avg_jct, 3), "makespan": round(self.makespan, 3),
                "weighted_jct": round(self.weighted_jct, 3)}

    def ratios(self, avg_jct: float, makespan: float, weighted_jct: float) -> dict[str, float | None]:
        """Metric over bound for each metric (None where the bound is 0)."""
        pairs = (("avg_jct", avg_jct, self.avg_jct), ("makespan", makespan, self.makespan),
                 ("weighted_jct", weighted_jct, self.weighted_jct))
        return {k: (round(v / b, 4) if b > 0 else None) for k, v, b in pairs}


@dataclass(frozen=True)
class _Instance:
    steps: np.ndarray     # S_j worker-steps
    gpus: np.ndarray      # k_j
    arrival: np.ndarray   # r_j
    weight: np.ndarray    # w_j
    u: np.ndarray         # per-GPU isolated rate [job, type]
    own: np.ndarray       # v[j, g]: best own rate per GPU, co-located included
    paired: np.ndarray    # rho[j, g]: a single-GPU job's best own rate sharing a GPU of type g (0: never shares)
    capacity: np.ndarray  # C_g
    gain: np.ndarray      # e[j, g]
    #: Co-locatable job pairs (a, b, g, r_a, r_b) whose measured rates beat sharing the GPU's time (None: too many).
    pairs: tuple[tuple[int, int, int, float, float], ...] | None = ()


def instance_bounds(jobs: Sequence[TraceJob], capacity: Mapping[str, int], rates: RateModel, *,
                    start_s: float = 0.0, forks: bool = False, colocates: bool = False) -> InstanceBounds:
    """Lower bounds for ``jobs`` (steps resolved) on ``capacity`` GPUs per type under ``rates``.

    ``forks``/``colocates``: whether any policy measured against the bound may fork a job
    into copies or co-locate two jobs on a GPU; the bound then allows it too (weaker).
    """
    inst = _instance(jobs, capacity, rates, colocates)
    if len(inst.steps) == 0:
        return InstanceBounds(0.0, 0.0, 0.0)
    running = _alone_seconds(inst, forks)
    alone = running + start_s
    pooled = inst.steps / _work(inst).max(axis=1)  # p_j, GPU-seconds
    total = float(inst.capacity.sum())
    rho = np.ones(len(pooled)) if forks else np.minimum(1.0, inst.gpus / total)
    first = float(inst.arrival.min())
    makespan = max(float((inst.arrival + alone).max()) - first, _fluid_makespan(inst, forks, start_s) - first)
    srpt = _srpt_completions(inst.arrival, pooled / total)
    unweighted_lp = _interval_lp(inst, alone, running, forks, np.ones(len(pooled)), makespan)
    jct_sum = max(float((srpt - inst.arrival).sum()), float(alone.sum()), unweighted_lp)
    busy = _wspt_mean_busy(inst.arrival, pooled / total, inst.weight)
    same_weights = bool(np.all(inst.weight == inst.weight[0]))
    weighted_lp = (unweighted_lp * float(inst.weight[0]) if same_weights
                   else _interval_lp(inst, alone, running, forks, inst.weight, makespan))
    weighted = max(float((inst.weight * (busy + pooled / (total * rho) / 2 - inst.arrival)).sum()),
                   float((inst.weight * alone).sum()), weighted_lp)
    return InstanceBounds(makespan, jct_sum / len(pooled), weighted)


def _instance(jobs: Sequence[TraceJob], capacity: Mapping[str, int], rates: RateModel, colocates: bool) -> _Instance:
    types = sorted(t for t, c in capacity.items() if c > 0)
    u = np.array([[rates.type_rate(j.job_type, j.gpus, t) / j.gpus for t in types] for j in jobs]).reshape(len(jobs),
                                                                                                          len(types))
    own = u.copy()
    paired = np.zeros(u.shape)
    gain = np.ones(u.shape)
    measured = _measured_pairs(jobs, types, rates) if colocates else {}
    best_gain: dict[tuple[str, int], float] = {}
    best_own: dict[tuple[str, int], float] = {}
    for (a, b, g), (ra, rb) in measured.items():
        pair = ra / rates.type_rate(a, 1, types[g]) + rb / rates.type_rate(b, 1, types[g])
        best_gain[(a, g)] = max(best_gain.get((a, g), 1.0), pair)
        best_own[(a, g)] = max(best_own.get((a, g), 0.0), ra)
    for ji, job in enumerate(jobs):
        for g in range(len(types)):
            if job.gpus == 1:
                gain[ji, g] = best_gain.get((job.job_type, g), 1.0)
                paired[ji, g] = best_own.get((job.job_type, g), 0.0)
                own[ji, g] = max(own[ji, g], paired[ji, g])
    return _Instance(
        steps=np.array([float(j.total_steps or 0.0) for j in jobs]), gpus=np.array([float(j.gpus) for j in jobs]),
        arrival=np.array([j.arrival for j in jobs], dtype=float),
        weight=np.array([j.weight for j in jobs], dtype=float),
        u=u, own=own, paired=paired, capacity=np.array([float(capacity[t]) for t in types]), gain=gain,
        pairs=_pairs(jobs, u, measured) if colocates else ())


def _work(inst: _Instance) -> np.ndarray:
    """``q[j, g] = u[j, g] e[j, g]``, the most of job ``j``'s isolated work one GPU-second of type ``g`` can be
    booked for (E2): the gain ``e`` is its best pair's on ``g`` for a single-GPU job, which may share the GPU,
    and 1 for a multi-GPU job, which never does."""
    return inst.u * inst.gain


def _measured_pairs(jobs: Sequence[TraceJob], types: list[str],
                    rates: RateModel) -> dict[tuple[str, str, int], tuple[float, float]]:
    """(job type a, job type b, type index) -> measured co-located rates, for single-GPU job types that run on
    the type alone: what both the gains and the pair-by-pair LP read. A type pairs with itself only where
    the instance has two single-GPU jobs of it."""
    counts = Counter(j.job_type for j in jobs if j.gpus == 1)
    out = {}
    for g, t in enumerate(types):
        runs = [a for a in sorted(counts) if rates.type_rate(a, 1, t) > 0]
        for a in runs:
            for b in runs:
                if a == b and counts[a] < 2:
                    continue
                pair = rates.colocated_rates((a, b), t)
                if pair:
                    out[(a, b, g)] = (float(pair[0]), float(pair[1]))
    return out


def _pairs(jobs: Sequence[TraceJob], u: np.ndarray, measured: Mapping[tuple[str, str, int], tuple[float, float]]
           ) -> tuple[tuple[int, int, int, float, float], ...] | None:
    """Every pair of single-GPU jobs with a measured co-located rate on a type that beats time-sharing one GPU
    (``r_a / u_a + r_b / u_b > 1``; a pair that does not is dominated and may be left out); None above MAX_PAIRS."""
    singles = [j for j, job in enumerate(jobs) if job.gpus == 1]
    if len(singles) * (len(singles) - 1) // 2 > 5 * MAX_PAIRS:
        return None
    out = []
    for x, a in enumerate(singles):
        for b in singles[x + 1:]:
            for g in range(u.shape[1]):
                pair = measured.get((jobs[a].job_type, jobs[b].job_type, g))
                if pair and pair[0] / u[a, g] + pair[1] / u[b, g] > 1:
                    out.append((a, b, g, pair[0], pair[1]))
                    if len(out) > MAX_PAIRS:
                        return None
    return tuple(out)


def _alone_seconds(inst: _Instance, forks: bool) -> np.ndarray:
    """Each job's run time with the whole cluster to itself: (E1)-(E3) cap its rate at the sum of the ``k_j``
    best per-GPU rates among the cluster's GPUs (all of them with forking)."""
    out = np.empty(len(inst.steps))
    for j in range(len(inst.steps)):
        order = np.argsort(-inst.own[j])
        left = float(inst.capacity.sum()) if forks else inst.gpus[j]
        rate = 0.0
        for g in order:
            take = min(left, inst.capacity[g])
            rate += take * inst.own[j, g]
            left -= take
            if left <= 0:
                break
        out[j] = inst.steps[j] / rate if rate > 0 else float("inf")
    return out


def _fluid_makespan(inst: _Instance, forks: bool, start_s: float = 0.0) -> float:
    """max over arrival thresholds ``a`` of ``a + T_a``, ``T_a`` the fluid LP's time for the jobs arriving at ``a``
    or later.

    Validity: the jobs arriving at or after ``a`` run entirely inside ``[a, end]``; booking job ``j``
    ``y[j, g]`` GPU-seconds of type ``g`` there as in (E2), (E1)-(E2) need ``sum_g y[j, g] q[j, g] >= S_j``
    (``q = u e`` for a single-GPU job, ``u`` for a multi-GPU one, :func:`_work`) and capacity gives
    ``sum_j y[j, g] <= C_g (end - a)``; (E3) adds ``sum_g y[j, g] <= k_j (end - a)``. A first start (E4) makes
    no progress for ``start_s``: the job works only in ``[a + start_s, end]``, so its row's
    right-hand side is ``k_j (end - a - start_s)``; and a job that never shares a GPU (multi-GPU, or without
    a measured pair) holds at least one GPU of some type through its start-up besides its booked GPU-seconds
    (a gang may start on fewer GPUs than it asks), so all GPU-seconds booked on every type together stay
    within ``sum_g C_g (end - a) - start_s x`` the number of such jobs.
    The LP's minimum ``T_a`` so satisfies ``end - a >= T_a`` for every schedule.
    """
    arrivals = np.unique(inst.arrival)
    if len(arrivals) > MAX_THRESHOLDS:
        arrivals = np.unique(arrivals[np.linspace(0, len(arrivals) - 1, MAX_THRESHOLDS).round().astype(int)])
    best = 0.0
    for a in arrivals:
        members = np.flatnonzero(inst.arrival >= a)
        best = max(best, float(a) + _fluid_time(inst, members, forks, start_s))
    return best


def _fluid_time(inst: _Instance, members: np.ndarray, forks: bool, start_s: float = 0.0) -> float:
    """The fluid LP of :func:`_fluid_makespan` for ``members``. Co-location enters pair by pair when the instance
    lists its pairs: ``z`` GPU-seconds of jobs a and b sharing a GPU of type g give a ``r_a z`` and b ``r_b z``
    steps and count once against the type's capacity and once against each job's GPU limit (E2); otherwise
    every GPU-second does up to ``e[j, g]`` times a single-GPU job's isolated work (the booking of (E2): a pair
    sharing ``z`` GPU-seconds books ``y_a + y_b <= z``) and exactly a multi-GPU job's, which never shares the
    GPU-seconds it holds, so the capacity and GPU-limit rows still hold."""
    pairs = inst.pairs
    work = (_work(inst) if pairs is None else inst.u)[members]
    n, m = work.shape
    local = {int(j): i for i, j in enumerate(members)}
    shared = [(local[a], local[b], g, ra, rb) for a, b, g, ra, rb in (pairs or ()) if a in local and b in local]
    model = highs()
    inf = highspy.kHighsInf
    # Columns: y[j, g] for each (j, g) with work > 0, then z per shared pair, then T.
    cells = [(j, g) for j in range(n) for g in range(m) if work[j, g] > 0]
    index = {cell: i for i, cell in enumerate(cells)}
    z0 = len(cells)
    t_col = z0 + len(shared)
    model.addVars(t_col + 1, np.zeros(t_col + 1), np.full(t_col + 1, inf))
    model.changeColCost(t_col, 1.0)
    job_cols: list[list[int]] = [[index[(j, g)] for g in range(m) if (j, g) in index] for j in range(n)]
    job_work: list[list[float]] = [[work[j, g] for g in range(m) if (j, g) in index] for j in range(n)]
    type_cols: list[list[int]] = [[index[(j, g)] for j in range(n) if (j, g) in index] for g in range(m)]
    job_share: list[list[int]] = [[] for _ in range(n)]
    for k, (a, b, g, ra, rb) in enumerate(shared):
        job_cols[a].append(z0 + k)
        job_work[a].append(ra)
        job_cols[b].append(z0 + k)
        job_work[b].append(rb)
        type_cols[g].append(z0 + k)
        job_share[a].append(z0 + k)
        job_share[b].append(z0 + k)
    for j in range(n):
        model.addRow(float(inst.steps[members[j]]), inf, len(job_cols[j]), np.array(job_cols[j], dtype=np.int32),
                     np.array(job_work[j]))
        if not forks:
            held = [index[(j, g)] for g in range(m) if (j, g) in index] + job_share[j]
            gpus = float(inst.gpus[members[j]])
            model.addRow(gpus * start_s, inf, len(held) + 1, np.array([t_col, *held], dtype=np.int32),
                         np.array([gpus, *([-1.0] * len(held))]))
    for g in range(m):
        cols = type_cols[g]
        model.addRow(0.0, inf, len(cols) + 1, np.array([t_col, *cols], dtype=np.int32),
                     np.array([inst.capacity[g], *([-1.0] * len(cols))]))
    alone_start_up = start_s * float((inst.paired[members].max(axis=1) <= 0).sum())
    if alone_start_up > 0:
        every = np.arange(t_col, dtype=np.int32)
        model.addRow(alone_start_up, inf, t_col + 1, np.array([t_col, *every], dtype=np.int32),
                     np.array([inst.capacity.sum(), *([-1.0] * t_col)]))
    model.run()
    if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0  # a bound of nothing rather than a wrong one
    return float(model.getSolution().col_value[t_col])


def _interval_lp(inst: _Instance, alone: np.ndarray, running: np.ndarray, forks: bool, weight: np.ndarray,
                 horizon: float) -> float:
    """sum_j w_j (C_j - r_j) >= the optimum of an interval-indexed LP (Hall, Schulz, Shmoys and Wein's
    relaxation, per GPU type); 0 when the LP would be too large or is not solved.

    Time is cut at grid points ``a_0 < a_1 < ...`` (release times, a geometric and a uniform grid reaching
    three times ``horizon``, the makespan bound, past the first arrival; the last interval is unbounded, which
    is valid, only looser). In interval ``i`` on type ``g`` a job has *alone* columns ``x[j, g, i]``: seconds
    it holds GPUs of ``g`` by itself (GPU-seconds for a multi-GPU job), each doing at most ``u[j, g]`` work
    (E1) and taking one GPU-second of capacity; a single-GPU job with a pair gain ``e[j, g] > 1`` also has a
    *shared* column ``s[j, g, i]``: work it does sharing a GPU of ``g``, which takes at least ``s / rho[j, g]``
    of its time (``rho``: its best co-located rate there) and is booked ``s / (u e)`` GPU-seconds as in (E2),
    the pair's two bookings summing to at most the GPU-seconds they share. Every schedule gives such columns
    with: work ``S_j``; per interval and type at most ``C_g * length`` GPU-seconds booked; without forking, a
    job's seconds (alone plus shared time; GPU-seconds for a multi-GPU job) at most ``k_j * length`` (E3)
    and, all of them lying in ``[r_j, C_j]`` after its ``start_s`` of start-up (E4), at most
    ``k_j (C_j - r_j - start_s)``; per job at most ``S_j / p_j * length`` work, ``p_j`` = ``running``, its
    alone time without start-up (:func:`_alone_seconds`: no allocation runs it faster); no work before the
    end of its first start-up, ``r_j + start_s`` (rounded down to a grid point, a relaxation). Its mean busy
    time ``M_j`` (the work-weighted mean time of its processing) is at least ``sum_i f_ji a_i``, ``f_ji`` the
    share of its work done in interval ``i``; its work goes at most at rate ``S_j / p_j``, so it spans at
    least ``p_j`` and ``C_j >= M_j + p_j / 2`` (``p_j``, not ``alone_j``: start-up makes no progress, so it
    does not spread the work, and a job may spend it on GPUs it leaves before it works); and
    ``C_j >= r_j + alone_j``. Without forking, ``C_j - M_j`` is also at least half the job's run at the rates
    its work gets in the LP (:func:`_span_cuts`: a job the LP runs on slow GPUs pays their length there, not
    its fastest run's), by tangent cuts, first at each column kind alone and then at the LP's own solution
    until they stop paying; and the seconds a job works from any grid point up to ``r_j + alone_j`` on fit
    between that point and ``C_j`` (:func:`_tail_cuts`, added with them). Minimising ``sum w_j C_j`` under
    these constraints so bounds every schedule's.

    Separate alone and shared columns keep the LP from running a single-GPU job at its alone rate while
    booking it only ``1 / e`` of a GPU (one column at ``u e`` per GPU-second allowed that); the time rows
    keep it from waiting behind no one while its GPU-seconds sit on slow types.
    """
    n, m = inst.u.shape
    first, finite = float(inst.arrival.min()), np.isfinite(alone)
    if n == 0 or not finite.all():
        return 0.0
    span = max(float((inst.arrival - first + alone).max()), horizon)
    start_up = alone - running
    ready = inst.arrival + start_up  # no job works before its first start-up ends (E4)
    releases = np.unique(ready)
    if len(releases) > MAX_RELEASE_POINTS:
        releases = np.unique(releases[np.linspace(0, len(releases) - 1, MAX_RELEASE_POINTS).round().astype(int)])
    geometric, t = [first], first + max(float(alone.min()) / 4, 1.0)
    while t < first + 3 * span:
        geometric.append(t)
        t = first + (t - first) * GRID_RATIO
    layouts = (_column_kinds(inst, True), _column_kinds(inst, False))  # split first, on each grid
    for intervals, kinds in itertools.product((GRID_INTERVALS, GRID_INTERVALS // 2, GRID_INTERVALS // 4), layouts):
        uniform = first + np.arange(intervals + 1) * (span / intervals)
        points = np.unique(np.concatenate([np.array(geometric), uniform, releases]))
        start_of = np.searchsorted(points, ready, side="right") - 1  # rounded down to a grid point
        if sum(len(kinds[j]) * (len(points) - start_of[j]) for j in range(n)) + n <= MAX_LP_COLUMNS:
            break
    else:
        return 0.0
    cells = [(j, kind, i) for j in range(n) for kind in kinds[j] for i in range(start_of[j], len(points))]
    starts = points
    lengths = np.append(np.diff(points), np.inf)
    model = highs()
    model.setOptionValue("solver", "ipm")
    inf = highspy.kHighsInf
    n_y = len(cells)
    cost = np.zeros(n_y + n)
    cost[n_y:] = weight
    model.addVars(n_y + n, np.zeros(n_y + n), np.full(n_y + n, inf))
    model.changeColsCost(n_y + n, np.arange(n_y + n, dtype=np.int32), cost)
    by_job: dict[int, list[int]] = {}
    by_type_interval: dict[tuple[int, int], list[int]] = {}
    by_job_interval: dict[tuple[int, int], list[int]] = {}
    for col, (j, (g, _, _, _), i) in enumerate(cells):
        by_job.setdefault(j, []).append(col)
        if np.isfinite(lengths[i]):
            by_type_interval.setdefault((g, i), []).append(col)
            by_job_interval.setdefault((j, i), []).append(col)
    work = np.array([kind[1] for _, kind, _ in cells])
    booked = np.array([kind[2] for _, kind, _ in cells])
    busy = np.array([kind[3] for _, kind, _ in cells])
    job_of = np.array([j for j, _, _ in cells])
    held = busy / inst.gpus[job_of]  # the job's seconds per unit of each column (GPU-seconds over k_j)
    interval = np.array([i for _, _, i in cells])
    for j in range(n):
        cols = np.array(by_job[j], dtype=np.int32)
        model.addRow(float(inst.steps[j]), inf, len(cols), cols, work[cols])
        # C_j - sum_i a_i * (work share in i) >= p_j / 2, the share being the column's work / S_j.
        scale = 1.0 / max(float(inst.steps[j]), 1e-12)
        model.addRow(float(running[j] / 2), inf, len(cols) + 1, np.array([n_y + j, *cols], dtype=np.int32),
                     np.array([1.0, *(-starts[interval[cols]] * work[cols] * scale)]))
        model.changeColBounds(n_y + j, float(inst.arrival[j] + alone[j]), inf)
        if not forks:  # k_j (C_j - r_j - start_s) >= the job's seconds
            model.addRow(float(inst.arrival[j] + start_up[j]), inf, len(cols) + 1,
                         np.array([n_y + j, *cols], dtype=np.int32),
                         np.array([1.0, *(-held[cols])]))
    for (g, i), cols in by_type_interval.items():
        idx = np.array(cols, dtype=np.int32)
        model.addRow(0.0, float(inst.capacity[g] * lengths[i]), len(idx), idx, booked[idx])
    if not forks:
        rate = work / held  # R_k of each column's kind: all the job's width on it
        _span_cuts(model, by_job, work, rate, starts[interval], inst.steps, n_y, None)
    peak = inst.steps / running  # S_j / p_j: no job's work goes faster (E1-E3)
    for (j, i), cols in by_job_interval.items():
        idx = np.array(cols, dtype=np.int32)
        if not forks:
            model.addRow(0.0, float(inst.gpus[j] * lengths[i]), len(idx), idx, busy[idx])
        model.addRow(0.0, float(peak[j] * lengths[i]), len(idx), idx, work[idx])
    model.run()
    if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return 0.0
    best = float(weight @ (np.array(model.getSolution().col_value[n_y:]) - inst.arrival))
    if not forks:
        model.setOptionValue("solver", "simplex")  # warm from the last basis as cuts come in
        for _ in range(CUT_ROUNDS):
            solution = np.array(model.getSolution().col_value)
            _span_cuts(model, by_job, work, rate, starts[interval], inst.steps, n_y, solution[:n_y])
            _tail_cuts(model, by_job, held, interval, starts, inst.arrival + alone, n_y, solution)
            model.run()
            if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
                break  # the last solved LP's value stands
            value = float(weight @ (np.array(model.getSolution().col_value[n_y:]) - inst.arrival))
            gain, best = value - best, max(best, value)
            if gain <= CUT_GAIN * best:
                break
    return best


def _tail_cuts(model: highspy.Highs, by_job: Mapping[int, list[int]], seconds: np.ndarray, interval: np.ndarray,
               points: np.ndarray, earliest_end: np.ndarray, first_c: int, at: np.ndarray) -> None:
    """Per job, the cut ``C_j >= a_i + sum_{cols in intervals i' >= i} seconds * x`` most violated by the LP
    solution ``at`` over the grid points ``a_i <= earliest_end[j]``; ``seconds[col]``: the job's seconds per unit
    of the column (its GPU-seconds over ``k_j``).

    Valid without forking: work booked in an interval starting at ``a_i`` or later runs at ``a_i`` or later, at
    most ``k_j`` GPUs at a time (E3), and before ``C_j``; and ``C_j >= r_j + alone_j >= a_i``, so it holds also
    when no work is left past ``a_i``. Past ``r_j + alone_j`` it need not (a job may end before the point), so
    it is not cut there. The mean-busy rows count only a job's mean, so the LP books work after the job's own
    completion (on generated 3 jobs/h, 99 of 120 jobs, up to 40% of their work); these rows take that back for
    the work past each early grid point.
    """
    inf = highspy.kHighsInf
    for j, cols_list in by_job.items():
        cols = np.array(cols_list, dtype=np.int32)
        late_first = cols[np.argsort(-interval[cols], kind="stable")]
        where = interval[late_first]
        after = np.cumsum(seconds[late_first] * at[late_first])  # the job's seconds from each column's interval on
        ends = np.r_[where[1:] != where[:-1], True]  # last column of each interval
        start = points[where[ends]]
        need = np.where(start <= earliest_end[j], start + after[ends], -inf)
        best = int(np.argmax(need))
        if need[best] - at[first_c + j] > 1e-6 * max(1.0, abs(at[first_c + j])):
            tail = cols[interval[cols] >= where[ends][best]]
            model.addRow(float(start[best]), inf, len(tail) + 1, np.array([first_c + j, *tail], dtype=np.int32),
                         np.array([1.0, *(-seconds[tail])]))


def _span_cuts(model: highspy.Highs, by_job: Mapping[int, list[int]], work: np.ndarray, rates: np.ndarray,
               start: np.ndarray, steps: np.ndarray, first_c: int, at: np.ndarray | None) -> None:
    """Tangent cuts of ``C_j >= M_j + f_j(W) / S_j``: at each pure point ``W = S_j e_k`` (``at`` None), or at
    the work per kind of the LP solution ``at`` (its work columns); ``rates[col]`` is ``R_k`` of the column's kind.

    A job's work of kind k (a column layout: type, alone or shared) goes at most at ``R_k = k_j work / busy``
    (all its width on that kind; a mix of kinds at once is a convex combination). ``C_j - M_j =
    (1 / S_j) * integral (C_j - t) rate(t) dt``, smallest when the fastest work comes last and at full rate
    (each unit of work as near ``C_j`` as it can be: shortest units last), which gives
    ``f(W) = 1/2 W^T Q W``, ``Q[k, l] = 1 / max(R_k, R_l)``; Q is positive semidefinite (``1 / R`` of the faster
    of the two, a min-kernel), so f lies above every tangent ``f(W) >= (Q W0) . W - f(W0)``. At ``W0 = S_j e_k``:
    ``C_j >= sum_cols share * (a_i + S_j / max(R_col, R_k)) - S_j / (2 R_k)``, ``M_j >= sum share * a_i``
    as in the mean-busy row. A job all on one slow type so ends half its run there past its mean.
    """
    inf = highspy.kHighsInf
    for j, cols_list in by_job.items():
        cols = np.array(cols_list, dtype=np.int32)
        rate = rates[cols]
        share = work[cols] / steps[j]
        if at is None:
            points = [(1.0 / np.maximum(rate, r_k), steps[j] / (2 * r_k)) for r_k in np.unique(rate)]
        else:
            # Tangent at the LP's own work per rate: (Q W0)_col = sum_l W0_l / max(R_col, R_l), f0 = W0.QW0 / 2.
            levels, where = np.unique(rate, return_inverse=True)
            w0 = np.bincount(where, weights=work[cols] * at[cols], minlength=len(levels))
            q = 1.0 / np.maximum.outer(levels, levels)
            grad = q @ w0
            points = [(grad[where] / steps[j], float(w0 @ q @ w0) / (2 * steps[j]))]
        for slope, f0 in points:
            coef = -share * (start[cols] + steps[j] * slope)
            model.addRow(float(-f0), inf, len(cols) + 1,
                         np.array([first_c + j, *cols], dtype=np.int32), np.array([1.0, *coef]))


def _column_kinds(inst: _Instance, split: bool) -> list[list[tuple[int, float, float, float]]]:
    """Per job, its interval LP columns per interval: (type, work, booked GPU-seconds, job seconds) per unit.

    ``split``: a single-GPU job that may share a GPU gets an alone column (``u`` work per GPU-second) and a
    shared one (work at ``rho``, booked ``1 / (u e)``); otherwise one column books its GPU-seconds at
    ``q = u e`` work each, as the makespan LP does by the gains (valid, looser, half the columns), which
    the interval LP falls back to before coarsening its grid; a job's booked GPU-seconds never exceed the
    seconds it holds a GPU (E2), so its time rows hold for that column too.
    """
    n, m = inst.u.shape
    kinds: list[list[tuple[int, float, float, float]]] = [[] for _ in range(n)]
    for j in range(n):
        for g in range(m):
            u, gain, paired = float(inst.u[j, g]), float(inst.gain[j, g]), float(inst.paired[j, g])
            if u <= 0:
                continue
            if gain > 1 and paired > 0 and split:
                kinds[j] += [(g, u, 1.0, 1.0), (g, 1.0, 1.0 / (u * gain), 1.0 / paired)]
            else:
                kinds[j].append((g, u * gain, 1.0, 1.0))
    return kinds


def _srpt_completions(release: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Completion times of preemptive shortest-remaining-processing-time on one unit-speed machine.

    SRPT is optimal for 1|r_j, pmtn|sum C_j, and any fractional (processor-sharing) schedule can be
    turned into a preemptive one whose completion times are no later (EDF on its own completion times
    as deadlines), so sum C_j of SRPT bounds every pooled schedule.
    """
    return _preemptive(release, size, size)


def _wspt_mean_busy(release: np.ndarray, size: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Mean busy times M_j of the preemptive WSPT schedule (highest w_j / p_j first) on one machine.

    Goemans (1997): with release dates, preemptive WSPT minimises sum w_j M_j over every (fractional)
    single-machine schedule, and a job processed at rate at most ``rho_j`` ends no earlier than
    ``M_j + p_j / (2 rho_j)``; so sum w_j (M_j + p_j / (2 rho_j)) bounds sum w_j C_j.
    """
    ratio = np.where(size > 0, size / np.maximum(weight, 1e-12), 0.0)
    return _preemptive(release, size, ratio, mean_busy=True)


def _preemptive(release: np.ndarray, size: np.ndarray, key: np.ndarray, mean_busy: bool = False) -> np.ndarray:
    """Run the preemptive priority rule "smallest ``key`` (remaining size when ``key is size``) first"; return
    completion times, or mean busy times with ``mean_busy``."""
    n = len(size)
    order = np.argsort(release, kind="stable")
    remaining = size.astype(float).copy()
    out = np.zeros(n)
    moment = np.zeros(n)  # integral of t over the job's processing
    srpt = key is size
    heap: list[tuple[float, int]] = []
    now, i = 0.0, 0
    while i < n or heap:
        if not heap:
            now = max(now, float(release[order[i]]))
        while i < n and release[order[i]] <= now:
            j = int(order[i])
            heapq.heappush(heap, (float(remaining[j] if srpt else key[j]), j))
            i += 1
        _, j = heapq.heappop(heap)
        horizon = float(release[order[i]]) if i < n else float("inf")
        run = min(remaining[j], horizon - now)
        moment[j] += run * (now + run / 2)
        now += run
        remaining[j] -= run
        if remaining[j] <= 1e-12 * max(1.0, size[j]):
            out[j] = now
        else:
            heapq.heappush(heap, (float(remaining[j] if srpt else key[j]), j))
    if mean_busy:
        return np.where(size > 0, moment / np.where(size > 0, size, 1.0), out)
    return out
