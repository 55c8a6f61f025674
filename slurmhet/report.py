"""sacct-based reporting: per-job JCT, queueing, GPU-hours by type; cluster makespan and utilisation.

``build_report`` is pure: it folds accounting records (het components, array
tasks; ``.batch``/``.extern`` steps dropped) into the slurmhet jobs that own them
and computes the metrics. ``foreign_report`` does the same for the jobs beside
them: on a shared cluster, other users' jobs in the same window explain much of
slurmhet's queueing. The CLI gathers the inputs and prints or plots.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping, Sequence

from slurmhet.slurm.parsers import AccountingRecord, QueueRecord, SlurmJobId, parse_tres
from slurmhet.slurm.world import is_ours

_FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


@dataclass(frozen=True)
class StoredJob:
    """What the store knows of one slurmhet job, without the ORM."""

    id: int
    name: str
    owner: str
    weight: float
    predicted_jct_s: float | None
    #: Its Slurm jobs; ``A_i`` where it is one task of an array it shares (a sweep array).
    slurm_ids: tuple[str, ...]
    restarts: int = 0
    emulated: bool = False
    #: When ``slurmhet submit`` stored the job. JCT and queueing count from here: the time slurmhet held the
    #: job before its first sbatch is part of the user's wait. None: from the earliest sacct Submit.
    stored_at: datetime | None = None
    #: The store's final state (COMPLETED, FAILED, CANCELLED) once slurmhet settled the job, else None. It
    #: overrules Slurm's last word, which misses what the job's progress records show: a run that checkpointed
    #: at its time limit and stopped short exits 0 (COMPLETED in sacct), and a late requeue may fail after
    #: every step was done.
    settled: str | None = None


def as_utc(value: datetime) -> datetime:
    """Times from the store may come back naive (SQLite): they are UTC."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


@dataclass
class JobReport:
    id: int
    name: str
    owner: str
    state: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    queue_s: float | None
    run_s: float | None
    jct_s: float | None
    gpu_hours: dict[str, float]
    predicted_jct_s: float | None
    restarts: int
    slurm_ids: list[str]
    emulated: bool

    def row(self) -> dict[str, object]:
        out = asdict(self)
        out["gpu_hours"] = {k: round(v, 6) for k, v in sorted(self.gpu_hours.items())}
        return out


@dataclass
class ForeignGroup:
    """Jobs not of this store (all of them, or one user's) overlapping the report's window."""

    jobs: int
    #: GPU-hours by type held inside the window only: the share of the cluster they took while slurmhet ran.
    gpu_hours: dict[str, float]
    avg_queue_s: float | None
    avg_jct_s: float | None

    def to_json(self) -> dict[str, object]:
        return {"jobs": self.jobs, "gpu_hours": {k: round(v, 6) for k, v in sorted(self.gpu_hours.items())},
                "avg_queue_s": _round(self.avg_queue_s), "avg_jct_s": _round(self.avg_jct_s)}


@dataclass
class ForeignReport:
    """Other users' jobs in the same window: the load slurmhet's jobs shared the cluster with."""

    total: ForeignGroup
    users: dict[str, ForeignGroup]

    def to_json(self) -> dict[str, object]:
        return {**self.total.to_json(), "users": {u: g.to_json() for u, g in sorted(self.users.items())}}


@dataclass
class ClusterReport:
    jobs: list[JobReport]
    makespan_s: float | None
    avg_jct_s: float | None
    weighted_jct_s: float | None
    avg_queue_s: float | None
    gpu_hours: dict[str, float]
    utilization: dict[str, float]
    plan_error: float | None
    window: tuple[datetime | None, datetime | None]
    notices: list[str] = field(default_factory=list)
    #: Jobs not of this store overlapping the window; None when not asked for or unknown.
    foreign: ForeignReport | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "jobs": [j.row() for j in self.jobs],
            "cluster": {
                "makespan_s": self.makespan_s, "avg_jct_s": self.avg_jct_s, "weighted_jct_s": self.weighted_jct_s,
                "avg_queue_s": self.avg_queue_s, "gpu_hours": {k: round(v, 6) for k, v in self.gpu_hours.items()},
                "utilization": {k: round(v, 4) for k, v in self.utilization.items()},
                "plan_error": self.plan_error,
                "window": [w.isoformat() if w else None for w in self.window],
            },
            "foreign": self.foreign.to_json() if self.foreign else None,
            "notices": self.notices,
        }

    def to_csv(self) -> str:
        buffer = io.StringIO()
        types = sorted(self.gpu_hours)
        writer = csv.writer(buffer)
        writer.writerow(["id", "name", "owner", "state", "submit", "start", "end", "queue_s", "run_s", "jct_s",
                         "predicted_jct_s", "restarts", *[f"gpu_hours_{t}" for t in types]])
        for j in self.jobs:
            writer.writerow([j.id, j.name, j.owner, j.state, j.submit, j.start, j.end, j.queue_s, j.run_s, j.jct_s,
                             j.predicted_jct_s, j.restarts, *[round(j.gpu_hours.get(t, 0.0), 6) for t in types]])
        return buffer.getvalue()


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _job_state(states: Sequence[str]) -> str:
    if not states:
        return "UNKNOWN"
    if any(s not in _FINAL for s in states):
        return "RUNNING" if "RUNNING" in states else "PENDING"
    for bad in ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "CANCELLED"):
        if bad in states:
            return bad
    return "COMPLETED"


