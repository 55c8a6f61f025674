"""SJF-BCO (seed 004, Algorithms 1-3) and the GPU-level plan executor shared with FF, LS and RAND.

Algorithm 1 builds a schedule by running the cluster forward in time. Jobs are taken
smallest first; each starts at the current time on GPUs that are idle now and whose
accumulated execution time U plus the job's rho_hat/u stays <= theta: FA-FFP (Alg. 2,
the least-U idle GPUs, ties packed onto occupied servers) for jobs of at most kappa GPUs,
LBSGF (Alg. 3, the least busy servers holding lambda * G_j GPUs, then their least-U idle
GPUs) for larger ones. When too few GPUs qualify the clock moves to the next job exit
(Alg. 2 lines 8-9, Alg. 3 lines 11-12), so jobs start in that order. A job's completion
time T_j uses eqs. 6-8 with the contention of the spread jobs running at its start.
For each theta every kappa is tried and the smallest makespan kept; theta is bisected over
[1, T] towards the tightest feasible limit, T = the makespan of the plan without a limit.
rho_hat/u = the job's uncontended single-server time, a lower bound of its run time.
The plan is executed non-preemptively in its order per GPU: a job starts when all its GPUs
are idle and no job planned before it on one of them waits. Re-planned when jobs arrive.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

from slurmhet.policies.base import ClusterView, JobState, Placement, TimePolicy, make_gang

Gpu = tuple[str, str, int]  # (node, type, index)
Picker = Callable[["PlanState", JobState, float, float], list[Gpu] | None]
Plan = tuple[float, dict[int, list[Gpu]]]  # (makespan, job -> GPUs)


@dataclass
class PlanState:
    """The simulated cluster while a plan is built: U per GPU, when each GPU is idle again, the clock."""

    load: dict[Gpu, float]  # U_s^g, GPUs in server order
    free_at: dict[Gpu, float]
    servers: dict[str, list[Gpu]]
    #: (end, servers) of every job running on more than one server, for eq. (6).
    spread: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    now: float = 0.0

    def copy(self) -> "PlanState":
        return PlanState(dict(self.load), dict(self.free_at), self.servers, list(self.spread), self.now)

    def idle(self) -> list[Gpu]:
        """The available GPUs at the current time, in server order."""
        return [g for g, t in self.free_at.items() if t <= self.now]

    def occupied_servers(self) -> set[str]:
        return {g[0] for g, t in self.free_at.items() if t > self.now}

    def advance(self) -> bool:
        """Waits for the next job exit; False when nothing runs (the job can never be placed)."""
        later = [t for t in self.free_at.values() if t > self.now]
        if not later:
            return False
        self.now = min(later)
        self.spread = [s for s in self.spread if s[0] > self.now]
        return True

    def contenders(self, servers: set[str]) -> int:
        """p_j of eq. (6) for a job starting now on ``servers``, itself included."""
        if len(servers) <= 1:
            return 1
        return 1 + max(sum(1 for end, used in self.spread if end > self.now and s in used) for s in servers)

    def start(self, gpus: list[Gpu], lower: float, duration: float) -> None:
        for g in gpus:
            self.load[g] += lower
            self.free_at[g] = self.now + duration
        servers = frozenset(g[0] for g in gpus)
        if len(servers) > 1:
            self.spread.append((self.now + duration, servers))


def run_time(view: ClusterView, job: JobState, gpus: list[Gpu], contenders: int) -> float:
    """The job's remaining run time on ``gpus`` (eq. 8) with ``contenders`` sharing its bottleneck link."""
    rate = view.rates.gang_rate(job.job_type, job.gpus, make_gang(_counts(gpus)), contenders=contenders)
    return job.remaining / rate if rate > 0 else float("inf")


