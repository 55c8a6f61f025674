"""JPS, job-prioritised sampling (seed 001 section V, Algorithm 3).

1. Sort jobs by ``T_i |Pi_i| / (S sum_k rho_ik)`` ascending, so that the rear
   of Psi (Algorithm 1's order) gives the heavy jobs more workers;
2. draw N categories uniformly from the rear part ``Psi[alpha |Psi|, |Psi|)``
   (by unranking, so K in the hundreds works);
3. solve each with the matching market (Algorithm 2) and score it by the
   average JCT Lambda_n and Jain's fairness F_n (eq. 33, against the equal
   shares of eq. 32);
4. keep ``argmax beta * min(Lambda) / Lambda_n + (1 - beta) * F_n`` (eq. 34).

Sampling is seeded, so a fixed seed gives a fixed plan.
"""

from __future__ import annotations

import random
import time
from functools import partial

from slurmhet.errors import InputError
from slurmhet.planner.has import Slots, category_slots, category_space, total_cost, unrank_category
from slurmhet.planner.model import Progress, equal_share_seconds, jain_fairness
from slurmhet.planner.problem import Problem


def jps(problem: Problem, progress: Progress | None = None, *, samples: int = 20, alpha: float = 0.7,
        beta: float = 1.0, cap_s: float = 60.0) -> list[Slots]:
    gpus, jobs, total = category_space(problem, "jps")
    all_rates = [sum(problem.rates[j, t] for _, t in gpus) for j in range(jobs)]
    order = sorted(range(jobs), key=lambda j: (problem.jobs[j].samples_remaining / (jobs * all_rates[j]), j))
    first = int(alpha * total)
    pool = total - first
    rng = random.Random(problem.seed)
    count = min(samples, pool)
    if pool < 2**62:
        ranks = sorted(rng.sample(range(pool), count))
    else:  # |Psi| beyond a machine integer (K in the hundreds): draw distinct ranks one by one
        picked: set[int] = set()
        while len(picked) < count:
            picked.add(rng.randrange(pool))
        ranks = sorted(picked)
    equal = {problem.jobs[j].id: equal_share_seconds(problem.jobs[j], all_rates[j], len(gpus), jobs, problem.inter_gbps)
             for j in range(jobs)}
    deadline = (f"jps-{samples}", time.monotonic() + cap_s, cap_s)
    scored = []
    for done, rank in enumerate(ranks):
        slots = category_slots(problem, unrank_category(first + rank, jobs, len(gpus)), order, gpus, deadline)
        if slots is not None:
            run = {problem.jobs[j].id: problem.alloc_cost(j, s) / problem.jobs[j].weight for j, s in enumerate(slots)}
            scored.append((total_cost(problem, slots), jain_fairness(run, equal), done, slots))
        if progress:
            progress(done + 1, len(ranks), f"jps-{samples}: samples")
    if not scored:
        raise InputError("no sampled category respects the jobs' GPU limits", place=f"policy jps-{samples}",
                         hint="raise N or use the default planner")
    lowest = min(s[0] for s in scored)
    best = max(scored, key=lambda s: (beta * lowest / s[0] + (1 - beta) * s[1], -s[2]))
    return best[3]


def jps_policy(samples: int, alpha: float = 0.7, beta: float = 1.0, cap_s: float = 60.0) -> partial:
    """JPS with fixed N, alpha, beta (jps-20/40/60 use alpha 0.7, beta 1.0); the seed is PlanningInput.seed."""
    return partial(jps, samples=samples, alpha=alpha, beta=beta, cap_s=cap_s)
