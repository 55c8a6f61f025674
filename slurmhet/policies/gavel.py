"""Gavel's max-min-fairness-perf policy (``gavel-mmf``): an LP over time fractions, then rounds.

The LP (Gavel, "max_min_fairness_perf") chooses X[j, g], the fraction of time job j
should run on type g, maximising the minimum over jobs of the weighted normalised
throughput sum_g T[j, g] X[j, g] / (w_j T_eq[j]), where T_eq is the job's throughput
on an equal share of every type; subject to sum_g X[j, g] <= 1 and
sum_j k_j X[j, g] <= GPUs of type g. Gavel's round mechanism then ranks (job, type)
pairs by X[j, g] / (share of time already received on g) and places whole gangs
greedily. The LP is re-solved only when the job set changes, as in Gavel.
"""

from __future__ import annotations

import pulp

from slurmhet.planner.solver import pulp_highs
from slurmhet.policies.base import ClusterView, Free, JobState, Placement, TimePolicy


def max_min_fairness_lp(view: ClusterView, jobs: list[JobState]) -> dict[tuple[int, str], float]:
    """Solve the LP with pulp/HiGHS; returns X[(job_id, type)] (only positive entries)."""
    capacity = view.type_capacity()
    types = sorted(capacity)
    total = sum(capacity.values())
    rate = {(j.job_id, g): view.rates.type_rate(j.job_type, j.gpus, g) for j in jobs for g in types}
    problem = pulp.LpProblem("gavel_max_min_fairness_perf", pulp.LpMaximize)
    x = {key: problem.add_variable(f"x_{key[0]}_{key[1]}", 0, 1) for key, r in rate.items() if r > 0}
    floor = problem.add_variable("t", 0)
    problem += floor
    for job in jobs:
        keys = [(job.job_id, g) for g in types if (job.job_id, g) in x]
        equal = sum(rate[(job.job_id, g)] * capacity[g] / total for g in types) or 1.0
        problem += pulp.lpSum(x[k] for k in keys) <= 1
        problem += pulp.lpSum(rate[k] / equal * x[k] for k in keys) >= job.weight * floor
    for g in types:
        problem += pulp.lpSum(j.gpus * x[(j.job_id, g)] for j in jobs if (j.job_id, g) in x) <= capacity[g]
    problem.solve(pulp_highs())
    return {k: v.value() or 0.0 for k, v in x.items() if (v.value() or 0.0) > 1e-6}


class GavelMaxMinFairness(TimePolicy):
    key = "gavel-mmf"
    round_based = True

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self._cached: tuple[frozenset[int], dict[tuple[int, str], float]] | None = None

    def allocation(self, view: ClusterView) -> dict[tuple[int, str], float]:
        ids = frozenset(j.job_id for j in view.jobs)
        if self._cached is None or self._cached[0] != ids:
            self._cached = (ids, max_min_fairness_lp(view, view.jobs))
        return self._cached[1]

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        x = self.allocation(view)
        by_id = {j.job_id: j for j in view.jobs}

        def priority(key: tuple[int, str]) -> tuple[float, float, int]:
            job = by_id[key[0]]
            elapsed = max(view.now - job.arrival, 1e-9)
            share = job.received_s.get(key[1], 0.0) / elapsed
            return (-(x[key] / share) if share > 0 else -float("inf"), job.arrival, job.job_id)

        free = view.free()
        out: dict[int, Placement] = {}
        for job_id, gpu_type in sorted(x, key=priority):
            if job_id in out:
                continue
            job = by_id[job_id]
            current = job.placement if job.running and all(t == gpu_type for g in job.placement for _, t, _ in g) else ()
            placement = current if current and free.fits(current) else _gang(free, gpu_type, job.gpus)
            if placement:
                free.take(placement)
                out[job_id] = placement
        return out


def _gang(free: Free, gpu_type: str, k: int) -> Placement:
    gang = free.gang_of_type(gpu_type, k)
    return (gang,) if gang else ()
