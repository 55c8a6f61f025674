"""Value objects every planner, the simulator and the CLI share, and the job model.

The job model is seed 001's (eqs. 2-7 and 10-14): with proportional workload
assignment each GPU gets a share of the samples proportional to its throughput
(eq. 12), so an epoch's compute time is ``|Pi_i| / sum_k rho_ik`` (eq. 11); a
ring all-reduce costs ``2 (K-1) D / (r_min K)`` (eq. 6) with ``r_min`` the
bottleneck link: the intra-node rate when every rank is on one node, else the
inter-node rate; and JCT = compute + communication over the remaining work (eq. 7).

Eq. (6) charges one all-reduce per epoch. Data-parallel training really
all-reduces every step, so :class:`PlanJob` carries ``samples_per_sync``: the
global batch for per-step DDP (what :func:`plan_job_from_spec` sets) or the
epoch size to reproduce the paper literally (what the TPDS benchmarks set).

A job not yet running pays ``PlanJob.startup_s`` first (Slurm start to its first
progress: interpreter, imports, rendezvous, data loading), which the papers leave
out and a real cluster charges every start: :func:`run_seconds` includes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from slurmhet.cluster import Inventory, OpenWorld
from slurmhet.errors import InputError
from slurmhet.spec import JobSpec
from slurmhet.throughput import ThroughputTable, canonical_model, workload_key

#: Called by long-running planners: (steps done, steps in total or 0 if unknown, what is running).
Progress = Callable[[int, int, str], None]

#: Parameter sizes in MB (fp32) of torchvision / Gavel models, used when a spec gives no model_size_mb.
DEFAULT_MODEL_SIZE_MB: Mapping[str, float] = {
    "ResNet-18": 44.7, "ResNet-50": 97.5, "ResNet-101": 170.5, "VGG-11": 506.8, "VGG-19": 548.1,
    "AlexNet": 233.1, "Transformer": 249.0, "LM": 104.0, "Recommendation": 94.0, "A3C": 4.0,
    "CycleGAN": 45.0, "SE-ResNet-18": 45.5,
}


@dataclass(frozen=True)
class Allocation:
    """GPUs given to one job as sorted ``(node, gpu_type, count)`` slots; ranks follow this order."""

    slots: tuple[tuple[str, str, int], ...]

    @classmethod
    def of(cls, counts: Mapping[tuple[str, str], int]) -> "Allocation":
        return cls(tuple(sorted((n, t, int(c)) for (n, t), c in counts.items() if c > 0)))

    @property
    def gpus(self) -> int:
        return sum(c for _, _, c in self.slots)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({n for n, _, _ in self.slots}))

    @property
    def single_node(self) -> bool:
        return len(self.nodes) <= 1

    def by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, t, c in self.slots:
            out[t] = out.get(t, 0) + c
        return out

    def ranks(self) -> tuple[tuple[str, str], ...]:
        """One ``(node, gpu_type)`` per rank, in rank order."""
        return tuple((n, t) for n, t, c in self.slots for _ in range(c))


@dataclass(frozen=True)
class PlanJob:
    """One job as planners see it: work left, sync pattern, GPU limits and current allocation."""

    id: str
    workload: str
    samples_remaining: float
    global_batch: int
    model_size_mb: float = 0.0
    samples_per_sync: float = 0.0
    samples_per_epoch: float = 0.0
    sync: str = "allreduce"
    min_gpus: int = 1
    max_gpus: int = 1 << 30
    allowed_types: tuple[str, ...] = ()
    weight: float = 1.0
    priority: int = 0
    #: Its priority is a critical path's while jobs still arrive (``planner/critical.py``): the joint admission
    #: of a revisable plan (``planner/joint.py``) runs it, but gives it GPUs by its progress like any job's;
    #: greedy admission and the allocator rank it by its priority as any other.
    must_run: bool = False
    colocate: bool = False
    gpu_memory_gb: float | None = None
    submitted_at: float = 0.0
    current: Allocation | None = None
    #: Who submitted it: per-user limits (QOS GPU caps in :class:`OpenWorld`) apply to the sum of their jobs.
    user: str = ""
    #: Seconds from its Slurm start to its first progress (interpreter, imports, rendezvous, data loading),
    #: charged once before its work; 0 for a job already running.
    startup_s: float = 0.0
    #: What each of its GPUs needs of its node besides the GPU: CPUs (Slurm gives a task 1 by default) and
    #: memory in MB (0: the site's default, not counted).
    cpus_per_gpu: int = 1
    mem_per_gpu_mb: int = 0
    #: Slurm ends the job this long after it starts (its spec's ``time_limit``): a bound on its run that
    #: lets it use GPUs kept for an overdue job when it ends before that job can start. None: no limit known.
    time_limit_s: float | None = None
    #: In Slurm's queue on ``current`` but not started: past the wait limit it is planned as an overdue waiting
    #: job on those types (Slurm serves it before younger jobs there), not as holding ``current``.
    queued: bool = False

    def __post_init__(self) -> None:
        checks = (
            ("samples_remaining", self.samples_remaining > 0), ("global_batch", self.global_batch > 0),
            ("model_size_mb", self.model_size_mb >= 0), ("samples_per_sync", self.samples_per_sync >= 0),
            ("samples_per_epoch", self.samples_per_epoch >= 0), ("min_gpus", self.min_gpus >= 1),
            ("max_gpus", self.max_gpus >= self.min_gpus), ("weight", self.weight > 0),
            ("gpu_memory_gb", self.gpu_memory_gb is None or self.gpu_memory_gb > 0),
            ("startup_s", 0 <= self.startup_s < math.inf), ("cpus_per_gpu", self.cpus_per_gpu >= 1),
            ("mem_per_gpu_mb", self.mem_per_gpu_mb >= 0),
            ("time_limit_s", self.time_limit_s is None or 0 < self.time_limit_s < math.inf),
        )
        for name, ok in checks:
            if not ok:
                raise InputError(f"job {self.id!r}: {name} = {getattr(self, name)!r} is out of range",
                                 place=f"{self.id}.{name}", hint="sizes must be positive; max_gpus >= min_gpus >= 1")
        if not self.samples_per_sync:
            object.__setattr__(self, "samples_per_sync", float(self.global_batch))
        if not self.samples_per_epoch:
            object.__setattr__(self, "samples_per_epoch", float(self.samples_remaining))

    @property
    def syncs_remaining(self) -> float:
        return self.samples_remaining / self.samples_per_sync

    @property
    def epochs_remaining(self) -> float:
        return self.samples_remaining / self.samples_per_epoch


@dataclass(frozen=True)
class ColocationSettings:
    """Co-location knobs (seed 002). delta = d0 - a*sum(C) - b*sum(M) when no measured pair exists.

    The defaults put delta = 1 at sum(C) = 4e7 with M ignored, the thesis's
    linear classifier ("sum C <= 4 * 10^7", section 4.2.4) on its V100; sites
    with their own profiles should refit them.
    """

    enabled: bool = True
    margin: float = 0.05
    max_group: int = 3
    delta0: float = 1.5
    per_occupancy: float = 0.5 / 4e7
    per_membw: float = 0.0


def is_overdue(submitted_at: float, now: float, max_wait_s: float | None) -> bool:
    """Whether a job submitted at ``submitted_at`` has waited the site's limit by ``now`` (never without one):
    the one rule both the planner's admission and the queueing of overdue jobs in Slurm go by."""
    return max_wait_s is not None and now - submitted_at >= max_wait_s


