"""Exact references for small instances.

:func:`exact_milp` (policy key ``exhaustive``) enumerates every *option* of every
job, an option being a count vector ``x`` (GPUs per type within min/max and the
allowed types) together with a placement class: "on node n" (intra-node link,
only if n can hold x) or "spread" (inter-node link). Each option's run time is
a constant, so choosing one option per job subject to per-type and per-node
capacity is a 0/1 program, solved to proven optimality by HiGHS through pulp.
A spread option is always placeable on whatever its type's GPUs are left, so
the MILP optimum is the optimum of the job model over all worker assignments.

:func:`brute_force` is the paper's literal exhaustive search (every GPU to one
job or idle); exponential, for tests on a handful of GPUs.
"""

from __future__ import annotations

import itertools

import numpy as np
import pulp

from slurmhet.errors import InputError
from slurmhet.planner.model import Progress
from slurmhet.planner.problem import Problem, spread_fill
from slurmhet.planner.solver import pulp_highs

#: Refuse to build MILPs larger than this many binaries (the benchmark reports the size instead).
MAX_OPTIONS = 60_000


#: One option: a count vector, the node it sits on whole (None: spread), and its term of the objective.
Option = tuple[np.ndarray, int | None, float]


def job_options(problem: Problem, j: int) -> list[Option]:
    """All (count vector, node or None for spread, weighted run time) options of job ``j``."""
    allowed = np.flatnonzero(problem.allowed[j])
    hi = int(problem.hi[j])
    ranges = [range(0, min(int(problem.type_capacity[t]), hi) + 1) for t in allowed]
    out = []
    for combo in itertools.product(*ranges):
        k = sum(combo)
        if not problem.lo[j] <= k <= hi:
            continue
        x = np.zeros(len(problem.types), dtype=int)
        x[allowed] = combo
        spread = problem.cost(j, x, False)
        out.append((x, None, spread))
        if k > 1:
            single = problem.cost(j, x, True)
            if single < spread:
                out.extend((x, int(n), single) for n in np.flatnonzero(np.all(problem.capacity >= x, axis=1)))
    return out


def too_many_boxes(problem: Problem, above: int) -> bool:
    """Whether :func:`job_options` would look at more than ``above`` count vectors, all jobs together: a cheap
    upper estimate of the MILP's size, so that a large instance is turned away before anything is enumerated
    (it stops counting there: the allocator asks at every decision)."""
    boxes = 0
    for j in range(len(problem.jobs)):
        boxes += int(np.prod([min(int(problem.type_capacity[t]), int(problem.hi[j])) + 1
                              for t in np.flatnonzero(problem.allowed[j])]))
        if boxes > above:
            return True
    return False


def all_options(problem: Problem, limit: int, progress: Progress | None = None) -> list[list[Option]] | None:
    """Every job's options, or None when they would be more than ``limit`` binaries."""
    if too_many_boxes(problem, 4 * limit):
        return None
    options: list[list[Option]] = []
    binaries = 0
    for j in range(len(problem.jobs)):
        options.append(job_options(problem, j))
        binaries += len(options[-1])
        if binaries > limit:
            return None
        if progress:
            progress(j + 1, len(problem.jobs) + 1, "exhaustive: enumerating options")
    return options


def solve_options(problem: Problem, options: list[list[Option]],
                  time_limit_s: float | None = None) -> tuple[float, list[Option]] | None:
    """One option per job, subject to per-type and per-node capacity, at the least total cost: the optimum
    and the chosen options, or None when HiGHS did not prove one optimal (e.g. within ``time_limit_s``)."""
    model = pulp.LpProblem("slurmhet_exact", pulp.LpMinimize)
    z = [[model.add_variable(f"z_{j}_{o}", cat="Binary") for o in range(len(opts))] for j, opts in enumerate(options)]
    model += pulp.lpSum(c * z[j][o] for j, opts in enumerate(options) for o, (_, _, c) in enumerate(opts))
    for j in range(len(options)):
        model += pulp.lpSum(z[j]) == 1
    for t in range(len(problem.types)):
        model += pulp.lpSum(x[t] * z[j][o] for j, opts in enumerate(options)
                            for o, (x, _, _) in enumerate(opts) if x[t]) <= int(problem.type_capacity[t])
        for n in range(len(problem.nodes)):
            on_node = [x[t] * z[j][o] for j, opts in enumerate(options) for o, (x, node, _) in enumerate(opts)
                       if node == n and x[t]]
            if on_node:
                model += pulp.lpSum(on_node) <= int(problem.capacity[n, t])
    status = model.solve(pulp_highs(gapRel=0.0, timeLimit=time_limit_s))
    if pulp.LpStatus[status] != "Optimal":
        return None
    chosen = [next(opts[o] for o in range(len(opts)) if (z[j][o].value() or 0) > 0.5) for j, opts in enumerate(options)]
    return sum(c for _, _, c in chosen), chosen


def exact_milp(problem: Problem, progress: Progress | None = None,
               time_limit_s: float | None = None) -> list[dict[tuple[int, int], int]]:
    options = all_options(problem, MAX_OPTIONS, progress)
    if options is None:
        raise InputError(f"the exact MILP is too large here: over {MAX_OPTIONS} binaries or {4 * MAX_OPTIONS} count "
                         "vectors to enumerate", place="policy exhaustive",
                         hint="use it on small instances; the bound covers large ones")
    solved = solve_options(problem, options, time_limit_s)
    if solved is None:
        raise AssertionError("exact MILP ended without a proven optimum")
    chosen = solved[1]
    free = problem.capacity.copy()
    slots: list[dict[tuple[int, int], int]] = [dict() for _ in chosen]
    for j, (x, node, _) in enumerate(chosen):
        if node is not None:
            free[node] -= x
            slots[j] = {(node, int(t)): int(c) for t, c in enumerate(x) if c}
    for j, (x, node, _) in enumerate(chosen):
        if node is None:
            spread_fill(free, x, slots[j])
    if progress:
        progress(len(problem.jobs) + 1, len(problem.jobs) + 1, "exhaustive: solved")
    return slots


def brute_force(problem: Problem, progress: Progress | None = None) -> list[dict[tuple[int, int], int]]:
    """Every GPU to one job or idle: (J+1)^K assignments. Refuses more than 2 million."""
    gpus = [(n, t) for n in range(len(problem.nodes)) for t in range(len(problem.types))
            for _ in range(int(problem.capacity[n, t]))]
    jobs = len(problem.jobs)
    if (jobs + 1) ** len(gpus) > 2_000_000:
        raise InputError(f"brute force over {len(gpus)} GPUs and {jobs} jobs is too large", place="policy brute-force",
                         hint="use 'exhaustive' (the exact MILP)")
    best: tuple[float, list[dict[tuple[int, int], int]]] | None = None
    for owner in itertools.product(range(-1, jobs), repeat=len(gpus)):
        slots: list[dict[tuple[int, int], int]] = [dict() for _ in range(jobs)]
        for gpu, j in zip(gpus, owner):
            if j >= 0:
                slots[j][gpu] = slots[j].get(gpu, 0) + 1
        value = sum(problem.alloc_cost(j, s) for j, s in enumerate(slots))
        if best is None or value < best[0]:
            best = (value, slots)
    if best is None or best[0] == float("inf"):
        raise InputError("no feasible assignment", place="policy brute-force", hint="check min/max GPUs")
    return best[1]
