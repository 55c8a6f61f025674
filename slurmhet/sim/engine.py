"""Discrete-event engine: replays a trace under one policy on one cluster.

Between two events (arrival, completion, round boundary, decision) every running
job progresses at a constant rate, so the engine jumps from event to event and
never steps through time. A round ends after ``round_s``; for a policy with
``round_ends_when_done`` also when every job running in it has finished (Gavel's
simulator, where a round lasts as long as its longest job). A changed allocation
costs a checkpoint-restart (``restart_s``) during which the job holds its GPUs but makes no progress; a first
start costs ``start_s`` the same way (process start-up, rendezvous: what a live
cluster charges every job); a job moved or paused during its start-up, with no progress to restart from,
goes on with what is left of it when placed again; a job running as several forked copies pays
``consolidate_s`` each round (HadarE).
Jobs a policy co-locates on one GPU (a ``Decision``'s ``shared`` groups, seed 002)
run at the measured co-located rates of the group (``RateModel.colocated_rates``);
a group the job model cannot price is refused. Every decision is checked against
the capacity of every (node, GPU type), a shared GPU counting once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from slurmhet.cluster import Inventory
from slurmhet.policies.base import ClusterView, Decision, JobState, Placement, Slot, TimePolicy, gang_size
from slurmhet.sim.contention import contenders
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import TraceJob

EPS = 1e-9


class SimulationError(RuntimeError):
    """A policy broke an invariant (capacity, infeasible type) or starved the queue."""


class PolicyStarved(SimulationError):
    """The policy leaves the whole cluster idle while jobs wait: it cannot place them on this cluster."""

    def __init__(self, policy: str, now: float, waiting: list[JobState]) -> None:
        self.policy, self.now, self.waiting = policy, now, waiting
        shown = ", ".join(f"{j.job_id} ({j.gpus} GPUs)" for j in waiting[:5])
        more = f" and {len(waiting) - 5} more" if len(waiting) > 5 else ""
        super().__init__(f"{policy} places none of the waiting jobs {shown}{more} on an idle cluster at t={now:.0f}")


@dataclass(frozen=True)
class SimConfig:
    round_s: float = 360.0
    restart_s: float = 10.0
    consolidate_s: float = 10.0
    #: Seconds of a job's first start during which it holds its GPUs without progress (0: the papers' set-ups).
    start_s: float = 0.0
    #: Called after every decision with (time, placements as a ``Decision``, capacity); tests hook invariants here.
    observer: Callable[[float, Mapping[int, Placement], Mapping[Slot, int]], None] | None = None


@dataclass
class JobRecord:
    job_id: int
    weight: float
    gpus: int
    arrival: float
    first_start: float
    finish: float
    total_steps: float
    done_steps: float
    isolated_s: float
    restarts: int
    #: Most GPUs of each type the job held at once, and its GPU-seconds per type.
    gpu_types: dict[str, int] = field(default_factory=dict)
    gpu_seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"id": self.job_id, "arrival": round(self.arrival, 3), "start": round(self.first_start, 3),
                "end": round(self.finish, 3), "gpus": self.gpus, "gpu_types": dict(sorted(self.gpu_types.items())),
                "gpu_seconds": {t: round(v, 1) for t, v in sorted(self.gpu_seconds.items())},
                "restarts": self.restarts}


@dataclass
class PolicyRun:
    """Raw outcome of one policy: per-job records, busy GPUs over time, decision timings."""

    policy: str
    total_gpus: int
    records: list[JobRecord] = field(default_factory=list)
    busy: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, allocated GPUs)
    plan_seconds: list[float] = field(default_factory=list)


def capacity_of(inventory: Inventory) -> dict[Slot, int]:
    return {(n.name, t): c for n in inventory.nodes for t, c in n.gpus.items() if c > 0}


def check_capacity(placements: Mapping[int, Placement], capacity: Mapping[Slot, int],
                   shared: tuple[tuple[int, ...], ...] = ()) -> None:
    """Raise unless every slot exists and holds at most its GPUs; a co-located group's GPU counts once."""
    guests = {j for group in shared for j in group[1:]}
    used: dict[Slot, int] = {}
    for job_id, placement in placements.items():
        if job_id in guests:
            continue
        for gang in placement:
            for node, gpu_type, count in gang:
                if count <= 0 or (node, gpu_type) not in capacity:
                    raise SimulationError(f"job {job_id}: bad slot {(node, gpu_type, count)}")
                used[(node, gpu_type)] = used.get((node, gpu_type), 0) + count
    over = {s: u for s, u in used.items() if u > capacity[s]}
    if over:
        raise SimulationError(f"capacity exceeded at {over}")


