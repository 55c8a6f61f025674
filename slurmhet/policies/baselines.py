"""Baseline policies over time, each as its paper describes it (Gavel's are in ``gavel``).

- ``Srtf``: shortest remaining time (on the job's fastest type) first, preemptive at events.
- ``SchedHomo`` (Hare's Sched_Homo): weighted shortest processing time (Smith's rule) with
  heterogeneity-oblivious durations (mean over types), type-blind, job-level non-preemptive.
- ``Tiresias``: discretised 2-queue least-attained-service (GPU-seconds), FIFO inside a queue,
  PromoteKnob off, type-blind, preempts only the lowest-priority jobs it needs GPUs from.
- ``YarnCs``: YARN's capacity scheduler: FIFO, non-preemptive, type-blind, head-of-line blocking.
- Both place a job on one server (two or more only when it needs more than a server holds).
- ``FirstFit``, ``ListScheduling``, ``RandomPlacement``: seed 004's FF, LS and RAND, GPU-level plans
  executed like SJF-BCO's.
"""

from __future__ import annotations

from collections import defaultdict

import pulp

from slurmhet.policies.sjf_bco import Gpu, GpuPlanPolicy, PlanState, bisect_theta, build_plan
from slurmhet.planner.solver import pulp_highs
from slurmhet.policies.base import (ClusterView, Free, JobState, Placement, TimePolicy, greedy_fill,
                                       make_gang)


def fastest_gang(view: ClusterView, job: JobState, free: Free) -> Placement | None:
    """The job's full gang on the fastest type that has enough idle GPUs."""
    for gpu_type in view.runnable_types(job):
        gang = free.gang_of_type(gpu_type, job.gpus)
        if gang is not None:
            return (gang,)
    return None


def blind_gang(view: ClusterView, job: JobState, free: Free) -> Placement | None:
    """Any idle GPUs, first fit in node order, ignoring speed (only types that can hold the job)."""
    gang = free.gang_any(job.gpus, view.node_order, view.runnable_types(job))
    return (gang,) if gang is not None else None


class Srtf(TimePolicy):
    key = "srtf"

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        order = sorted(view.jobs, key=lambda j: (view.remaining_time(j), j.arrival, j.job_id))
        return greedy_fill(view, order, lambda j, f: fastest_gang(view, j, f), preemptive=True)


class SchedHomo(TimePolicy):
    key = "sched-homo"

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        types = view.gpu_types()

        def homo_time(job: JobState) -> float:
            mean = sum(view.rates.type_rate(job.job_type, job.gpus, t) for t in types) / len(types)
            return job.remaining / mean if mean > 0 else float("inf")

        order = sorted(view.jobs, key=lambda j: (homo_time(j) / j.weight, j.arrival, j.job_id))
        return greedy_fill(view, order, lambda j, f: blind_gang(view, j, f), preemptive=False)


def server_gang(view: ClusterView, job: JobState, free: Free) -> Placement | None:
    """Type-blind consolidated placement (the MS-YARN scheme of Tiresias's simulator).

    A job that fits on one server gets the first server in node order with enough idle
    GPUs, or waits; a larger one takes whole idle servers plus one server for the rest, all
    of one hardware kind (the first kind in node order that has room; kinds are mixed only
    for a job no kind can ever hold). Seed 003 (V-A): these baselines run a job on one node
    at a time and wait for enough homogeneous GPUs.
    """
    allowed = set(view.runnable_types(job))
    size: dict[str, int] = defaultdict(int)
    idle: dict[str, int] = defaultdict(int)
    kinds: dict[str, set[str]] = defaultdict(set)
    for (node, gpu_type), count in view.capacity.items():
        if gpu_type in allowed:
            size[node] += count
            idle[node] += free.counts.get((node, gpu_type), 0)
            kinds[node].add(gpu_type)
    nodes = [n for n in view.node_order if size[n]]
    chosen: list[str] | None = None
    if job.gpus <= max(size.values(), default=0):
        chosen = next(([n] for n in nodes if idle[n] >= job.gpus), None)
    else:
        groups = [[n for n in nodes if kinds[n] == kind] for kind in dict.fromkeys(frozenset(kinds[n]) for n in nodes)]
        for same in [g for g in groups if sum(size[n] for n in g) >= job.gpus] or [nodes]:
            pick, left = [], job.gpus
            for node in same:
                if idle[node] == size[node] <= left:
                    pick.append(node)
                    left -= size[node]
            rest = next((n for n in same if n not in pick and idle[n] >= left), None) if left else None
            if not left or rest is not None:
                chosen = pick + ([rest] if rest is not None else [])
                break
    if chosen is None:
        return None
    take: dict[tuple[str, str], int] = {}
    left = job.gpus
    for node in chosen:
        for gpu_type in sorted(kinds[node]):
            use = min(free.counts.get((node, gpu_type), 0), left)
            if use > 0:
                take[(node, gpu_type)] = use
                left -= use
    return (make_gang(take),)


