"""What a scheduling policy over time sees and returns, shared by the simulator and the policies.

A policy is called at decision points (every round, or at arrivals and completions)
with a ``ClusterView`` and returns the placement of every job it wants running.
A ``Placement`` is a tuple of gangs (one per forked copy; normally one), each a
sorted tuple of ``(node, gpu_type, count)``. Jobs left out of the answer are
paused (preempted). The engine owns the ``JobState`` objects: policies read them.
A policy that co-locates single-GPU jobs on one GPU (seed 002) returns a
``Decision``: the placements plus the groups of jobs that share a GPU.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

Gang = tuple[tuple[str, str, int], ...]
Placement = tuple[Gang, ...]
Slot = tuple[str, str]  # (node, gpu_type)


def make_gang(counts: Mapping[Slot, int]) -> Gang:
    """A canonical gang from ``{(node, type): count}``; zero counts are dropped."""
    return tuple(sorted((n, t, c) for (n, t), c in counts.items() if c > 0))


def gang_size(gang: Gang) -> int:
    return sum(c for _, _, c in gang)


def gang_types(gang: Gang) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for _, t, c in gang:
        out[t] += c
    return dict(out)


class Decision(dict):
    """Placements by job id, plus ``shared``: groups of job ids placed on the same single GPU.

    A plain ``dict[int, Placement]`` is a Decision without co-location. Every member
    of a group has the same one-GPU placement; that GPU counts once against capacity.
    """

    def __init__(self, placements: Mapping[int, Placement] | None = None,
                 shared: Iterable[tuple[int, ...]] = ()) -> None:
        super().__init__(placements or {})
        self.shared: tuple[tuple[int, ...], ...] = tuple(tuple(g) for g in shared)


@dataclass
class JobState:
    """A job's progress as the engine tracks it (policies must not mutate it)."""

    job_id: int
    job_type: str
    gpus: int
    weight: float
    arrival: float
    total_steps: float
    remaining: float
    placement: Placement = ()
    first_start: float | None = None
    attained_gpu_s: float = 0.0
    received_s: dict[str, float] = field(default_factory=dict)  # seconds run per GPU type
    restarts: int = 0

    @property
    def running(self) -> bool:
        return bool(self.placement)


class RateEstimator(Protocol):
    """The simulator's job model as policies may query it (worker-steps per second)."""

    def rate(self, job_type: str, gpus: int, placement: Placement, sharding: str = ...) -> float: ...

    def type_rate(self, job_type: str, gpus: int, gpu_type: str) -> float: ...

    def model_gb(self, job_type: str) -> float: ...

    def colocated_rates(self, job_types: tuple[str, ...], gpu_type: str) -> tuple[float, ...] | None: ...