@dataclass(frozen=True)
class PlanningInput:
    """Everything a planner may look at; planners are pure functions of it."""

    jobs: tuple[PlanJob, ...]
    inventory: Inventory
    throughput: ThroughputTable
    now: float = 0.0
    #: Keep running jobs where they are (resizing a Slurm job means checkpoint + requeue).
    pin_running: bool = True
    colocation: ColocationSettings = field(default_factory=ColocationSettings)
    seed: int = 0
    #: With ``pin_running=False``: the share of the time to the next decision a running job loses when the
    #: plan changes its GPU counts (checkpoint-restart / decision interval), charged against that move.
    move_penalty: float = 0.0
    #: The rest of a shared cluster: GPUs other users' jobs and reservations hold, Slurm's queue ahead of
    #: ours, per-user GPU caps. Empty in the simulator.
    world: OpenWorld = field(default_factory=OpenWorld)
    #: A job not pinned this long after its submission is overdue: it goes ahead of every younger job, and
    #: while it does not fit, the free GPUs it may use are kept for it (None: no job is ever overdue).
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_wait_s is not None and not self.max_wait_s > 0:
            raise InputError(f"max_wait_s {self.max_wait_s} is not positive", place="max_wait_s",
                             hint="the longest a job may wait, in seconds, or None")
        if not 0.0 <= self.move_penalty < 1.0:
            raise InputError(f"move_penalty {self.move_penalty} is outside [0, 1)", place="move_penalty",
                             hint="restart seconds over the seconds between decisions")
        seen: set[str] = set()
        for job in self.jobs:
            if job.id in seen:
                raise InputError(f"job id {job.id!r} appears twice", place=f"{job.id}.id", hint="ids must be unique")
            seen.add(job.id)