@dataclass(frozen=True)
class GpuShares:
    """A node's GPU type and how many gres/mps or gres/shard units make one of its GPUs."""

    gpu_type: str
    mps_per_gpu: float = 0.0
    shards_per_gpu: float = 0.0


def gpu_hours(record: AccountingRecord, shares: Mapping[str, GpuShares] | None = None) -> dict[str, float]:
    """GPU-hours by type of one allocation: ``gres/gpu:<type>`` x elapsed.

    An MPS or shard pack holds ``gres/mps``/``gres/shard`` units rather than whole
    GPUs; with the node's ``shares`` those count as the GPU fraction they are.
    """
    hours = {t: n * record.elapsed_s / 3600.0 for t, n in record.gpus_by_type().items()}
    node = (shares or {}).get(record.nodes)
    if node is not None:
        fraction = 0.0
        if node.mps_per_gpu and record.alloc_tres.get("gres/mps"):
            fraction += record.alloc_tres["gres/mps"] / node.mps_per_gpu
        if node.shards_per_gpu and record.alloc_tres.get("gres/shard"):
            fraction += record.alloc_tres["gres/shard"] / node.shards_per_gpu
        if fraction:
            hours[node.gpu_type] = hours.get(node.gpu_type, 0.0) + fraction * record.elapsed_s / 3600.0
    return hours


def _run_order(record: AccountingRecord) -> tuple[float, int]:
    """Submit time, then Slurm's job id: sacct's times are whole seconds, and a restart submitted within the
    second in which Slurm requeued the run it replaces (a node failure) is still the later run; ids only grow."""
    return (record.submit.timestamp() if record.submit else 0.0,
            int(record.id.job) if record.id.job.isdigit() else 0)


def fold(job: StoredJob, records: Iterable[AccountingRecord], shares: Mapping[str, GpuShares] | None = None,
         sharers: Mapping[str, int] | None = None) -> JobReport:
    """All of a job's allocations (het components, array tasks, resubmissions) into one row.

    ``sharers`` counts the slurmhet jobs each Slurm job carries (a pack's members), so
    a pack's GPU-hours are split among its members rather than counted once per member.
    """
    mine = [r for r in records if not r.id.is_step and (r.id.job in job.slurm_ids
                                                          or f"{r.id.job}_{r.id.array_task}" in job.slurm_ids)]
    hours: dict[str, float] = {}
    for record in mine:
        split = max(1, (sharers or {}).get(record.id.job, 1))
        for gpu_type, value in gpu_hours(record, shares).items():
            hours[gpu_type] = hours.get(gpu_type, 0.0) + value / split
    submits = [r.submit for r in mine if r.submit]
    starts = [r.start for r in mine if r.start]
    # The latest run decides: a run moved away (cancelled) or retried after a failure said nothing final.
    latest = max(mine, key=_run_order).id.job if mine else None
    state = _job_state([r.state for r in mine if r.id.job == latest])
    state = job.settled if job.settled is not None and state in _FINAL else state
    ends = [r.end for r in mine if r.end] if state in _FINAL else []
    if job.stored_at is not None:
        submits.append(as_utc(job.stored_at))
    submit, start, end = (min(submits) if submits else None), (min(starts) if starts else None), (max(ends) if ends else None)
    return JobReport(
        id=job.id, name=job.name, owner=job.owner, state=state, submit=submit, start=start, end=end,
        queue_s=(start - submit).total_seconds() if start and submit else None,
        run_s=(end - start).total_seconds() if end and start else None,
        jct_s=(end - submit).total_seconds() if end and submit else None,
        gpu_hours=hours, predicted_jct_s=job.predicted_jct_s, restarts=job.restarts,
        slurm_ids=sorted(set(job.slurm_ids)), emulated=job.emulated,
    )


