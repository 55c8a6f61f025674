"""SJF-BCO (seed 004, Algorithms 1-3) and the GPU-level plan executor shared with FF, LS and RAND.

A plan assigns every waiting job a set of GPUs; bisection on the per-GPU execution-time
limit theta finds the tightest limit under which every job can be placed (a GPU's
accumulated time plus the job's estimated run time rho_hat must stay <= theta). For each
theta, SJF-BCO tries every kappa (only the distinct job sizes matter): jobs of at most
kappa GPUs use FA-FFP (the least-loaded feasible GPUs, packing onto servers already in
use), larger jobs use LBSGF (the least busy servers holding lambda * G_j GPUs, then
their least-loaded GPUs). rho_hat comes from the job model without contention (its
lower bound, rho/u). The plan is executed non-preemptively: a job starts when all its
GPUs are idle and it is next in each of their queues. Re-planned when jobs arrive.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

from slurmhet.planner.time_base import ClusterView, JobState, Placement, TimePolicy, make_gang

Gpu = tuple[str, str, int]  # (node, type, index)
Picker = Callable[["PlanState", JobState, float, float], list[Gpu] | None]


@dataclass
class PlanState:
    """Accumulated execution time U per GPU while a plan is built."""

    load: dict[Gpu, float]
    servers: dict[str, list[Gpu]]
    used_servers: set[str] = field(default_factory=set)

    def copy(self) -> "PlanState":
        return PlanState(dict(self.load), self.servers, set(self.used_servers))


def rho_hat(view: ClusterView, job: JobState, gpus: list[Gpu]) -> float:
    gang = make_gang(_counts(gpus))
    rate = view.rates.gang_rate(job.job_type, job.gpus, gang)
    return job.remaining / rate if rate > 0 else float("inf")


def _counts(gpus: list[Gpu]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for node, t, _ in gpus:
        out[(node, t)] = out.get((node, t), 0) + 1
    return out


def fa_ffp(state: PlanState, job: JobState, theta: float, rho: float) -> list[Gpu] | None:
    """Algorithm 2: least-loaded GPUs within theta, preferring servers already in use."""
    ok = [g for g, u in state.load.items() if u + rho <= theta]
    if len(ok) < job.gpus:
        return None
    ok.sort(key=lambda g: (state.load[g], g[0] not in state.used_servers, g))
    return ok[: job.gpus]


def lbsgf(state: PlanState, job: JobState, theta: float, rho: float, lam: float = 1.0) -> list[Gpu] | None:
    """Algorithm 3: the least busy servers with lambda * G_j GPUs, then their least-loaded GPUs."""
    ranked = sorted(state.servers, key=lambda s: (sum(state.load[g] for g in state.servers[s])
                                                  / len(state.servers[s]), s))
    chosen, size = [], 0
    for server in ranked:
        chosen.append(server)
        size += len(state.servers[server])
        if size >= lam * job.gpus:
            break
    ok = [g for s in chosen for g in state.servers[s] if state.load[g] + rho <= theta]
    if len(ok) < job.gpus:
        return None
    ok.sort(key=lambda g: (state.load[g], g))
    return ok[: job.gpus]


def build_plan(view: ClusterView, jobs: list[JobState], state: PlanState, theta: float,
               pick: Callable[[PlanState, JobState, float, float], list[Gpu] | None]) -> tuple[float, dict[int, list[Gpu]]] | None:
    """Place every job under limit theta; returns (makespan estimate, job -> GPUs) or None."""
    state = state.copy()
    plan: dict[int, list[Gpu]] = {}
    makespan = 0.0
    for job in jobs:
        consolidated = view.remaining_time(job)
        gpus = pick(state, job, theta, consolidated)
        if gpus is None:
            return None
        rho = rho_hat(view, job, gpus)
        start = max(state.load[g] for g in gpus)
        for g in gpus:
            state.load[g] = start + rho
            state.used_servers.add(g[0])
        makespan = max(makespan, start + rho)
        plan[job.job_id] = gpus
    return makespan, plan


def bisect_theta(view: ClusterView, jobs: list[JobState], state: PlanState,
                 attempts: Callable[[float], list[tuple[float, dict[int, list[Gpu]]] | None]]) -> dict[int, list[Gpu]]:
    """Algorithm 1's outer loop: bisection on theta over [1, T], keeping the best makespan."""
    horizon = max(state.load.values(), default=0.0) + sum(view.remaining_time(j) for j in jobs) + 1.0
    left, right = 1.0, horizon
    best: tuple[float, dict[int, list[Gpu]]] | None = None
    while right - left > max(1.0, 1e-3 * horizon):
        theta = (left + right) / 2
        found = [a for a in attempts(theta) if a is not None]
        if found:
            candidate = min(found, key=lambda a: a[0])
            if best is None or candidate[0] < best[0]:
                best = candidate
            right = theta
        else:
            left = theta
    if best is None:
        found = [a for a in attempts(float("inf")) if a is not None]
        best = min(found, key=lambda a: a[0])
    return best[1]