@dataclass(frozen=True)
class JobPlan:
    """The plan for one job. Times are seconds; ``start_s``/``finish_s`` are absolute."""

    job_id: str
    allocation: Allocation | None
    shard_weights: tuple[float, ...]
    epoch_seconds: float
    run_seconds: float
    start_s: float
    finish_s: float
    jct_s: float
    order: int
    weight: float = 1.0
    colocation_group: str | None = None
    needs_mps: bool = False
    wait_reason: str | None = None
    priors: tuple[str, ...] = ()
    #: A waiting job's GPU types at its predicted start (what it waits for); () when placed.
    waits_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    policy: str
    jobs: tuple[JobPlan, ...]
    now: float = 0.0

    def job(self, job_id: str) -> JobPlan:
        for jp in self.jobs:
            if jp.job_id == job_id:
                return jp
        raise KeyError(job_id)

    @property
    def avg_jct(self) -> float:
        return sum(j.jct_s for j in self.jobs) / len(self.jobs) if self.jobs else 0.0

    @property
    def weighted_jct(self) -> float:
        total = sum(j.weight for j in self.jobs)
        return sum(j.weight * j.jct_s for j in self.jobs) / total if total else 0.0


# --------------------------------------------------------------------------- job model


def allreduce_seconds(model_size_mb: float, workers: int, link_gbps: float) -> float:
    """Eq. (6) for one all-reduce: ``2 (K-1) D / (r K)``; D in MB, r in GB/s; zero for one worker."""
    if workers <= 1 or model_size_mb <= 0:
        return 0.0
    return 2.0 * (workers - 1) * (model_size_mb / 1000.0) / (link_gbps * workers)


def work_seconds(job: PlanJob, rate_sum: float, workers: int, link_gbps: float) -> float:
    """Eq. (7) with (11): remaining samples / sum of rates + remaining syncs x all-reduce time."""
    if rate_sum <= 0 or workers <= 0:
        return math.inf
    return job.samples_remaining / rate_sum + job.syncs_remaining * allreduce_seconds(job.model_size_mb, workers, link_gbps)


def run_seconds(job: PlanJob, rate_sum: float, workers: int, link_gbps: float) -> float:
    """Predicted run time: the job's start-up, then its work (:func:`work_seconds`)."""
    return job.startup_s + work_seconds(job, rate_sum, workers, link_gbps)


