"""Who runs now, on which GPU type, and which single-GPU jobs share a GPU: one MILP for a revisable plan.

A plan revised at every decision (``pin_running=False``: the simulator's ``slurmhet`` policy)
maximises weighted progress now (``planner.problem``). Admission in GPU-time order decides who
runs before anyone asks which GPUs are left: with 8 V100s, 16 P100s and 24 K80s, the jobs it
admits last take the K80s whatever they run at there (some at 0.13 of their best rate), while a
waiting job would have kept half of its; and it co-locates only waiting jobs, onto a running
one, so two short single-GPU jobs never share a V100 that neither fills, while measured pairs
on Gavel's traces run 1.25-2.0 times the work of one job on the GPU. Here every job that may
run is a candidate at once: each may run alone on one type (all its GPUs there; over several
types only when no one type holds it, :func:`count_vectors`), share one GPU with another
single-GPU job (a measured or modelled pair, ``colocation.speedup``), or wait; the MILP picks
the set of choices with the most progress under each type's capacity, each job in at most
one. Jobs that must run (a critical path's, ``forced``) run. The chosen counts are then packed
on nodes as the allocator packs its own (:func:`place`). It is solved only where it is small
(``MAX_COLUMNS``), rigid (every job's GPU count fixed) and proven optimal within
``TIME_LIMIT_S``; otherwise admission stays greedy and the allocator chooses the GPUs
(``scale-10k``'s thousands of jobs and ``hare``'s elastic ones never get here).

Measured on Gavel's traces in Gavel's set-up (bench/README.md, "Joint admission").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Mapping, Sequence

import highspy
import numpy as np

from slurmhet.cluster import Inventory
from slurmhet.planner import colocation, hetero
from slurmhet.planner.colocation import ColocationGroup
from slurmhet.planner.model import ColocationSettings, JobPlan, PlanJob
from slurmhet.planner.problem import Problem
from slurmhet.planner.solver import highs
from slurmhet.throughput import ThroughputTable

#: A gang of ``k`` GPUs weighs ``k^GANG_EXPONENT`` times its own progress share: a job's term is one share however
#: many GPUs it holds, so per GPU a gang counts ``1/k`` of a single-GPU job with as much work left, and a short
#: gang of 8 crawled on K80s while longer single-GPU jobs kept the V100s. Measured at 0, 0.25, 0.5 and 0.75 on
#: Gavel's traces (bench/README.md, "Joint admission").
GANG_EXPONENT = 0.25
#: No joint MILP above this many columns (choices), pairs included; greedy admission then.
MAX_COLUMNS = 20_000
#: Proven optimal within this many seconds, or greedy admission.
TIME_LIMIT_S = 2.0


@dataclass(frozen=True)
class Choice:
    """Jobs (one alone, or two sharing one GPU) on ``gpus`` GPUs per type, adding ``value`` progress."""

    jobs: tuple[int, ...]
    gpus: tuple[int, ...]
    value: float


def choose(choices: Sequence[Choice], n_jobs: int, capacity: Sequence[int], forced: Collection[int] = (),
           time_limit_s: float = TIME_LIMIT_S) -> list[Choice] | None:
    """The choices, each job in at most one (a ``forced`` job in exactly one) and each type's GPUs within
    ``capacity[type]``, with the most value; None when HiGHS proves no optimum (infeasible, or out of time)."""
    if not choices:
        return [] if not forced else None
    top = max(abs(c.value) for c in choices) or 1.0  # values are dimensionless shares; keep them near 1
    n = len(choices)
    model = highs()
    model.setOptionValue("time_limit", float(time_limit_s))
    model.setOptionValue("mip_rel_gap", 1e-6)
    model.addVars(n, np.zeros(n), np.ones(n))
    model.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
    model.changeColsCost(n, np.arange(n, dtype=np.int32), np.array([-c.value / top for c in choices]))
    by_job: list[list[int]] = [[] for _ in range(n_jobs)]
    by_type: dict[int, list[int]] = {}
    for i, c in enumerate(choices):
        for j in c.jobs:
            by_job[j].append(i)
        for t, count in enumerate(c.gpus):
            if count:
                by_type.setdefault(t, []).append(i)
    must = set(forced)
    for j, cols in enumerate(by_job):
        if cols:
            model.addRow(1.0 if j in must else 0.0, 1.0, len(cols), np.array(cols, dtype=np.int32), np.ones(len(cols)))
        elif j in must:
            return None
    for t, cols in by_type.items():
        model.addRow(0.0, float(capacity[t]), len(cols), np.array(cols, dtype=np.int32),
                     np.array([float(choices[i].gpus[t]) for i in cols]))
    model.run()
    if model.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = model.getSolution().col_value
    return [c for i, c in enumerate(choices) if x[i] > 0.5]


@dataclass(frozen=True)
class Admission:
    """What the joint MILP runs now: ``run``, each job that gets GPUs with its GPUs per type (a pair's host
    among them, on one GPU of its pair's type), and the ``(host, joiner, GPU type)`` pairs sharing the host's
    GPU."""

    run: dict[str, np.ndarray]
    pairs: tuple[tuple[str, str, str], ...]


def admit(problem: Problem, forced: Collection[str], table: ThroughputTable, inventory: Inventory,
          settings: ColocationSettings) -> Admission | None:
    """The joint MILP over ``problem``'s jobs (every candidate, preemptive objective, rigid GPU counts); None
    when it is too large or not proven optimal, or a job is elastic (its counts would multiply the choices)."""
    jobs = problem.jobs
    if not problem.preemptive or not np.array_equal(problem.lo, problem.hi):
        return None
    singles = [j for j, job in enumerate(jobs) if problem.hi[j] == 1 and colocation.eligible(job)]
    if _columns(len(jobs), len(singles), len(problem.types), settings) > MAX_COLUMNS:
        return None
    choices = []
    for j in range(len(jobs)):
        for x in count_vectors(problem.hi[j], problem.allowed[j], problem.type_capacity):
            value = -problem.cost(j, x, problem.fits_one_node(x)) * problem.hi[j] ** GANG_EXPONENT
            if math.isfinite(value):
                choices.append(Choice((j,), x, value))
            if len(choices) > MAX_COLUMNS:
                return None
    if _pairing(settings):
        choices += _pair_choices(problem, singles, table, inventory, settings)
    index = {job.id: j for j, job in enumerate(jobs)}
    chosen = choose(choices, len(jobs), problem.type_capacity.tolist(), [index[i] for i in forced if i in index])
    if chosen is None:
        return None
    return Admission({jobs[c.jobs[0]].id: np.array(c.gpus) for c in chosen},
                     tuple((jobs[c.jobs[0]].id, jobs[c.jobs[1]].id, problem.types[int(np.argmax(c.gpus))])
                           for c in chosen if len(c.jobs) == 2))


def within_size(jobs: Sequence[PlanJob], n_types: int, settings: ColocationSettings) -> bool:
    """Whether :func:`admit` over ``jobs`` stays within ``MAX_COLUMNS``, asked before the caller builds its
    problem (for thousands of jobs that took a tenth of a second for nothing). The jobs that may share a GPU
    (``colocation.eligible``) ask for one, so they count as ``admit`` counts them."""
    singles = sum(1 for job in jobs if colocation.eligible(job))
    return _columns(len(jobs), singles, n_types, settings) <= MAX_COLUMNS


def _pairing(settings: ColocationSettings) -> bool:
    """Whether the MILP offers two single-GPU jobs sharing a GPU: co-location on, groups of two allowed."""
    return settings.enabled and settings.max_group >= 2


def _columns(n_jobs: int, n_singles: int, n_types: int, settings: ColocationSettings) -> int:
    """The joint MILP's columns before any is priced: each job on each type, and each pair of single-GPU jobs on
    each type when it offers pairs."""
    return n_jobs * n_types + (n_singles * (n_singles - 1) // 2 * n_types if _pairing(settings) else 0)


def count_vectors(k: int, allowed: np.ndarray, capacity: np.ndarray) -> list[tuple[int, ...]]:
    """The ways to take ``k`` GPUs of one allowed type; for a job that no one type can hold, every way to take
    them from several within their capacity.

    A gang over several types spans nodes wherever a node has one type (Gavel's set-up and most sites), so it
    pays the all-reduce between them; offered to every job, such gangs took minimize_makespan's makespan
    from 1.042 to 0.992 of Gavel's own (bench/README.md, "Joint admission")."""
    types = [int(t) for t in np.flatnonzero(allowed)]
    out: list[tuple[int, ...]] = []

    def fill(i: int, left: int, x: list[int]) -> None:
        if i == len(types):
            if not left:
                out.append(tuple(x))
            return
        for take in range(min(left, int(capacity[types[i]])), -1, -1):
            x[types[i]] = take
            fill(i + 1, left - take, x)
        x[types[i]] = 0

    fill(0, int(k), [0] * len(allowed))
    alone = [x for x in out if sum(1 for v in x if v) == 1]
    return alone or out


def place(problem: Problem, counts: list[np.ndarray]) -> list[dict[tuple[int, int], int]]:
    """The chosen counts on nodes, as the allocator packs its own (running jobs stay where their counts
    are unchanged)."""
    single = [problem.fits_one_node(x) for x in counts]
    return hetero.pack_in_place(problem, counts, hetero.single_node_benefits(problem, counts, single))[0]


def _pair_choices(problem: Problem, singles: Sequence[int], table: ThroughputTable, inventory: Inventory,
                  settings: ColocationSettings) -> list[Choice]:
    """Every two eligible single-GPU jobs on every type both may use where their predicted speedup reaches
    ``1 + margin`` and both fit the GPU's memory: one GPU, each member's progress at its co-located rate."""
    jobs = problem.jobs
    memory = {t: colocation.type_memory(inventory, t, table) for t in problem.types}
    predicted: dict[tuple[str, int, str, int, str], tuple[float, tuple[float, ...]] | None] = {}
    out = []
    for x, a in enumerate(singles):
        for b in singles[x + 1:]:
            for t in np.flatnonzero(problem.allowed[a] & problem.allowed[b]):
                gpu_type = problem.types[t]
                ja, jb = jobs[a], jobs[b]
                # Both allow the type (``problem.allowed``); b joins a GPU that holds a.
                if not colocation.has_room(jb, gpu_type, 1, memory[gpu_type], ja.gpu_memory_gb or 0, settings):
                    continue
                key = (ja.workload, ja.global_batch, jb.workload, jb.global_batch, gpu_type)
                if key not in predicted:
                    guess = colocation.speedup((ja, jb), gpu_type, table, settings)
                    predicted[key] = (guess[0], guess[1]) if guess is not None else None
                guess = predicted[key]
                if guess is None or guess[0] < 1 + settings.margin:
                    continue
                value = sum(problem.progress(j, problem.run_time(j, problem.rates[j, t] / slow, 1, True))
                            for j, slow in zip((a, b), guess[1]))
                out.append(Choice((a, b), tuple(int(i == t) for i in range(len(problem.types))), value))
    return out


def groups(pairs: Sequence[tuple[str, str, str]], plans: Mapping[str, JobPlan], jobs: Mapping[str, PlanJob],
           table: ThroughputTable, settings: ColocationSettings) -> list[ColocationGroup]:
    """The chosen pairs as co-location groups on their hosts' GPUs."""
    out = []
    for i, (host, joiner, gpu_type) in enumerate(sorted(pairs)):
        allocation = plans[host].allocation
        assert allocation is not None and allocation.by_type() == {gpu_type: 1}, "a pair's host runs on its GPU"
        delta, slowdown, source = colocation.speedup((jobs[host], jobs[joiner]), gpu_type, table,  # type: ignore[misc]
                                                     settings)
        out.append(ColocationGroup(f"coloc-{i + 1}", allocation.slots[0][0], gpu_type, (host, joiner), delta,
                                   slowdown, source))
    return out