class GpuPlanPolicy(TimePolicy):
    """Plans GPU-level queues for waiting jobs and starts jobs whose GPUs are all idle."""

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self.rng = random.Random(seed)
        self.plan: dict[int, list[Gpu]] = {}
        self.order: list[int] = []
        self.held: dict[int, list[Gpu]] = {}

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        raise NotImplementedError

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        active = {j.job_id: j for j in view.jobs}
        self.held = {j: g for j, g in self.held.items() if j in active and active[j].running}
        waiting = [j for j in view.jobs if not j.running]
        if any(j.job_id not in self.plan for j in waiting):
            gpus = [(n, t, i) for (n, t), c in sorted(view.capacity.items()) for i in range(c)]
            load = dict.fromkeys(gpus, 0.0)
            for job_id, held in self.held.items():
                for g in held:
                    load[g] = view.remaining_time(active[job_id])
            servers: dict[str, list[Gpu]] = {}
            for g in gpus:
                servers.setdefault(g[0], []).append(g)
            jobs = sorted(waiting, key=lambda j: (j.gpus, view.remaining_time(j), j.job_id))
            self.plan = self.plan_jobs(view, jobs, PlanState(load, servers))
            self.order = [j.job_id for j in jobs]
        busy = {g for held in self.held.values() for g in held}
        claimed: set[Gpu] = set()
        for job_id in self.order:
            if job_id not in active or active[job_id].running or job_id not in self.plan:
                continue
            gpus = self.plan[job_id]
            if not busy.intersection(gpus) and not claimed.intersection(gpus):
                self.held[job_id] = gpus
                busy.update(gpus)
            claimed.update(gpus)  # later jobs queue behind this one on these GPUs
        return {j: (make_gang(_counts(g)),) for j, g in self.held.items()}


class SjfBco(GpuPlanPolicy):
    key = "sjf-bco"
    #: Tuning knob lambda of LBSGF (the paper's Fig. 7); 1 = the fewest servers.
    lam = 1.0
    #: Fixed kappa instead of the loop over all sizes (the kappa sweep sets it).
    kappa: int | None = None

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        sizes = sorted({j.gpus for j in jobs})
        kappas = [self.kappa] if self.kappa is not None else sizes

        def attempts(theta: float) -> list[tuple[float, dict[int, list[Gpu]]] | None]:
            out = []
            for kappa in kappas:
                def pick(s: PlanState, j: JobState, th: float, rho: float, kappa: int = kappa) -> list[Gpu] | None:
                    return fa_ffp(s, j, th, rho) if j.gpus <= kappa else lbsgf(s, j, th, rho, self.lam)
                out.append(build_plan(view, jobs, state, theta, pick))
            return out

        return bisect_theta(view, jobs, state, attempts)