def epoch_seconds(job: PlanJob, rate_sum: float, workers: int, link_gbps: float) -> float:
    """Time of one epoch (``samples_per_epoch`` samples) under proportional assignment; no start-up."""
    return work_seconds(job, rate_sum, workers, link_gbps) * job.samples_per_epoch / job.samples_remaining


def link_of(allocation: Allocation, inventory: Inventory) -> float:
    """The bottleneck link rate r_min of eq. (5) for an allocation."""
    return inventory.intra_node_gbps if allocation.single_node else inventory.inter_node_gbps


def shard_weights(rates: Mapping[str, float], allocation: Allocation) -> tuple[float, ...]:
    """Eq. (12): each rank's share of the samples is its throughput over the job's total."""
    per_rank = [rates[t] for _, t in allocation.ranks()]
    total = sum(per_rank)
    return tuple(r / total for r in per_rank)


def effective_rate(rates: Mapping[str, float], allocation: Allocation, proportional: bool = True) -> float:
    """Samples/s of a job on ``allocation``: eq. (13) with proportional shards, else K x the slowest rank."""
    by_type = allocation.by_type()
    if proportional:
        return sum(rates[t] * c for t, c in by_type.items())
    return allocation.gpus * min(rates[t] for t in by_type) if by_type else 0.0


def allocation_run_seconds(job: PlanJob, allocation: Allocation, rates: Mapping[str, float],
                           inventory: Inventory, proportional: bool = True) -> float:
    return run_seconds(job, effective_rate(rates, allocation, proportional), allocation.gpus,
                       link_of(allocation, inventory))


def realised_run_seconds(job: PlanJob, allocation: Allocation, weights: tuple[float, ...],
                         true_rates: Mapping[str, float], inventory: Inventory) -> float:
    """Run time when shards were cut by ``weights`` but GPUs really run at ``true_rates``.

    Every step waits for the slowest rank (eq. 3), so wrong predictions show up
    as stragglers; with exact rates and eq. (12) weights this equals run_seconds.
    """
    ranks = allocation.ranks()
    pace = max(w / true_rates[t] for w, (_, t) in zip(weights, ranks))
    comm = job.syncs_remaining * allreduce_seconds(job.model_size_mb, len(ranks), link_of(allocation, inventory))
    return job.startup_s + job.samples_remaining * pace + comm


def job_rates(job: PlanJob, table: ThroughputTable, gpu_types: tuple[str, ...]) -> tuple[dict[str, float], tuple[str, ...]]:
    """Samples/s of ``job`` on each GPU type it may use, and the types whose value is a prior.

    Raises an InputError naming the job when its allowed types meet no GPU in
    the inventory or a needed throughput is missing.
    """
    allowed = job.allowed_types or gpu_types
    usable = tuple(t for t in allowed if t in gpu_types)
    if not usable:
        raise InputError(
            f"job {job.id!r}: allowed GPU types {', '.join(allowed)} are not in the cluster ({', '.join(gpu_types)})",
            place=f"{job.id}.gpus.types", hint="allow a type the cluster has, or leave types empty",
        )
    rates, priors = {}, []
    for t in usable:
        try:
            entry = table.get(job.workload, t)
        except InputError as exc:
            raise InputError(f"job {job.id!r}: {exc.cause}", place=f"{job.id}.workload", hint=exc.hint) from exc
        rates[t] = entry.value
        if entry.is_prior:
            priors.append(t)
    return rates, tuple(priors)


def jain_fairness(jcts: Mapping[str, float], equal_share: Mapping[str, float]) -> float:
    """Eq. (33): Jain's index over Lambda_i / Lambda_i^[e]; 1 is perfectly even."""
    ratios = [jcts[j] / equal_share[j] for j in jcts]
    return sum(ratios) ** 2 / (len(ratios) * sum(r * r for r in ratios)) if ratios else 1.0