def _counts(gpus: list[Gpu]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for node, t, _ in gpus:
        out[(node, t)] = out.get((node, t), 0) + 1
    return out


def fa_ffp(state: PlanState, job: JobState, theta: float, rho: float) -> list[Gpu] | None:
    """Algorithm 2: the idle GPUs with the least U within theta; ties go to occupied servers (packing)."""
    occupied = state.occupied_servers()
    ok = [g for g in state.idle() if state.load[g] + rho <= theta]
    if len(ok) < job.gpus:
        return None
    ok.sort(key=lambda g: (state.load[g], g[0] not in occupied))
    return ok[: job.gpus]


def lbsgf(state: PlanState, job: JobState, theta: float, rho: float, lam: float = 1.0) -> list[Gpu] | None:
    """Algorithm 3: the least busy servers (mean U) holding lambda * G_j GPUs, then their least-U idle GPUs."""
    ranked = sorted(state.servers, key=lambda s: sum(state.load[g] for g in state.servers[s]) / len(state.servers[s]))
    chosen, size = [], 0
    for server in ranked:
        chosen.append(server)
        size += len(state.servers[server])
        if size >= lam * job.gpus:
            break
    ok = [g for s in chosen for g in state.servers[s]
          if state.free_at[g] <= state.now and state.load[g] + rho <= theta]
    if len(ok) < job.gpus:
        return None
    ok.sort(key=lambda g: state.load[g])
    return ok[: job.gpus]


def build_plan(view: ClusterView, jobs: list[JobState], state: PlanState, theta: float, pick: Picker) -> Plan | None:
    """Algorithm 1 lines 9-16 for one (theta, kappa): each job in order at the first time ``pick`` finds GPUs."""
    state = state.copy()
    plan: dict[int, list[Gpu]] = {}
    makespan = max(state.free_at.values(), default=0.0)
    for job in jobs:
        lower = view.remaining_time(job)  # rho_hat / u
        gpus = pick(state, job, theta, lower)
        while gpus is None:
            if not state.advance():
                return None
            gpus = pick(state, job, theta, lower)
        duration = run_time(view, job, gpus, state.contenders({g[0] for g in gpus}))
        state.start(gpus, lower, duration)
        makespan = max(makespan, state.now + duration)
        plan[job.job_id] = gpus
    return makespan, plan


def bisect_theta(attempts: Callable[[float], list[Plan | None]]) -> dict[int, list[Gpu]]:
    """Algorithm 1 lines 4-24: bisection on integer theta over [1, T], keeping the plan of least makespan.

    The search moves to the tightest theta for which some attempt places every job (the
    text and Lemma 2); the plan kept is the best makespan seen (lines 17-20). T is the
    makespan of the plan without a limit (no GPU's U exceeds it), which is the fallback.
    """
    def best_of(theta: float) -> Plan | None:
        return min((a for a in attempts(theta) if a is not None), key=lambda a: a[0], default=None)

    best = best_of(math.inf)
    if best is None:
        raise ValueError("a job needs more GPUs than the cluster has")
    left, right = 1, math.ceil(best[0])
    while left <= right:
        theta = (left + right) // 2
        found = best_of(theta)
        if found is None:
            left = theta + 1
            continue
        right = theta - 1
        if found[0] < best[0]:
            best = found
    return best[1]


class GpuPlanPolicy(TimePolicy):
    """Plans GPU-level queues for waiting jobs and starts each job when its GPUs are idle, in plan order per GPU."""

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        super().__init__(seed, round_s)
        self.rng = random.Random(seed)
        self.plan: dict[int, list[Gpu]] = {}
        self.order: list[int] = []
        self.held: dict[int, list[Gpu]] = {}

    def plan_jobs(self, view: ClusterView, jobs: list[JobState], state: PlanState) -> dict[int, list[Gpu]]:
        raise NotImplementedError

    def initial_state(self, view: ClusterView, active: dict[int, JobState]) -> PlanState:
        """Every GPU in server order; a held GPU is busy (and loaded) for its job's remaining time."""
        rank = {node: i for i, node in enumerate(view.node_order)}
        slots = sorted(view.capacity.items(), key=lambda kv: (rank.get(kv[0][0], len(rank)), kv[0]))
        gpus = [(n, t, i) for (n, t), c in slots for i in range(c)]
        state = PlanState(dict.fromkeys(gpus, 0.0), dict.fromkeys(gpus, 0.0), {})
        for g in gpus:
            state.servers.setdefault(g[0], []).append(g)
        for job_id, held in self.held.items():
            left = view.remaining_time(active[job_id])
            state.start(held, left, left)
        return state

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        active = {j.job_id: j for j in view.jobs}
        self.held = {j: g for j, g in self.held.items() if j in active and active[j].running}
        waiting = [j for j in view.jobs if not j.running]
        if any(j.job_id not in self.plan for j in waiting):
            jobs = sorted(waiting, key=lambda j: (j.gpus, view.remaining_time(j), j.job_id))
            self.plan = self.plan_jobs(view, jobs, self.initial_state(view, active))
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
        kappas = [self.kappa] if self.kappa is not None else sorted({j.gpus for j in jobs})

        def attempts(theta: float) -> list[Plan | None]:
            out = []
            for kappa in kappas:
                def pick(s: PlanState, j: JobState, th: float, rho: float, kappa: int = kappa) -> list[Gpu] | None:
                    return fa_ffp(s, j, th, rho) if j.gpus <= kappa else lbsgf(s, j, th, rho, self.lam)
                out.append(build_plan(view, jobs, state, theta, pick))
            return out

        return bisect_theta(attempts)