def records_from_queue(queue: Iterable[QueueRecord], now: datetime) -> list[AccountingRecord]:
    """Accounting-shaped rows from squeue, for sites without accounting (live and recent jobs only)."""
    out = []
    for q in queue:
        final = q.state in _FINAL
        end = q.end if final else None
        elapsed = ((end or now) - q.start).total_seconds() if q.start and q.start <= now else 0.0
        out.append(AccountingRecord(
            id=SlurmJobId(q.root_id, het_offset=q.het_offset, array_task=q.array_task), raw_id=q.job_id,
            name=q.name, state=q.state, exit_code="", submit=q.submit, start=q.start if q.start and q.start <= now
            else None, end=end, elapsed_s=int(elapsed), alloc_tres=parse_tres(q.alloc_tres), nodes=q.nodes,
            comment=q.comment, user=q.user, partition="",
        ))
    return out


def build_report(jobs: Sequence[StoredJob], records: Sequence[AccountingRecord],
                 capacity: Mapping[str, int], notices: Sequence[str] = (),
                 shares: Mapping[str, GpuShares] | None = None) -> ClusterReport:
    """Per-job rows plus cluster metrics over the window the jobs span."""
    sharers: dict[str, int] = {}
    for job in jobs:
        for slurm_id in set(job.slurm_ids):
            sharers[slurm_id] = sharers.get(slurm_id, 0) + 1
    rows = [fold(job, records, shares, sharers) for job in jobs]
    weights = {job.id: job.weight for job in jobs}
    done = [r for r in rows if r.jct_s is not None]
    submits = [r.submit for r in rows if r.submit]
    # Running allocations count up to what sacct has seen of them, so the window must reach that far too.
    seen = [r.start + timedelta(seconds=r.elapsed_s) for r in records if not r.id.is_step and r.start]
    ends = [r.end for r in rows if r.end] + seen
    window_start, window_end = (min(submits) if submits else None), (max(ends) if ends else None)
    window_h = (window_end - window_start).total_seconds() / 3600.0 if window_start and window_end else 0.0
    totals: dict[str, float] = {}
    for row in rows:
        for gpu_type, value in row.gpu_hours.items():
            totals[gpu_type] = totals.get(gpu_type, 0.0) + value
    utilization = {t: (totals.get(t, 0.0) / (n * window_h) if window_h > 0 else 0.0) for t, n in capacity.items() if n}
    errors = [abs(r.predicted_jct_s - r.jct_s) / r.jct_s for r in done if r.predicted_jct_s and r.jct_s]
    weight_sum = sum(weights[r.id] for r in done)
    all_notices = list(notices)
    if any(r.emulated for r in rows):
        all_notices.append("GPU speed was emulated (SLURMHET_EMULATE_THROUGHPUT=1): timings follow the throughput "
                           "table, not real GPUs")
    return ClusterReport(
        jobs=rows,
        makespan_s=((max(r.end for r in rows if r.end) - window_start).total_seconds()
                    if window_start and any(r.end for r in rows) else None),
        avg_jct_s=_mean([r.jct_s for r in done if r.jct_s is not None]),
        weighted_jct_s=(sum(weights[r.id] * r.jct_s for r in done if r.jct_s is not None) / weight_sum
                        if weight_sum else None),
        avg_queue_s=_mean([r.queue_s for r in rows if r.queue_s is not None]),
        gpu_hours=totals,
        utilization=utilization,
        plan_error=_mean(errors),
        window=(window_start, window_end),
        notices=all_notices,
    )


def _foreign_group(jobs: Sequence[list[AccountingRecord]], start: datetime, end: datetime) -> ForeignGroup:
    hours: dict[str, float] = {}
    queues, jcts = [], []
    for rows in jobs:
        for r in rows:
            if not r.start:
                continue
            held_until = as_utc(r.end) if r.end else as_utc(r.start) + timedelta(seconds=r.elapsed_s)
            overlap = (min(held_until, end) - max(as_utc(r.start), start)).total_seconds()
            for gpu_type, count in r.gpus_by_type().items():
                if overlap > 0:
                    hours[gpu_type] = hours.get(gpu_type, 0.0) + count * overlap / 3600.0
        submits = [as_utc(r.submit) for r in rows if r.submit]
        starts = [as_utc(r.start) for r in rows if r.start]
        if submits and starts:
            queues.append((min(starts) - min(submits)).total_seconds())
            if all(r.state in _FINAL for r in rows) and all(r.end for r in rows):
                jcts.append((max(as_utc(r.end) for r in rows if r.end) - min(submits)).total_seconds())
    return ForeignGroup(jobs=len(jobs), gpu_hours=hours, avg_queue_s=_mean(queues), avg_jct_s=_mean(jcts))