def equal_share_seconds(job: PlanJob, rates_all_gpus: float, gpus: int, jobs: int, link_gbps: float) -> float:
    """Eq. (32): the JCT ``job`` would see with an equal 1/S share of all K workers.

    ``rates_all_gpus`` is sum_k rho_ik over every worker in the cluster.
    """
    share = gpus / jobs
    comm = 2.0 * (share - 1) * (job.model_size_mb / 1000.0) / (link_gbps * share) if share > 1 else 0.0
    return job.startup_s + job.syncs_remaining * comm + job.samples_remaining * jobs / rates_all_gpus


# --------------------------------------------------------------------------- specs -> jobs


def plan_job_from_spec(job_id: str, spec: JobSpec, submitted_at: float, *, samples_done: float = 0.0,
                       current: Allocation | None = None, user: str = "", startup_s: float = 0.0,
                       queued: bool = False) -> PlanJob:
    """Turn a user's JobSpec into a PlanJob (pure).

    DDP all-reduces every step, so one sync per ``global_batch`` samples;
    local-SGD jobs average once per epoch. A missing ``model_size_mb`` takes the
    known model's size; multi-GPU jobs of unknown models must give it. ``startup_s``
    is charged only to a job not running yet (``current`` unset, or ``queued`` in Slurm): a running one paid it.
    """
    model = canonical_model(spec.workload.model)
    size = spec.model_size_mb
    if size is None:
        size = DEFAULT_MODEL_SIZE_MB.get(model)
        if size is None:
            if spec.gpus.max > 1:
                raise InputError(f"job {spec.name!r}: model_size_mb is needed for multi-GPU job of model {model!r}",
                                 place=spec.place("model_size_mb") or f"{spec.name}.model_size_mb",
                                 hint="model_size_mb: parameter size in MB (4 x parameters / 1e6 for fp32)")
            size = 0.0
    total = float(spec.total_samples)
    remaining = total - samples_done
    if remaining <= 0:
        raise InputError(f"job {spec.name!r}: no work left ({samples_done:g} of {total:g} samples done)",
                         place=f"{spec.name}.work", hint="the job is complete; do not plan it")
    epoch = float(spec.dataset_size) if spec.dataset_size else total
    per_sync = epoch if spec.sync == "local-sgd" else float(spec.global_batch)
    try:
        return PlanJob(
            id=job_id, workload=workload_key(model, spec.workload.batch_size), samples_remaining=remaining,
            global_batch=spec.global_batch, model_size_mb=float(size), samples_per_sync=per_sync,
            samples_per_epoch=epoch, sync=spec.sync, min_gpus=spec.gpus.min, max_gpus=spec.gpus.max,
            allowed_types=spec.gpus.types, weight=spec.weight, priority=spec.priority, colocate=spec.colocate,
            gpu_memory_gb=spec.gpu_memory_gb, submitted_at=submitted_at, current=current, user=user,
            startup_s=startup_s if current is None or queued else 0.0, queued=queued,
            cpus_per_gpu=spec.cpus_per_gpu or 1, mem_per_gpu_mb=spec.mem_per_gpu_mb or 0,
            time_limit_s=60.0 * spec.time_limit_min if spec.time_limit_min else None,
        )
    except InputError as exc:
        field_name = _SPEC_FIELD.get(exc.place.rsplit(".", 1)[-1], "")
        raise InputError(f"job {spec.name!r}: {exc.cause.split(': ', 1)[-1]}",
                         place=(spec.place(field_name) if field_name else "") or exc.place, hint=exc.hint) from exc


#: PlanJob field -> the spec field a user wrote it in (for error places).
_SPEC_FIELD = {
    "samples_remaining": "work", "samples_per_epoch": "work", "global_batch": "global_batch",
    "model_size_mb": "model_size_mb", "min_gpus": "gpus", "max_gpus": "gpus", "weight": "weight",
    "gpu_memory_gb": "gpu_memory_gb", "time_limit_s": "time_limit",
}