class Free:
    """Free GPUs per (node, type); policies carve gangs out of it greedily."""

    def __init__(self, capacity: Mapping[Slot, int], used: Iterable[Placement] = ()) -> None:
        self.counts: dict[Slot, int] = dict(capacity)
        for placement in used:
            self.take(placement)

    def take(self, placement: Placement) -> None:
        for gang in placement:
            for node, gpu_type, count in gang:
                self.counts[(node, gpu_type)] -= count

    def fits(self, placement: Placement) -> bool:
        need: dict[Slot, int] = defaultdict(int)
        for gang in placement:
            for node, gpu_type, count in gang:
                need[(node, gpu_type)] += count
        return all(self.counts.get(slot, 0) >= c for slot, c in need.items())

    def by_type(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (_, t), c in self.counts.items():
            out[t] += c
        return dict(out)

    def total(self) -> int:
        return sum(self.counts.values())

    def gang_of_type(self, gpu_type: str, k: int) -> Gang | None:
        """Best fit on one node if any node has ``k`` free; else the fewest nodes (largest first)."""
        slots = [(c, n) for (n, t), c in self.counts.items() if t == gpu_type and c > 0]
        fitting = [s for s in slots if s[0] >= k]
        if fitting:
            _, node = min(fitting)
            return ((node, gpu_type, k),)
        if sum(c for c, _ in slots) < k:
            return None
        take: dict[Slot, int] = {}
        for count, node in sorted(slots, key=lambda s: (-s[0], s[1])):
            use = min(count, k - sum(take.values()))
            take[(node, gpu_type)] = use
            if sum(take.values()) == k:
                break
        return make_gang(take)

    def gang_any(self, k: int, node_order: Iterable[str], types: Iterable[str] | None = None) -> Gang | None:
        """Type-blind first fit: one node with ``k`` free GPUs if any, else nodes in ``node_order``.

        ``types`` limits the GPU types (those the job can run on at all, e.g. memory-wise).
        """
        allowed = set(types) if types is not None else None
        per_node: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for (n, t), c in self.counts.items():
            if c > 0 and (allowed is None or t in allowed):
                per_node[n].append((t, c))
        order = list(node_order)
        for node in order:
            if sum(c for _, c in per_node.get(node, ())) >= k:
                return self._fill([node], per_node, k)
        if sum(c for counts in per_node.values() for _, c in counts) < k:
            return None
        return self._fill(order, per_node, k)

    @staticmethod
    def _fill(nodes: list[str], per_node: Mapping[str, list[tuple[str, int]]], k: int) -> Gang:
        take: dict[Slot, int] = {}
        left = k
        for node in nodes:
            for gpu_type, count in sorted(per_node.get(node, ())):
                use = min(count, left)
                if use:
                    take[(node, gpu_type)] = use
                    left -= use
            if not left:
                break
        return make_gang(take)


@dataclass
class ClusterView:
    """One decision point: the time, the capacity, the active jobs (arrival order) and the job model."""

    now: float
    capacity: Mapping[Slot, int]
    jobs: list[JobState]
    rates: RateEstimator
    node_order: tuple[str, ...]
    inter_node_gbps: float = 1.25
    #: Groups of running jobs that share one GPU since the last decision (see ``Decision``).
    shared: tuple[tuple[int, ...], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    #: Seconds the engine charges a job's first start (``SimConfig.start_s``), so planners can charge them too.
    start_s: float = 0.0
    _types: list[str] | None = field(default=None, init=False, repr=False, compare=False)

    def free(self, keep: Iterable[Placement] = ()) -> Free:
        return Free(self.capacity, keep)

    def gpu_types(self) -> list[str]:
        if self._types is None:  # the capacity never changes within a decision
            self._types = sorted({t for (_, t) in self.capacity})
        return list(self._types)

    def type_capacity(self) -> dict[str, int]:
        return Free(self.capacity).by_type()

    def best_type_rate(self, job: JobState) -> float:
        return max(self.rates.type_rate(job.job_type, job.gpus, t) for t in self.gpu_types())

    def runnable_types(self, job: JobState) -> list[str]:
        """GPU types the job can run on at all, fastest first."""
        rated = [(self.rates.type_rate(job.job_type, job.gpus, t), t) for t in self.gpu_types()]
        return [t for r, t in sorted(rated, key=lambda x: (-x[0], x[1])) if r > 0]

    def remaining_time(self, job: JobState) -> float:
        """Remaining seconds on the job's fastest type at its requested size (a lower bound)."""
        best = self.best_type_rate(job)
        return job.remaining / best if best > 0 else float("inf")


class TimePolicy:
    """Base of all policies over time; subclasses set the attributes and implement ``decide``."""

    key: str = ""
    #: Round-based policies decide every ``round_s`` seconds; the others at arrivals and completions.
    round_based: bool = False
    #: How a gang spanning GPU types shares work: "barrier" (slowest gates) or "proportional".
    sharding: str = "barrier"
    #: May run a job as several forked copies (HadarE); otherwise the engine holds a job to one gang of at most
    #: its requested GPUs, which the instance bounds (``sim.bounds``) rely on.
    forks: bool = False
    #: A round ends as soon as every job running in it has finished (Gavel's simulator), not only after ``round_s``.
    round_ends_when_done: bool = False
    #: Seconds an idle cluster with waiting jobs may stay idle before the engine calls the policy starved (beyond
    #: three rounds): Gavel leaves GPUs idle until its next allocation recompute.
    idle_patience_s: float = 0.0
    #: May co-locate single-GPU jobs on one GPU (a ``Decision``'s ``shared`` groups); the engine refuses it otherwise.
    colocates: bool = False
    #: A site's wait limit (``Settings.max_wait_h``, in seconds): honoured by the policies that plan through
    #: slurmhet's planner (``PlanningInput.max_wait_s``); the papers' baselines keep their own order.
    max_wait_s: float | None = None

    def __init__(self, seed: int = 0, round_s: float = 360.0) -> None:
        self.seed = seed
        self.round_s: float | None = round_s if self.round_based else None

    def decide(self, view: ClusterView) -> dict[int, Placement]:
        raise NotImplementedError

    @staticmethod
    def keep_running(view: ClusterView) -> dict[int, Placement]:
        """The placements of running jobs, for non-preemptive policies."""
        return {j.job_id: j.placement for j in view.jobs if j.running}


def greedy_fill(view: ClusterView, order: Iterable[JobState], choose: Callable[[JobState, Free], Placement | None],
                *, preemptive: bool, block: bool = False) -> dict[int, Placement]:
    """List scheduling: jobs in ``order`` take what ``choose`` carves from the free GPUs.

    Non-preemptive: running jobs keep their GPUs and only waiting jobs are placed.
    Preemptive: a job in the order keeps its current GPUs when they are still free (no
    restart), else gets a new choice. ``block``: stop at the first job that does not fit (FIFO).
    """
    out = TimePolicy.keep_running(view) if not preemptive else {}
    free = view.free(out.values())
    for job in order:
        if job.job_id in out:
            continue
        placement = job.placement if preemptive and job.running and free.fits(job.placement) else choose(job, free)
        if placement is None:
            if block:
                break
            continue
        free.take(placement)
        out[job.job_id] = placement
    return out