class Tiresias(TimePolicy):
    """Discretised 2D-LAS (Tiresias, NSDI'19) as seed 003 runs it: two queues, PromoteKnob off.

    A job enters queue 2 once it has attained ``threshold`` GPU-seconds. Jobs are admitted by
    GPU count in priority order (queue, then, inside a queue, running before waiting, then
    the time it entered the queue), skipping jobs that do not fit, as Tiresias's simulator does:
    a running job is preempted only when higher-priority jobs need its GPUs, and an admitted
    running job keeps its GPUs. New jobs are placed type-blind by ``server_gang``.
    """

    key = "tiresias"
    round_based = True
    #: Attained GPU-seconds that demote a job to the second queue (the simulator's 2-queue default).
    threshold = 3600.0

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self.demoted_at: dict[int, float] = {}

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        self.demoted_at = {j.job_id: self.demoted_at.get(j.job_id, view.now)
                           for j in view.jobs if j.attained_gpu_s >= self.threshold}

        def rank(job: JobState) -> tuple[bool, bool, float, float, int]:
            entered = self.demoted_at.get(job.job_id, job.arrival)
            return (job.job_id in self.demoted_at, not job.running, entered, job.arrival, job.job_id)

        order = sorted(view.jobs, key=rank)
        left = sum(view.capacity.values())
        admitted: set[int] = set()
        for job in order:
            if job.gpus <= left:
                admitted.add(job.job_id)
                left -= job.gpus
        kept = [j for j in order if j.running and j.job_id in admitted]
        rest = [j for j in order if not (j.running and j.job_id in admitted)]
        return greedy_fill(view, kept + rest, lambda j, f: server_gang(view, j, f), preemptive=True)


class YarnCs(TimePolicy):
    key = "yarn-cs"

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        return greedy_fill(view, view.jobs, lambda j, f: server_gang(view, j, f), preemptive=False, block=True)


def _first_fit(state: PlanState, job: JobState, theta: float, rho: float) -> list[Gpu] | None:
    """The first G_j available GPUs within theta, server by server."""
    ok = [g for g in state.idle() if state.load[g] + rho <= theta]
    return ok[: job.gpus] if len(ok) >= job.gpus else None


def _least_loaded(state: PlanState, job: JobState, theta: float, rho: float) -> list[Gpu] | None:
    """The G_j available GPUs with the least accumulated execution time within theta (ties: server order)."""
    ok = sorted((g for g in state.idle() if state.load[g] + rho <= theta), key=lambda g: state.load[g])
    return ok[: job.gpus] if len(ok) >= job.gpus else None


class FirstFit(GpuPlanPolicy):
    """FF (seed 004): the first G_j available GPUs within the limit, server by server; theta by bisection."""

    key = "ff"
    picker = staticmethod(_first_fit)

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        return bisect_theta(lambda theta: [build_plan(view, jobs, state, theta, self.picker)])


class ListScheduling(FirstFit):
    """LS (seed 004): the G_j available GPUs with the least execution time within the limit, wherever they are."""

    key = "ls"
    picker = staticmethod(_least_loaded)


class RandomPlacement(GpuPlanPolicy):
    """RAND (seed 004): random available servers and GPUs, limit theta = T (no bisection)."""

    key = "rand"

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        def pick(s: PlanState, job: JobState, theta: float, rho: float) -> list[Gpu] | None:
            idle = s.idle()
            return self.rng.sample(idle, job.gpus) if len(idle) >= job.gpus else None

        found = build_plan(view, jobs, state, float("inf"), pick)
        assert found is not None
        return found[1]


class SchedAllox(TimePolicy):
    """Sched_Allox (AlloX, via Hare): min-cost bipartite matching of jobs to (GPU type, position).

    Job j at the p-th position from the end of type g's queue costs p * t_jg (it delays p
    jobs), with t_jg its run time on type g scaled by the share of g it occupies; the
    assignment LP is integral. Each type then starts its matched jobs, last position
    first, while whole gangs fit. Job-level, non-preemptive, no intra-job parallelism.
    """

    key = "sched-allox"
    #: Waiting jobs considered per matching (the oldest), to bound the LP.
    window = 40

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        out = self.keep_running(view)
        capacity = view.type_capacity()
        # A job no type can hold (more GPUs than the type has) cannot be matched: left in, its "== 1" row would
        # make the whole LP infeasible and stall every other job.
        waiting = [j for j in view.jobs if not j.running and any(
            c >= j.gpus and view.rates.type_rate(j.job_type, j.gpus, g) > 0 for g, c in capacity.items())]
        waiting = waiting[: self.window]
        if not waiting:
            return out
        cost = {}
        for job in waiting:
            for g, c in capacity.items():
                rate = view.rates.type_rate(job.job_type, job.gpus, g)
                if rate > 0 and c >= job.gpus:
                    for p in range(1, len(waiting) + 1):
                        cost[(job.job_id, g, p)] = p * job.remaining / rate * job.gpus / c
        problem = pulp.LpProblem("allox_matching", pulp.LpMinimize)
        x = {k: problem.add_variable(f"x_{k[0]}_{k[1]}_{k[2]}", 0, 1) for k in cost}
        problem += pulp.lpSum(cost[k] * x[k] for k in x)
        for job in waiting:
            problem += pulp.lpSum(v for k, v in x.items() if k[0] == job.job_id) == 1
        for g in capacity:
            for p in range(1, len(waiting) + 1):
                problem += pulp.lpSum(v for k, v in x.items() if k[1] == g and k[2] == p) <= 1
        problem.solve(pulp_highs())
        matched = sorted((k for k, v in x.items() if (v.value() or 0) > 0.5), key=lambda k: (-k[2], k[0]))
        by_id = {j.job_id: j for j in waiting}
        free = view.free(out.values())
        for job_id, g, _ in matched:
            gang = free.gang_of_type(g, by_id[job_id].gpus)
            if gang is not None:
                free.take((gang,))
                out[job_id] = (gang,)
        return out