def foreign_report(records: Iterable[AccountingRecord], store_tag: str,
                   window: tuple[datetime | None, datetime | None], ours: Iterable[str] = ()) -> ForeignReport | None:
    """Jobs in ``records`` (all users' sacct rows) that are not this store's and overlap ``window``.

    A job is its het components together; each array task is a job of its own. A
    job is this store's if any of its rows carries this store's comment tag, or if its
    id is in ``ours`` (the store's Slurm ids). A job overlaps the window if it was
    submitted before the window's end and had not ended before its start. Pending
    jobs count too: they waited for the same GPUs. Queueing is its first start minus
    its submit. JCT is its last end minus its submit, for finished jobs that ran.
    GPU-hours count only the time inside the window.
    """
    start, end = window
    if start is None or end is None:
        return None
    start, end = as_utc(start), as_utc(end)
    mine = set(ours)
    groups: dict[tuple[str, str], list[AccountingRecord]] = {}
    for r in records:
        if r.id.is_step:
            continue
        task = str(r.id.array_task) if r.id.array_task is not None else (r.id.array_pending or "")
        groups.setdefault((r.id.job, task), []).append(r)
    tagged = {job for (job, _), rows in groups.items() if any(is_ours(r.comment, store_tag) for r in rows)}
    by_user: dict[str, list[list[AccountingRecord]]] = {}
    for (job, _), rows in sorted(groups.items()):
        if job in tagged or job in mine:
            continue
        submits = [as_utc(r.submit) for r in rows if r.submit]
        ended = [as_utc(r.end) for r in rows if r.end]
        if not submits or min(submits) >= end:
            continue
        if all(r.state in _FINAL for r in rows) and ended and max(ended) <= start:
            continue
        user = next((r.user for r in rows if r.user), "?")
        by_user.setdefault(user, []).append(rows)
    return ForeignReport(total=_foreign_group([j for jobs in by_user.values() for j in jobs], start, end),
                         users={u: _foreign_group(jobs, start, end) for u, jobs in by_user.items()})


def write_plots(report: ClusterReport, directory: str) -> list[str]:
    """JCT CDF, a Gantt chart per GPU type, and utilisation over time, as PNGs."""
    import os

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    written = []
    jcts = sorted(r.jct_s for r in report.jobs if r.jct_s is not None)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))] if jcts else [], where="post")
    ax.set_xlabel("JCT (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    path = os.path.join(directory, "jct_cdf.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    origin = report.window[0]
    types = sorted(report.gpu_hours) or ["gpu"]
    fig, axes = plt.subplots(len(types), 1, figsize=(8, 2 + 1.2 * len(types)), squeeze=False)
    for ax, gpu_type in zip(axes[:, 0], types):
        rows = [r for r in report.jobs if r.gpu_hours.get(gpu_type) and r.start and r.end]
        for i, r in enumerate(rows):
            assert r.start and r.end and origin
            ax.barh(i, (r.end - r.start).total_seconds(), left=(r.start - origin).total_seconds())
        ax.set_yticks(range(len(rows)), [f"{r.id} {r.name[:16]}" for r in rows])
        ax.set_title(f"Gantt: {gpu_type}")
    axes[-1, 0].set_xlabel("seconds since first submit")
    fig.tight_layout()
    path = os.path.join(directory, "gantt.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    fig, ax = plt.subplots(figsize=(6, 4))
    events = sorted({t for r in report.jobs for t in (r.start, r.end) if t})
    for gpu_type in types:
        busy = []
        for t in events:
            busy.append(sum(r.gpu_hours.get(gpu_type, 0.0) * 3600.0 / r.run_s for r in report.jobs
                            if r.start and r.end and r.run_s and r.start <= t < r.end))
        if origin:
            ax.step([(t - origin).total_seconds() for t in events], busy, where="post", label=gpu_type)
    ax.set_xlabel("seconds since first submit")
    ax.set_ylabel("GPUs busy")
    ax.set_title("utilisation over time")
    ax.legend()
    path = os.path.join(directory, "utilization.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
    return written
