"""Hare (seed 000, section 5): relaxation, middle completion times H_i, Algorithm 1's list scheduling.

Hare_Sched_RL (9) is a mixed-integer quadratic program per GPU. We solve the documented
equivalent LP of its aggregated form (Hall-Schulz-Shmoys-Wein), from the decision time
``now`` on the work that remains: completion times C_n with
    C_n >= now + L_n                                             (release (4), round chain (7)),
    sum_{n in S} P_n (C_n - now) >= (sum_S P_n)^2 / (2M) + sum_S P_n^2 / 2   for job sets S  (9 summed over GPUs),
where P_n is job n's remaining GPU-seconds at the cluster's mean per-GPU speed, L_n its
remaining rounds back to back on its fastest type and M the GPU count. Sets S are
generated lazily: the prefixes of the current C order that violate (9).

A task is one training round. The task Algorithm 1 lists next for job n is its next
round, which the relaxation starts at x_n = C_n - L_n (the remaining rounds back to back
before C_n), so H_n = x_n + (its slowest task time) / 2, H_{i,m}'s maximum over GPUs.
Fast task switching lets Hare hand GPUs to other tasks at every round, so at every
decision (arrival or completion, where the LP is re-solved) every job is re-listed in H
order and its round's k tasks go to the GPUs where they finish first (Algorithm 1 lines
12-16; the idle GPUs all have the earliest available time, now). With relaxed
scale-fixed synchronisation a round keeps its k tasks but may run them on fewer GPUs.
"""

from __future__ import annotations

import pulp

from slurmhet.planner.solver import pulp_highs
from slurmhet.policies.base import ClusterView, Free, JobState, Placement, TimePolicy, make_gang


def relaxation_order(view: ClusterView, jobs: list[JobState], rounds: int = 6) -> dict[int, float]:
    """H_n of every job's next round from the LP relaxation; a smaller H is listed earlier."""
    capacity = view.type_capacity()
    gpus = sum(capacity.values())
    length, volume, slowest = {}, {}, {}
    for job in jobs:
        speeds = {t: view.rates.type_rate(job.job_type, job.gpus, t) / job.gpus for t in capacity}
        mean = sum(speeds[t] * c for t, c in capacity.items()) / gpus
        length[job.job_id] = view.remaining_time(job)
        volume[job.job_id] = job.remaining / mean if mean > 0 else length[job.job_id] * job.gpus
        slowest[job.job_id] = max(1 / s for s in speeds.values() if s > 0)
    problem = pulp.LpProblem("hare_sched_rl", pulp.LpMinimize)
    c = {j.job_id: problem.add_variable(f"c_{j.job_id}", max(j.arrival, view.now) + length[j.job_id]) for j in jobs}
    problem += pulp.lpSum(j.weight * c[j.job_id] for j in jobs)
    order = sorted(jobs, key=lambda j: volume[j.job_id] / j.weight)
    for _ in range(rounds):
        added = 0
        prefix, total, squares = [], 0.0, 0.0
        for job in order:
            prefix.append(job.job_id)
            total += volume[job.job_id]
            squares += volume[job.job_id] ** 2
            bound = total * total / (2 * gpus) + squares / 2 + view.now * total
            current = sum(volume[i] * (c[i].value() or 0.0) for i in prefix) if problem.status else -1.0
            if current < bound * (1 - 1e-6):
                problem += pulp.lpSum(volume[i] * c[i] for i in prefix) >= bound
                added += 1
        if not added:
            break
        problem.solve(pulp_highs())
        order = sorted(jobs, key=lambda j: c[j.job_id].value() or 0.0)
    return {j.job_id: (c[j.job_id].value() or 0.0) - length[j.job_id] + slowest[j.job_id] / 2 for j in jobs}


class Hare(TimePolicy):
    key = "hare"

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self._h: dict[int, float] = {}

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        if {j.job_id for j in view.jobs} != set(self._h):  # an arrival or a completion: re-solve what remains
            self._h = relaxation_order(view, view.jobs)
        order = sorted(view.jobs, key=lambda j: (self._h[j.job_id], j.arrival, j.job_id))
        free = view.free()
        out: dict[int, Placement] = {}
        for job in order:  # every job is re-listed: a running job keeps no GPU an earlier-listed one wants
            placement = earliest_finish(view, job, free)
            if placement:
                free.take(placement)
                out[job.job_id] = placement
        return out


def earliest_finish(view: ClusterView, job: JobState, free: Free) -> Placement | None:
    """Algorithm 1, lines 12-16, for one round's k tasks: each task goes where it finishes first.

    Idle GPUs are taken fastest first for this job; the number used is the one with the
    shortest round (a slow GPU is left out when running two tasks on a fast one finishes
    earlier). The job's current GPUs are kept when they are still idle and as fast (no switch).
    """
    speed = {t: view.rates.type_rate(job.job_type, job.gpus, t) for t in view.gpu_types()}
    gpus = [s for s, c in sorted(free.counts.items(), key=lambda sc: (-speed.get(sc[0][1], 0), -sc[1], sc[0]))
            if speed.get(s[1], 0) > 0 for _ in range(c)][: job.gpus]
    best, best_rate = None, 0.0
    for m in range(1, len(gpus) + 1):
        take: dict[tuple[str, str], int] = {}
        for slot in gpus[:m]:
            take[slot] = take.get(slot, 0) + 1
        gang = make_gang(take)
        rate = view.rates.gang_rate(job.job_type, job.gpus, gang)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = gang, rate
    current = job.placement
    if current and free.fits(current) and view.rates.rate(job.job_type, job.gpus, current) >= best_rate * (1 - 1e-9):
        return current
    return (best,) if best else None
