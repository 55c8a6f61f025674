"""slurmhet's default policy over time (key ``slurmhet``).

Decides at every arrival and completion (no idle round tails):
1. order: jobs on the critical path (remaining time >= half the makespan lower bound,
   total remaining GPU-time / GPUs) first, longest first, so that no long job sets
   the makespan by starting last; then weighted shortest remaining time first (Smith's
   rule on the job's fastest type, seed 000's weighted-JCT objective); running jobs get
   a hysteresis bonus so that a small gain never pays a checkpoint-restart;
2. size and placement: among keeping the current GPUs, a whole gang of each GPU type,
   and a multi-type gang with throughput-proportional sharding (seed 001), pick the
   earliest predicted finish, counting the restart and the ring-all-reduce contention
   with gangs already spread over the same servers (seed 004);
3. when no whole gang fits, relaxed scale-fixed synchronisation (seed 000): the job keeps
   its global batch and runs its tasks on the idle GPUs it can get, if that beats waiting.
"""

from __future__ import annotations

from collections import defaultdict

from slurmhet.planner.time_base import ClusterView, Free, Gang, JobState, Placement, Slot, TimePolicy, make_gang


class SlurmhetOverTime(TimePolicy):
    key = "slurmhet"
    sharding = "proportional"
    restart_s = 10.0
    #: A running job's priority is multiplied by this (lower key = earlier) to avoid thrashing.
    hysteresis = 0.5

    #: A job whose remaining time is at least this share of the makespan lower bound is critical.
    critical_share = 0.5

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        gpus = sum(view.capacity.values())
        bound = sum(view.remaining_time(j) * j.gpus for j in view.jobs) / max(gpus, 1)

        def key(job: JobState) -> tuple[bool, float, float, int]:
            left = view.remaining_time(job)
            if left >= self.critical_share * bound:  # on the critical path: longest first, or it sets the makespan
                return (False, -left, job.arrival, job.job_id)
            bonus = self.hysteresis if job.running else 1.0
            return (True, left / job.weight * bonus, job.arrival, job.job_id)

        free = view.free()
        spread_on: dict[str, int] = defaultdict(int)
        out: dict[int, Placement] = {}
        for job in sorted(view.jobs, key=key):
            choice = self._choose(view, job, free, spread_on)
            if choice is None:
                continue
            free.take(choice)
            out[job.job_id] = choice
            for gang in choice:
                nodes = {n for n, _, _ in gang}
                if len(nodes) > 1:
                    for node in nodes:
                        spread_on[node] += 1
        return out

    def _choose(self, view: ClusterView, job: JobState, free: Free, spread_on: dict[str, int]) -> Placement | None:
        candidates: list[Gang] = []
        if job.running and free.fits(job.placement):
            candidates.append(job.placement[0])
        for gpu_type in view.runnable_types(job):
            gang = free.gang_of_type(gpu_type, job.gpus)
            if gang is not None:
                candidates.append(gang)
        mixed = self._mixed_gang(view, job, free, job.gpus)
        if mixed is not None:
            candidates.append(mixed)
        if not candidates:
            relaxed = self._mixed_gang(view, job, free, min(job.gpus, free.total()))
            if relaxed is None:
                return None
            rate = view.rates.gang_rate(job.job_type, job.gpus, relaxed, self.sharding)
            # Run on fewer GPUs only if it finishes before a full gang of the best type could (ideal) run it.
            if rate <= 0 or job.remaining / rate > 2 * view.remaining_time(job):
                return None
            return (relaxed,)
        best, best_finish = None, float("inf")
        for gang in candidates:
            servers = {n for n, _, _ in gang}
            contenders = 1 + max((spread_on[s] for s in servers), default=0) if len(servers) > 1 else 1
            rate = view.rates.gang_rate(job.job_type, job.gpus, gang, self.sharding, contenders)
            delay = 0.0 if (gang,) == job.placement or not (job.running or job.remaining < job.total_steps) \
                else self.restart_s
            finish = delay + job.remaining / rate if rate > 0 else float("inf")
            if finish < best_finish:
                best, best_finish = gang, finish
        return (best,) if best is not None else None

    @staticmethod
    def _mixed_gang(view: ClusterView, job: JobState, free: Free, k: int) -> Gang | None:
        """``k`` of the job's fastest idle GPUs, on one node if one has them, else fewest nodes."""
        if k <= 0:
            return None
        speed = {t: view.rates.type_rate(job.job_type, job.gpus, t) for t in view.gpu_types()}
        slots = [(s, c) for s, c in free.counts.items() if c > 0 and speed.get(s[1], 0) > 0]
        per_node: dict[str, int] = defaultdict(int)
        for (node, _), c in slots:
            per_node[node] += c
        single = [n for n, c in per_node.items() if c >= k]
        if single:
            node = max(single, key=lambda n: (sum(speed[t] * c for (m, t), c in slots if m == n) / per_node[n], n))
            slots = [s for s in slots if s[0][0] == node]
        elif sum(per_node.values()) < k:
            return None
        take: dict[Slot, int] = {}
        for (slot, count) in sorted(slots, key=lambda s: (-speed[s[0][1]], -per_node[s[0][0]], s[0])):
            use = min(count, k - sum(take.values()))
            if use > 0:
                take[slot] = use
        return make_gang(take)