class Engine:
    """One run of one policy; ``run()`` returns a ``PolicyRun``."""

    def __init__(self, jobs: list[TraceJob], inventory: Inventory, rates: RateModel, policy: TimePolicy,
                 config: SimConfig) -> None:
        self.pending = sorted(jobs, key=lambda j: (j.arrival, j.job_id))
        self.capacity = capacity_of(inventory)
        self.node_order = tuple(n.name for n in inventory.nodes)
        self.inter_gbps = inventory.inter_node_gbps
        self.rates, self.policy, self.config = rates, policy, config
        self.active: dict[int, JobState] = {}
        #: Seconds a job holds its GPUs without progress: a restart, or what is left of its first start-up (which
        #: runs down only while it is placed, from ``start_s`` on arrival).
        self.restart_left: dict[int, float] = {}
        self.done_steps: dict[int, float] = {}
        self.peak: dict[int, dict[str, int]] = {}
        self.gpu_seconds: dict[int, dict[str, float]] = {}
        self.shared: tuple[tuple[int, ...], ...] = ()
        self.shared_rate: dict[int, float] = {}
        self.run_out = PolicyRun(policy.key, sum(self.capacity.values()))
        self.now = self.pending[0].arrival if self.pending else 0.0

    def run(self) -> PolicyRun:
        next_round = self.now
        dirty = True
        idle_rounds, idle_since = 0, self.now
        while self.pending or self.active:
            dirty |= self._admit()
            round_policy = self.policy.round_s is not None
            if (round_policy and self.now >= next_round - EPS) or (not round_policy and dirty):
                self._decide()
                dirty = False
                if round_policy:
                    next_round = self.now + float(self.policy.round_s or 0)
            rates = self._rates()
            horizon = [self.pending[0].arrival] if self.pending else []
            if round_policy and self.active:
                horizon.append(next_round)
            for job_id, rate in rates.items():
                if rate > 0:
                    horizon.append(self.now + self.restart_left[job_id] + self.active[job_id].remaining / rate)
            running = any(j.running for j in self.active.values())
            idle_rounds = 0 if running or self.pending else idle_rounds + 1
            idle_since = self.now if not idle_rounds else idle_since
            patient = self.now - idle_since < self.policy.idle_patience_s
            if not horizon or (idle_rounds > 3 and not patient):
                raise PolicyStarved(self.policy.key, self.now, sorted(self.active.values(), key=lambda j: j.job_id))
            finished = self._advance(max(min(horizon), self.now), rates)
            dirty |= finished
            if (round_policy and finished and self.policy.round_ends_when_done
                    and not any(j.running for j in self.active.values())):
                next_round = min(next_round, self.now)
        return self.run_out

    def _admit(self) -> bool:
        admitted = False
        while self.pending and self.pending[0].arrival <= self.now + EPS:
            job = self.pending.pop(0)
            steps = float(job.total_steps or 0.0)
            self.active[job.job_id] = JobState(job.job_id, job.job_type, job.gpus, job.weight, job.arrival, steps, steps)
            self.restart_left[job.job_id] = self.config.start_s
            self.done_steps[job.job_id] = 0.0
            self.peak[job.job_id], self.gpu_seconds[job.job_id] = {}, {}
            admitted = True
        return admitted

    def _decide(self) -> None:
        jobs = sorted(self.active.values(), key=lambda j: (j.arrival, j.job_id))
        view = ClusterView(self.now, self.capacity, jobs, self.rates, self.node_order, self.inter_gbps, self.shared,
                           start_s=self.config.start_s)
        started = time.perf_counter()
        answer = self.policy.decide(view)
        self.run_out.plan_seconds.append(time.perf_counter() - started)
        decision = {j: p for j, p in answer.items() if p and j in self.active}
        self.shared = tuple(tuple(g) for g in getattr(answer, "shared", ()))
        if self.shared and not self.policy.colocates:
            raise SimulationError(f"{self.policy.key} co-locates jobs {self.shared[0]} but does not declare colocates")
        if not self.policy.forks:
            for job_id, placement in decision.items():
                if len(placement) > 1 or sum(gang_size(g) for g in placement) > self.active[job_id].gpus:
                    raise SimulationError(f"{self.policy.key}: job {job_id} asks {self.active[job_id].gpus} GPUs and "
                                          f"got {placement}; only a policy that forks may give more")
        check_capacity(decision, self.capacity, self.shared)
        self.shared_rate = self._price_groups(decision)
        for job_id, state in self.active.items():
            new = tuple(sorted(decision.get(job_id, ())))
            for gang in new:
                if self.rates.gang_rate(state.job_type, state.gpus, gang, self.policy.sharding) <= 0:
                    raise SimulationError(f"{self.policy.key}: job {job_id} placed where it cannot run: {gang}")
            if new != state.placement:
                # A job with progress restarts from its checkpoint; one without (moved or paused during its
                # start-up) keeps what is left of its start-up: a move never skips it, and a policy that moves
                # jobs every round still gets them started.
                progressed = state.remaining < state.total_steps
                if new and (state.placement or progressed):
                    state.restarts += 1
                if progressed:
                    self.restart_left[job_id] = self.config.restart_s if new else 0.0
                else:  # what is left of its start-up, never more than start_s (a forked one may owe consolidate_s)
                    self.restart_left[job_id] = min(self.restart_left[job_id], self.config.start_s)
                state.placement = new
                peak = self.peak[job_id]
                for gpu_type, count in _by_type(new).items():
                    peak[gpu_type] = max(peak.get(gpu_type, 0), count)
            if len(new) > 1:
                self.restart_left[job_id] = max(self.restart_left[job_id], self.config.consolidate_s)
            if new and state.first_start is None:
                state.first_start = self.now
        if self.config.observer:
            self.config.observer(self.now, Decision({j: s.placement for j, s in self.active.items()}, self.shared),
                                 self.capacity)

    def _price_groups(self, decision: Mapping[int, Placement]) -> dict[int, float]:
        """Co-located worker-steps/s of every member of every shared group; refuses malformed groups."""
        out: dict[int, float] = {}
        for group in self.shared:
            placement = decision.get(group[0], ())
            slots = [slot for gang in placement for slot in gang]
            ok = (len(group) > 1 and len(placement) == 1 and len(slots) == 1 and slots[0][2] == 1
                  and all(decision.get(j) == placement and self.active[j].gpus == 1 for j in group))
            types = tuple(self.active[j].job_type for j in group) if ok else ()
            rates = self.rates.colocated_rates(types, slots[0][1]) if ok else None
            if rates is None:
                raise SimulationError(f"{self.policy.key}: cannot co-locate jobs {group} on {placement}")
            out.update(zip(group, rates))
        return out

    def _rates(self) -> dict[int, float]:
        placements = {j: s.placement for j, s in self.active.items() if s.running}
        contended = contenders(placements)
        out = {}
        for job_id, placement in placements.items():
            if job_id in self.shared_rate:
                out[job_id] = self.shared_rate[job_id]
                continue
            state = self.active[job_id]
            out[job_id] = sum(
                self.rates.gang_rate(state.job_type, state.gpus, gang, self.policy.sharding,
                                     contended.get((job_id, copy), 1))
                for copy, gang in enumerate(placement))
        return out

    def _advance(self, until: float, rates: Mapping[int, float]) -> bool:
        dt = until - self.now
        busy = sum(gang_size(g) for s in self.active.values() for g in s.placement)
        busy -= sum(len(g) - 1 for g in self.shared)  # a shared GPU is one busy GPU
        if dt > 0 and busy:
            self.run_out.busy.append((self.now, until, busy))
        finished = []
        for job_id, rate in rates.items():
            state = self.active[job_id]
            pause = min(self.restart_left[job_id], dt)
            self.restart_left[job_id] -= pause
            gpus = sum(gang_size(g) for g in state.placement)
            state.attained_gpu_s += gpus * dt
            used = self.gpu_seconds[job_id]
            for gang in state.placement:
                for _, gpu_type, count in gang:
                    state.received_s[gpu_type] = state.received_s.get(gpu_type, 0.0) + dt * count / gpus
                    used[gpu_type] = used.get(gpu_type, 0.0) + dt * count
            progress = rate * (dt - pause)
            if progress >= state.remaining * (1 - EPS) or state.remaining - progress <= EPS * state.total_steps:
                progress = state.remaining
                finished.append(job_id)
            state.remaining -= progress
            self.done_steps[job_id] += progress
        self.now = until
        for job_id in finished:
            self._finish(self.active.pop(job_id))
        if finished and self.shared:  # a partner that is left alone runs at its own rate again
            self.shared = tuple(g for g in (tuple(j for j in g if j in self.active) for g in self.shared) if len(g) > 1)
            self.shared_rate = {j: r for j, r in self.shared_rate.items() if any(j in g for g in self.shared)}
        return bool(finished)

    def _finish(self, state: JobState) -> None:
        best = max(self.rates.type_rate(state.job_type, state.gpus, t) for t in {t for _, t in self.capacity})
        self.run_out.records.append(JobRecord(
            state.job_id, state.weight, state.gpus, state.arrival,
            state.first_start if state.first_start is not None else self.now, self.now, state.total_steps,
            self.done_steps[state.job_id], state.total_steps / best if best > 0 else 0.0, state.restarts,
            self.peak.pop(state.job_id), self.gpu_seconds.pop(state.job_id)))


def _by_type(placement: Placement) -> dict[str, int]:
    out: dict[str, int] = {}
    for gang in placement:
        for _, gpu_type, count in gang:
            out[gpu_type] = out.get(gpu_type, 0) + count
    return out
