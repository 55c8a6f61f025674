"""Hare (seed 000, section 5): relaxation, mid-completion order H_i, Algorithm 1's list scheduling.

Hare_Sched_RL (9) is a mixed-integer quadratic program per GPU. We solve the documented
equivalent LP of its aggregated form (Hall-Schulz-Shmoys-Wein): completion times C_n with
    C_n >= max(a_n, now) + L_n                          (release (4) and the round chain (7)),
    sum_{n in S} P_n C_n >= (sum_S P_n)^2 / (2M) + sum_S P_n^2 / 2   for job sets S  (9 summed over GPUs),
where P_n is job n's remaining GPU-seconds at the cluster's mean per-GPU speed, L_n its
remaining time on its fastest type and M the GPU count. Sets S are generated lazily:
the prefixes of the current C order that violate (9). H_n = C_n - L_n / 2 (the middle
completion time) orders the jobs; Algorithm 1 then hands each job, in that order, the
earliest-free GPUs (the idle ones, fastest first). With relaxed scale-fixed
synchronisation a round keeps its task count but may run on fewer GPUs sequentially.
The LP is re-solved when jobs arrive; tasks switch at every arrival and completion.
"""

from __future__ import annotations

import pulp

from slurmhet.planner.time_base import ClusterView, Free, JobState, Placement, TimePolicy, make_gang


def relaxation_order(view: ClusterView, jobs: list[JobState], rounds: int = 6) -> dict[int, float]:
    """H_n of every job from the LP relaxation; a smaller H runs earlier."""
    capacity = view.type_capacity()
    gpus = sum(capacity.values())
    length, volume = {}, {}
    for job in jobs:
        mean = sum(view.rates.type_rate(job.job_type, job.gpus, t) / job.gpus * c for t, c in capacity.items()) / gpus
        length[job.job_id] = view.remaining_time(job)
        volume[job.job_id] = job.remaining / mean if mean > 0 else length[job.job_id] * job.gpus
    problem = pulp.LpProblem("hare_sched_rl", pulp.LpMinimize)
    c = {j.job_id: pulp.LpVariable(f"c_{j.job_id}", max(j.arrival, view.now) + length[j.job_id]) for j in jobs}
    problem += pulp.lpSum(j.weight * c[j.job_id] for j in jobs)
    orders = [sorted(jobs, key=lambda j: volume[j.job_id] / j.weight)]
    for _ in range(rounds):
        added = 0
        for order in orders:
            prefix, total, squares = [], 0.0, 0.0
            for job in order:
                prefix.append(job.job_id)
                total += volume[job.job_id]
                squares += volume[job.job_id] ** 2
                bound = total * total / (2 * gpus) + squares / 2
                current = sum(volume[i] * (c[i].value() or 0.0) for i in prefix) if problem.status else -1.0
                if current < bound * (1 - 1e-6):
                    problem += pulp.lpSum(volume[i] * c[i] for i in prefix) >= bound
                    added += 1
        if not added:
            break
        problem.solve(pulp.HiGHS(msg=False))
        orders = [sorted(jobs, key=lambda j: c[j.job_id].value() or 0.0)]
    return {j.job_id: (c[j.job_id].value() or 0.0) - length[j.job_id] / 2 for j in jobs}


class Hare(TimePolicy):
    key = "hare"

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self._h: dict[int, float] = {}

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        if any(j.job_id not in self._h for j in view.jobs):
            self._h = relaxation_order(view, view.jobs)
        order = sorted(view.jobs, key=lambda j: (self._h[j.job_id], j.arrival, j.job_id))
        free = view.free()
        out: dict[int, Placement] = {}
        for job in order:  # a full gang keeps its GPUs; a relaxed one is re-listed to grow back
            whole = job.running and sum(c for g in job.placement for _, _, c in g) == job.gpus
            placement = job.placement if whole and free.fits(job.placement) else earliest_free(view, job, free)
            if placement:
                free.take(placement)
                out[job.job_id] = placement
        return out


def earliest_free(view: ClusterView, job: JobState, free: Free) -> Placement | None:
    """Algorithm 1, lines 12-16, for one round's k tasks: each task goes where it finishes first.

    Idle GPUs are taken fastest first; the number used is the one with the shortest round
    (a slow GPU is left out when running two tasks on a fast one finishes earlier).
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
    return (best,) if best else None
