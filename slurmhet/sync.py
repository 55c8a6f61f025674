"""Bring stored job states up to date from Slurm, in batched queries.

squeue answers for live jobs; whatever it no longer lists is read from sacct,
which lags squeue, so a part missing from both keeps its state until next time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from slurmhet.emit.multipart import with_ids
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.parsers import AccountingRecord, QueueRecord
from slurmhet.slurm.world import is_ours, tagged_ids
from slurmhet.store.db import Database
from slurmhet.failures import FailedRun, judge, tail
from slurmhet.gpu_catalog import builtin
from slurmhet.joblogs import own_stderr, stderr_file
from slurmhet.runtime.progress import STOPPED_STATES, ProgressRecord, finished_steps, read_progress, stopped_short
from slurmhet.spec import parse_job
from slurmhet.store.models import ClusterSnapshot, Event, Job, JobState, SlurmJob
from slurmhet.store.records import add_event, list_jobs

_FAILED = {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
#: Slurm states of a job that still holds or waits for its resources.
LIVE_PART_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED"}
FINAL_PART_STATES = _FAILED | {"COMPLETED", "CANCELLED"}
#: A superseded part's state until Slurm is known to have cancelled it.
CANCELLING = "CANCELLING"
#: Jobs the planner may still place (not yet in Slurm, or refused by it).
UNPLACED = (JobState.PENDING, JobState.SUBMIT_FAILED)


@dataclass(frozen=True)
class PartStatus:
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: str | None = None
    alloc_tres: str = ""
    start: datetime | None = None
    end: datetime | None = None
    #: Slurm's requeue count (squeue only: sacct's record of an ended job says 0).
    restarts: int = 0


def _matches(part: SlurmJob, het_offset: int | None, array_task: int | None) -> bool:
    return (part.het_offset is None or part.het_offset == het_offset) and (
        part.array_task is None or part.array_task == array_task
    )


def _combine(states: list[str]) -> str:
    """Several Slurm records for one part (het components, array tasks) -> one state."""
    if any(s in LIVE_PART_STATES for s in states):
        return "RUNNING" if any(s in ("RUNNING", "COMPLETING", "CONFIGURING") for s in states) else "PENDING"
    if any(s in _FAILED for s in states):
        return "FAILED"
    if any(s == "CANCELLED" for s in states):
        return "CANCELLED"
    return "COMPLETED" if states else "UNKNOWN"


def _failed_as(records: Sequence[QueueRecord] | Sequence[AccountingRecord]) -> str:
    """How Slurm says a part failed (NODE_FAIL, OUT_OF_MEMORY, ...): its combined state says only FAILED."""
    return ",".join(sorted({r.state for r in records if r.state in _FAILED}))


def _exit_code(records: Sequence[QueueRecord] | Sequence[AccountingRecord]) -> str | None:
    """The first non-zero ``code:signal`` among a part's records (het components, array tasks)."""
    return next((r.exit_code for r in records if r.exit_code not in ("", "0:0")), None)


def status_from_queue(part: SlurmJob, records: Sequence[QueueRecord]) -> PartStatus | None:
    mine = [r for r in records if r.root_id == part.slurm_job_id and _matches(part, r.het_offset, r.array_task)]
    if not mine:
        return None
    state = _combine([r.state for r in mine])
    # A pending job's start is Slurm's expectation and a live job's end its time limit: neither happened yet.
    starts = [r.start for r in mine if r.start] if state not in ("PENDING", "REQUEUED") else []
    ends = [r.end for r in mine if r.end] if state in FINAL_PART_STATES else []
    return PartStatus(state, reason=_failed_as(mine) or (mine[0].reason if mine[0].reason != "None" else ""),
                      exit_code=_exit_code(mine) if state in FINAL_PART_STATES else None,
                      nodes=",".join(sorted({r.nodes for r in mine if r.nodes})),
                      start=min(starts) if starts else None, end=max(ends) if ends else None,
                      restarts=max(r.restarts for r in mine))


def status_from_accounting(part: SlurmJob, records: Sequence[AccountingRecord]) -> PartStatus | None:
    mine = [r for r in records if r.id.job == part.slurm_job_id and not r.id.is_step
            and _matches(part, r.id.het_offset, r.id.array_task)]
    if not mine:
        return None
    starts = [r.start for r in mine if r.start]
    ends = [r.end for r in mine if r.end]
    state = _combine([r.state for r in mine])
    return PartStatus(
        state, reason=_failed_as(mine),
        nodes=",".join(sorted({r.nodes for r in mine if r.nodes and r.nodes != "None assigned"})),
        exit_code=_exit_code(mine) or "0:0",
        alloc_tres=";".join(",".join(f"{k}={v:g}" for k, v in sorted(r.alloc_tres.items())) for r in mine),
        start=min(starts) if starts else None,
        end=max(ends) if state in FINAL_PART_STATES and ends else None,
    )


def job_state_from_parts(parts: Iterable[SlurmJob]) -> JobState | None:
    states = [p.state for p in parts if p.current]
    if not states:
        return None
    if any(s == "RUNNING" for s in states):
        return JobState.RUNNING
    if any(s in ("PENDING", "UNKNOWN") for s in states):
        return JobState.SUBMITTED
    if any(s == "FAILED" for s in states):
        return JobState.FAILED
    if any(s == "CANCELLED" for s in states):
        return JobState.CANCELLED
    return JobState.COMPLETED


def forked_round(job: Job) -> SlurmJob | None:
    """The consolidation part of a job whose latest dispatch was a forked (HadarE) round, else None."""
    parts = [p for p in job.slurm_jobs if p.current]
    if not parts:
        return None
    last = max(parts, key=lambda p: (p.id or 0))
    return last if last.role == "consolidation" else None


#: How Slurm ends a job for a fault of the cluster's, not of its own command.
FAULTS = frozenset({"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"})


def lost_consolidation(job: Job) -> SlurmJob | None:
    """The consolidation part of a forked round that a fault ended, perhaps before it wrote the average (its node
    failed or it was preempted, and Slurm did not requeue it: JobRequeue=0, PreemptMode=CANCEL), else None.

    The round's copies are over and their checkpoints are kept, so running it again loses nothing; failing the
    job would lose the whole job to one short CPU step.
    """
    part = forked_round(job)
    return part if part is not None and part.state == "FAILED" and FAULTS & set(part.reason.split(",")) else None


def cut_off(part: SlurmJob) -> str:
    """How a lost consolidation (``lost_consolidation``) ended, as replan's events and actions say it."""
    return f"round {part.round}'s consolidation, Slurm job {part.slurm_job_id}, ended {part.reason}"


def ran_again(session: Session, job: Job, lost_id: str, round: int, ids: list[str], note: str, **data: Any) -> None:
    """Record that round ``round``'s lost consolidation, Slurm job ``lost_id``, runs again as ``ids``: the lost
    part is retired (kept for logs and restarts) and the event counts toward ``replan.CONSOLIDATION_RUNS``."""
    for part in job.slurm_jobs:
        if part.slurm_job_id == lost_id and part.role == "consolidation":
            part.role = "retried"
    job.reason = ""
    add_event(session, job, "consolidated_again", note, round=round, lost=lost_id, slurm_job_ids=ids, **data)


@dataclass(frozen=True)
class SlurmView:
    """What Slurm said about some jobs' live parts.

    Fetched before the write transaction that applies it, so no command holds the
    store's write lock while squeue or sacct answer (fifty concurrent submits
    otherwise queue behind each other's Slurm calls).
    """

    queue: tuple[QueueRecord, ...] = ()
    accounting: tuple[AccountingRecord, ...] = ()

    def status(self, part: SlurmJob) -> PartStatus | None:
        return status_from_queue(part, self.queue) or status_from_accounting(part, self.accounting)


def live_parts(job: Job) -> list[SlurmJob]:
    """The job's current parts that Slurm has not ended yet (pending, running, or not known to have ended)."""
    return [p for p in job.slurm_jobs if p.current and p.state not in FINAL_PART_STATES]


def restarts(job: Job) -> int:
    """Times the job's work was cut off and resumed: Slurm's requeues of a run under its own id (preempted,
    its node failed) plus failed runs that were retried. Het components and a pack's members are one run;
    moving a job that never started is not a restart."""
    requeues: dict[str, int] = {}
    for part in job.slurm_jobs:
        requeues[part.target] = max(requeues.get(part.target, 0), part.restarts or 0)
    retried = {p.target for p in job.slurm_jobs if p.role == "retried"}
    return sum(requeues.values()) + len(retried)


def _live_parts(jobs: Sequence[Job]) -> list[SlurmJob]:
    return [p for job in jobs if not job.state.final for p in live_parts(job)]


def fetch_view(client: SlurmClient, jobs: Sequence[Job]) -> SlurmView:
    """One batched squeue for the jobs' live parts, one batched sacct for those squeue no longer lists."""
    live_parts = _live_parts(jobs)
    if not live_parts:
        return SlurmView()
    queue = client.queue(sorted({p.slurm_job_id for p in live_parts}))
    missing = sorted({p.slurm_job_id for p in live_parts if status_from_queue(p, queue) is None})
    return SlurmView(tuple(queue), tuple(client.accounting(missing)) if missing else ())


#: The event a dispatch writes before its sbatch runs and deletes with its outcome's record. One left on an unplaced
#: job marks a dispatch cut off in between (killed, the store gone): its Slurm job may exist under no record.
DISPATCHING = "dispatching"
#: How much earlier than a cut-off dispatch's mark sacct is asked from: the store's clock and slurmctld's may differ.
CLOCK_SLACK = timedelta(minutes=5)


def mark_dispatching(session: Session, job_ids: Iterable[int],
                     parts: Mapping[int, list[list[dict[str, Any]]]] | None = None,
                     fork: Mapping[str, Any] | None = None) -> None:
    """Say, in its own transaction before sbatch runs, that the jobs are being dispatched (:data:`DISPATCHING`).

    ``parts``: each job's expected store rows per sbatch call (``emit.multipart.expected_rows``); ``fork``: a
    forked round's facts (:func:`record_fork`). With them a cut-off dispatch is adopted as what it was: every
    het component and array task, and a forked round as a round, not one job that ends with its copies."""
    for i in job_ids:
        data: dict[str, Any] = {"parts": (parts or {}).get(i) or []}
        if fork is not None:
            data["fork"] = dict(fork)
        session.add(Event(job_id=i, kind=DISPATCHING, message="sbatch runs for it; cut off, a replan adopts its job",
                          data=data))


def record_fork(session: Session, job: Job, fork: Mapping[str, Any]) -> None:
    """A forked round is on record: the store pins every copy's GPUs while it runs (so the next plan leaves them
    be) and keeps its copies and steps, which the Job Tracker judges the round by. ``fork``: ``plan`` (the
    round's record), ``slots``, ``message`` and ``data`` (the event's), as the dispatch wrote them."""
    job.plan = {**(job.plan or {}), "slots": [list(s) for s in fork["slots"]], "forked": dict(fork["plan"])}
    add_event(session, job, "forked", str(fork["message"]), **dict(fork["data"]))


def _dispatch_mark(session: Session, job: Job) -> dict[str, Any] | None:
    """The data of the job's newest :data:`DISPATCHING` mark, or None."""
    event = session.scalars(select(Event).where(Event.job_id == job.id, Event.kind == DISPATCHING)
                            .order_by(Event.id.desc()).limit(1)).first()
    return dict(event.data or {}) if event is not None else None


def clear_dispatching(session: Session, job: Job) -> None:
    """The dispatch's outcome is on record (or its Slurm job adopted, or none found): no mark is left."""
    session.execute(delete(Event).where(Event.job_id == job.id, Event.kind == DISPATCHING))


def cut_off_since(session: Session, owner: str) -> datetime | None:
    """When the oldest cut-off dispatch of ``owner``'s unplaced jobs began, or None when there is none."""
    return session.scalar(select(func.min(Event.at)).join(Job, Event.job_id == Job.id).where(
        Event.kind == DISPATCHING, Job.owner == owner, Job.state.in_(UNPLACED)))


@dataclass(frozen=True)
class SlurmAnswers:
    """What one command asks Slurm before its write transaction: the stored jobs' view, the whole queue (for
    :func:`adopt_orphans`), and, where a dispatch was cut off, the owner's jobs sacct has since then that the
    queue no longer lists (None: not asked, as no dispatch was cut off)."""

    view: SlurmView
    queue: list[QueueRecord]
    ended: list[AccountingRecord] | None = None
    #: Records slurmctld had yet to hand slurmdbd just before sacct was asked (``SlurmClient.accounting_backlog``):
    #: while any are left, sacct may yet lack a cut-off dispatch's job, so its absence proves nothing.
    behind: int = 0


def ask_slurm(db: Database, client: SlurmClient, states: Sequence[JobState], owner: str) -> SlurmAnswers:
    """Slurm's answers for a sync, asked through a read-only snapshot, so the store's write lock is not held
    while Slurm answers. A cut-off dispatch's Slurm job may have ended and left the queue (MinJobAge) before any
    replan looked: sacct still has it, so it is adopted, not run a second time."""
    with db.snapshot() as session:
        view = fetch_view(client, list_jobs(session, states=states))
        since = cut_off_since(session, owner)
    queue = client.queue()
    if since is None:
        return SlurmAnswers(view, queue)
    listed = {r.root_id for r in queue}
    behind = client.accounting_backlog() or 0  # first: what slurmctld had handed over by now, sacct then shows
    ended = [r for r in client.accounting(since=since - CLOCK_SLACK, user=owner)
             if not r.id.is_step and r.id.job not in listed]
    return SlurmAnswers(view, queue, ended, behind)


def adopt_ended(session: Session, jobs: Sequence[Job], ended: Sequence[AccountingRecord] | None, store_tag: str,
                owner: str, progress_dir: Path, behind: int = 0) -> list[str]:
    """:func:`adopt_orphans` for Slurm jobs of cut-off dispatches that only sacct still lists (``ended``: see
    :class:`SlurmAnswers`), each job then settled from its record; the other cut-off dispatches' marks go, as
    neither squeue nor sacct has a job for them (sbatch did not accept it). While slurmdbd is ``behind``, the
    marks stay and their jobs are not dispatched again (:func:`still_cut_off`): sacct may yet list them."""
    if ended is None:
        return []
    records = [QueueRecord(r.raw_id, r.id.job if r.id.het_offset is not None else None, r.id.het_offset,
                           r.id.job if r.id.array_task is not None else None, r.id.array_task, r.name, r.state, "",
                           r.comment, r.user, r.nodes, r.submit, r.start, r.end, exit_code=r.exit_code)
               for r in ended]
    waiting = [j for j in jobs if j.state in UNPLACED]
    actions = adopt_orphans(session, jobs, records, store_tag, owner)
    sync_jobs(session, [j for j in waiting if j.state not in UNPLACED], SlurmView(accounting=tuple(ended)),
              progress_dir)
    for job in waiting:
        if job.state not in UNPLACED or _dispatch_mark(session, job) is None:
            continue  # adopted, or its half-submitted dispatch retired (``_adopt_dispatch``)
        if behind:
            job.reason = (f"its dispatch was cut off and slurmdbd is {behind} record(s) behind: not dispatched "
                          "again until sacct can say whether sbatch took it")
            actions.append(f"job {job.id}: {job.reason}")
        else:
            clear_dispatching(session, job)
    return actions


def still_cut_off(session: Session, jobs: Sequence[Job]) -> set[int]:
    """Unplaced jobs whose cut-off dispatch is not settled yet (its mark outlived :func:`adopt_ended`): not
    dispatched again this time, so that a Slurm job sacct does not show yet never runs twice."""
    unplaced = [j.id for j in jobs if j.state in UNPLACED]
    if not unplaced:
        return set()
    return set(session.scalars(select(Event.job_id).where(Event.kind == DISPATCHING, Event.job_id.in_(unplaced))))


def sync_jobs(session: Session, jobs: list[Job], view: SlurmView, progress_dir: Path) -> int:
    """Refresh parts of non-final jobs from a view; returns how many jobs changed state.

    Parts the view does not know (submitted after it was fetched) keep their state. ``progress_dir``: the
    jobs' progress files, which :func:`settle_failure` reads for a job whose run failed and
    :func:`settle_stopped` for one whose run stopped on a signal and ended COMPLETED.
    """
    for part in _live_parts(jobs):
        status = view.status(part)
        if status is None:
            continue
        if status.restarts > part.restarts:
            ran_on = f" after it ran on {part.nodes}" if part.nodes else ""
            add_event(session, part.job, "requeued", f"Slurm requeued {part.target}{ran_on} (restart {status.restarts}: "
                      f"preempted, its node failed, or requeued by hand); it resumes from its checkpoint",
                      slurm_job_id=part.target, restarts=status.restarts, nodes=part.nodes)
            part.restarts = status.restarts
        part.state, part.reason = status.state, status.reason
        part.nodes = status.nodes or part.nodes
        part.exit_code = status.exit_code or part.exit_code
        part.alloc_tres = status.alloc_tres or part.alloc_tres
        part.started_at = status.start or part.started_at
        part.ended_at = status.end or part.ended_at
    changed = 0
    for job in jobs:
        if job.state.final or job.state in UNPLACED:
            continue
        new = job_state_from_parts(job.slurm_jobs)
        round_part = forked_round(job)
        if round_part is not None and new is not None and new.final:
            # A forked round ends with its consolidation, which leaves out copies that failed or were cut off
            # with their node. Consolidated: only the replanner's Job Tracker knows if steps are left; cut off
            # by a fault: the Job Tracker runs it again.
            lost = lost_consolidation(job) is not None
            new = None if round_part.state == "COMPLETED" or lost else job_state_from_parts([round_part])
        if new is JobState.FAILED and settle_failure(session, job, progress_dir):
            changed += 1
            continue
        if new is JobState.COMPLETED and settle_stopped(session, job, progress_dir):
            changed += 1
            continue
        if new is not None and new != job.state:
            add_event(session, job, "state", f"{job.state.value} -> {new.value}")
            job.state = new
            starts = [p.started_at for p in job.slurm_jobs if p.started_at]
            ends = [p.ended_at for p in job.slurm_jobs if p.ended_at]
            job.started_at = min(starts) if starts else job.started_at
            job.ended_at = max(ends) if new.final and ends else job.ended_at
            changed += 1
    return changed


def adopt_orphans(session: Session, jobs: Sequence[Job], queue: Sequence[QueueRecord], store_tag: str,
                  owner: str) -> list[str]:
    """Slurm jobs tagged for an unplaced job (sbatch ran, the record did not): record them, do not resubmit.

    Where the cut-off dispatch's mark says which parts it submits (:func:`mark_dispatching`), they are recorded
    as its outcome would have been, or, when Slurm holds only some of them (cut off between two sbatch calls),
    retired to be cancelled (:func:`_adopt_dispatch`). An older mark, or an entrypoint's, says nothing: each Slurm
    job becomes one ``adopted`` part (a sweep array: the job's own task)."""
    known = {p.slurm_job_id for j in jobs for p in j.slurm_jobs}
    ours = [r for r in queue if is_ours(r.comment, store_tag) and r.user == owner and r.root_id not in known]
    actions: list[str] = []
    for job in jobs:
        if job.state not in UNPLACED:
            continue
        withdrawn = _withdrawn(session, job)
        records = [r for r in ours if str(job.id) in tagged_ids(r.comment) and r.root_id not in withdrawn]
        if not records:
            continue
        mark = _dispatch_mark(session, job)
        if mark and mark.get("parts"):
            actions += _adopt_dispatch(session, job, records, mark)
            continue
        for root in dict.fromkeys(r.root_id for r in records):
            record = _root_record(root, records)
            text_ids = tagged_ids(record.comment)
            # One array tagged with several jobs is a sweep array: task k runs the k-th job of the tag.
            sweep = len(text_ids) > 1 and record.array_job_id is not None
            part = SlurmJob(slurm_job_id=root, role="sweep" if sweep else "adopted", het_offset=record.het_offset,
                            array_task=text_ids.index(str(job.id)) if sweep else record.array_task)
            job.slurm_jobs.append(_as_found(part, record))
            actions.append(_adopted(session, job, root, record))
    return actions


def _adopt_dispatch(session: Session, job: Job, records: Sequence[QueueRecord], mark: Mapping[str, Any]) -> list[str]:
    """Record a cut-off dispatch's Slurm jobs as its outcome would have: Slurm numbers jobs in the order sbatch
    took them, so the k-th tagged Slurm job is the dispatch's k-th part. When their number is not the dispatch's
    (sbatch took only the first parts before the cut), none may run, as when sbatch refuses a later part: they
    are recorded superseded (CANCELLING), cancelled before the job is dispatched again (``replan.owed_cancels``)."""
    expected: list[list[dict[str, Any]]] = mark["parts"]
    roots = sorted(dict.fromkeys(r.root_id for r in records), key=_numeric)
    if len(roots) != len(expected):
        for root in roots:
            job.slurm_jobs.append(SlurmJob(slurm_job_id=root, role="superseded", state=CANCELLING))
        clear_dispatching(session, job)
        note = (f"Slurm job(s) {','.join(roots)} found by their comment tag are {len(roots)} of the "
                f"{len(expected)} its cut-off dispatch submits: cancelled, and the job dispatched again")
        add_event(session, job, "withdrawn", note, slurm_job_ids=roots)
        return [f"job {job.id}: {note}"]
    for k, root in enumerate(roots):
        for row in with_ids(expected[k], roots, k):
            part = SlurmJob(**row)
            record = next((r for r in records if r.root_id == root and _matches(part, r.het_offset, r.array_task)),
                          None) or _root_record(root, records)  # a pending array: its master's one record
            job.slurm_jobs.append(_as_found(part, record))
    session.flush()  # ``forked_round`` takes the newest part by id: the consolidation, submitted last
    if mark.get("fork"):
        record_fork(session, job, mark["fork"])
    return [_adopted(session, job, root, _root_record(root, records)) for root in roots]


def _numeric(slurm_id: str) -> tuple[int, str]:
    return (int(slurm_id), "") if slurm_id.isdigit() else (-1, slurm_id)


def _root_record(root: str, records: Sequence[QueueRecord]) -> QueueRecord:
    """The record that speaks for a Slurm job: its leader or master's own, else its first."""
    mine = [r for r in records if r.root_id == root]
    return next((r for r in mine if r.job_id == root and r.array_task is None), mine[0])


def _as_found(part: SlurmJob, record: QueueRecord) -> SlurmJob:
    """The part as Slurm lists it now; one that only sacct still lists ended (see :func:`adopt_ended`)."""
    part.state, part.nodes = record.state, record.nodes or part.nodes or ""
    if record.state in FINAL_PART_STATES:
        part.exit_code, part.started_at, part.ended_at = record.exit_code or None, record.start, record.end
    return part


def _adopted(session: Session, job: Job, root: str, record: QueueRecord) -> str:
    """The job's dispatch is in Slurm after all: it is SUBMITTED and its mark goes."""
    ended = record.state in FINAL_PART_STATES
    job.state, job.reason = JobState.SUBMITTED, ""
    clear_dispatching(session, job)
    add_event(session, job, "adopted", f"Slurm job {root} found by its comment tag"
              + (f", ended {record.state}" if ended else ""))
    return f"adopted Slurm job {root} for job {job.id}"


def _withdrawn(session: Session, job: Job) -> set[str]:
    """Slurm jobs a refused dispatch of ``job`` submitted, then cancelled (a multi-part request whose later part
    sbatch refused; its ``submit_failed`` events say which): tagged and not on record, yet no orphans."""
    refusals = session.scalars(select(Event).where(Event.job_id == job.id, Event.kind == "submit_failed"))
    return {str(i) for event in refusals for i in (event.data or {}).get("cancelled") or ()}


def adopt_lost_rerun(session: Session, jobs: Sequence[Job], queue: Sequence[QueueRecord], store_tag: str,
                     owner: str) -> list[str]:
    """Record as its round's consolidation a rerun of a lost one (``lost_consolidation``) that sbatch may have
    accepted without answering: its refusal says ``maybe_submitted`` and the queue holds a job tagged for it
    alone that is not on record. Left unrecorded, the next replan would run the round's averaging once more.
    """
    actions = []
    known = {p.slurm_job_id for j in jobs for p in j.slurm_jobs}
    for job in jobs:
        lost = lost_consolidation(job)
        refusal = _last_rerun_event(session, job, lost.round) if lost is not None else None
        if lost is None or refusal is None or refusal.kind != "submit_failed" \
                or not (refusal.data or {}).get("maybe_submitted"):
            continue
        record = min((r for r in queue if is_ours(r.comment, store_tag) and r.user == owner
                      and tagged_ids(r.comment) == [str(job.id)] and r.root_id not in known
                      and r.array_job_id is None and r.het_offset is None), key=lambda r: int(r.root_id), default=None)
        if record is None:
            continue
        note = f"{cut_off(lost)}; its run again, Slurm job {record.root_id}, found by its comment tag"
        ran_again(session, job, lost.slurm_job_id, lost.round, [record.root_id], note, adopted=True)
        job.slurm_jobs.append(SlurmJob(slurm_job_id=record.root_id, role="consolidation", round=lost.round,
                                       state=record.state, nodes=record.nodes,
                                       argv=list((refusal.data or {}).get("argv") or lost.argv)))
        session.flush()  # ``forked_round`` takes the newest part by id
        actions.append(f"adopted Slurm job {record.root_id} for job {job.id}: {note}")
    return actions


def _last_rerun_event(session: Session, job: Job, round: int) -> Event | None:
    """The newest attempt to run ``round``'s consolidation again: accepted, or refused."""
    events = session.scalars(select(Event).where(Event.job_id == job.id,
                                                 Event.kind.in_(("consolidated_again", "submit_failed")))
                             .order_by(Event.id.desc()))
    return next((e for e in events if (e.data or {}).get("round") == round), None)


def settle_stopped(session: Session, job: Job, progress_dir: Path) -> bool:
    """A job Slurm calls COMPLETED whose last run checkpointed on a signal and stopped short of its last
    step (``runtime/progress.stopped_short``); True when this decided its state.

    Such a run exits 0 on purpose, so Slurm's word alone would record unfinished work as done. A run that
    reached its time limit with no timeout requeue left is FAILED, with the step it reached and how to go
    on; one stopped for another reason (preempted, its requeue refused) is re-planned and resumes.
    """
    parts = _judged_parts(job)
    if not parts:
        return False
    total = parse_job(job.spec, f"store:job {job.id}").total_steps
    last = stopped_short(read_progress(progress_dir, str(job.id)), total)
    if last is None:
        return False
    _settle_short(session, job, parts, last, total, "COMPLETED", "0:0")  # what COMPLETED means
    return True


def _settle_short(session: Session, job: Job, parts: Sequence[SlurmJob], last: ProgressRecord, total: int,
                  slurm_state: str, exit_code: str) -> None:
    """Retry (or, at its time limit with no timeout requeue left, fail) a job whose run stopped on a signal at
    ``last``'s step before its last one."""
    starts = [p.started_at for p in parts if p.started_at]
    ends = [p.ended_at for p in parts if p.ended_at]
    checkpoint = job.spec.get("checkpoint_dir")
    data = {"slurm_job_ids": sorted({p.target for p in parts}), "slurm_state": slurm_state, "exit_code": exit_code,
            "ran_s": (max(ends) - min(starts)).total_seconds() if starts and ends else None,
            "steps": last.steps_done, "total_steps": total, "stopped": last.state}
    if last.state == "timeout":
        go_on = f"its checkpoint in {checkpoint} is kept: submit the spec again with a longer time_limit to " \
            "resume from it" if checkpoint else "it has no checkpoint_dir: a longer time_limit lets it finish"
        _fail(session, job, f"stopped at its time limit at step {last.steps_done} of {total} with no timeout "
              f"requeue left (SLURMHET_MAX_TIMEOUT_REQUEUES); {go_on}", ends, data)
        return
    resume = "resumes from its checkpoint" if checkpoint else "starts over (no checkpoint_dir)"
    _retry(session, job, parts, f"its run stopped at step {last.steps_done} of {total} ({last.state}) and Slurm "
           f"did not requeue it; re-planned, {resume}", data)


#: Part roles whose failure slurmhet judges (retry or fail); a forked round or an adopted part just fails.
_JUDGED_ROLES = frozenset({"batch", "het", "sweep", "pack"})


def _judged_parts(job: Job) -> list[SlurmJob]:
    """The job's current parts when slurmhet judges how its run ended (all of a judged role), else []."""
    parts = [p for p in job.slurm_jobs if p.current]
    return parts if all(p.role in _JUDGED_ROLES for p in parts) else []


def _member_run(parts: Sequence[SlurmJob], records: Iterable[ProgressRecord]) -> ProgressRecord | None:
    """A pack member's own record (rank 0) of its pack's latest run; None for a job that is not in a pack or
    left no record.

    A pack is one Slurm job for several slurmhet jobs: its state, exit code and end are the pack's (run-pack
    waits for every member and exits with the first failing member's status), so a member that crashed in
    its first seconds beside one that trained for hours, or one that finished its work or checkpointed on a
    signal beside one that crashed, is told apart only by what its own launcher recorded.
    """
    if not parts or any(p.role != "pack" for p in parts):
        return None
    ids = {p.slurm_job_id for p in parts}
    runs = [r for r in records if r.rank == 0 and r.slurm_job_id in ids]
    return max(runs, key=lambda r: r.updated_at, default=None)


def _retry(session: Session, job: Job, parts: Sequence[SlurmJob], reason: str, data: dict[str, Any]) -> None:
    """Back to PENDING with its run's parts retired (kept for logs and restarts): the replanner submits it again."""
    for part in parts:
        part.role = "retried"
    job.state, job.reason, job.started_at, job.ended_at = JobState.PENDING, reason, None, None
    add_event(session, job, "retried", reason, **data)


def _fail(session: Session, job: Job, reason: str, ends: Sequence[datetime], data: dict[str, Any]) -> None:
    """FAILED for good, ended when its run's parts did."""
    job.state, job.reason = JobState.FAILED, reason
    job.ended_at = max(ends) if ends else job.ended_at
    add_event(session, job, "failed", reason, **data)


def _allowed_types(session: Session, job: Job) -> tuple[str, ...]:
    """The spec's types, else every type of the cluster as the last replan saw it."""
    types = tuple((job.spec.get("gpus") or {}).get("types") or ())
    if types:
        return types
    last = session.scalars(select(ClusterSnapshot).order_by(ClusterSnapshot.id.desc()).limit(1)).first()
    return tuple(sorted({t for node in (last.nodes if last else {}).values() for t in node.get("gpus", {})}))


def finished_waiting(jobs: Sequence[Job], records: Sequence[ProgressRecord]) -> list[tuple[Job, int, float]]:
    """Jobs waiting for a run (re-planned, retried) whose command had already finished all its steps (a rank's
    progress record ``done``, exit 0), e.g. a run that ended just as its node failed and Slurm requeued it, with
    their steps and when the command finished. Nothing else closes such a job: no run is left to judge."""
    finished = finished_steps(records)
    out = []
    for job in jobs:
        if (str(job.id) not in finished  # most jobs: no spec to parse on every replan
                or job.state not in UNPLACED or forked_round(job) is not None):
            continue
        total = parse_job(job.spec, f"store:job {job.id}").total_steps
        if finished[str(job.id)] >= total:
            out.append((job, total, max(r.updated_at for r in records
                                        if r.job_id == str(job.id) and r.state == "done" and r.exit_code == 0)))
    return out


def settle_finished(session: Session, job: Job, total: int, done_at: float) -> None:
    """COMPLETED, ended when its command finished (see :func:`finished_waiting`)."""
    add_event(session, job, "state", f"{job.state.value} -> {JobState.COMPLETED.value}: its command had finished "
              f"all {total} steps (progress: done); nothing left to run")
    job.state, job.reason = JobState.COMPLETED, ""
    job.ended_at = datetime.fromtimestamp(done_at, timezone.utc)


def settle_failure(session: Session, job: Job, progress_dir: Path) -> bool:
    """A job whose current run just failed: retried (back to PENDING, the run's parts retired, off the types
    that ran out of memory) or FAILED with the reason and its stderr's tail; True when this decided its state.

    A job whose command already finished all its steps (a progress record ``done`` with exit 0 in
    ``progress_dir``) is COMPLETED instead: a later run that fails (a late requeue, an epilog) has no work
    left to lose or to redo.
    """
    parts = _judged_parts(job)
    if not parts:
        return False
    failed = [p for p in parts if p.state == "FAILED"]
    starts = [p.started_at for p in failed if p.started_at]
    ends = [p.ended_at for p in failed if p.ended_at]
    total = parse_job(job.spec, f"store:job {job.id}").total_steps
    records = read_progress(progress_dir, str(job.id))
    if finished_steps(records).get(str(job.id), 0) >= total:
        ids = sorted({p.target for p in failed})
        add_event(session, job, "state", f"{job.state.value} -> {JobState.COMPLETED.value}: Slurm job "
                  f"{', '.join(ids)} ended FAILED after the command had finished all {total} steps (progress: done)",
                  slurm_job_ids=ids)
        job.state, job.reason = JobState.COMPLETED, ""
        job.ended_at = max(ends) if ends else job.ended_at
        return True
    err = next((stderr_file(p.argv, p.slurm_job_id, p.array_task) for p in failed if p.argv), None)
    err = own_stderr(err, job.id) if err is not None else None  # a pack member's own: not its partners' lines
    try:
        text = err.read_text(errors="replace") if err is not None else ""
    except OSError:
        text = ""
    slurm_state = ",".join(sorted({p.reason for p in failed if p.reason})) or "FAILED"
    exit_code = next((p.exit_code for p in failed if p.exit_code and p.exit_code != "0:0"), "")
    ran_s = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    own = _member_run(failed, records)
    if own is not None and own.state in STOPPED_STATES:  # checkpointed on a signal; another member failed the pack
        _settle_short(session, job, failed, own, total, slurm_state, exit_code)
        return True
    if own is not None and own.state == "failed" and own.exit_code is not None:
        exit_code = f"{own.exit_code}:0"  # its own command's status and end, not the pack's
        ran_s = own.updated_at - min(starts).timestamp() if starts else None
    run = FailedRun(slurm_state, exit_code, ran_s, tuple(sorted({p.gpu_type for p in failed if p.gpu_type})),
                    tail(text))
    events = session.scalars(select(Event).where(Event.job_id == job.id, Event.kind == "retried")).all()
    earlier = sum(1 for e in events if (e.data or {}).get("quick"))
    unusable = tuple(events[-1].data.get("unusable") or ()) if events and events[-1].data else ()
    catalog, allowed = builtin(), _allowed_types(session, job)
    verdict = judge(run, earlier, unusable, allowed,
                    lambda t: model.memory_gb if (model := catalog.lookup(t)) is not None else None)
    data = {"slurm_job_ids": sorted({p.target for p in failed}), "exit_code": run.exit_code,
            "slurm_state": run.slurm_state, "ran_s": run.ran_s, "stderr": str(err) if err else None,
            "stderr_tail": list(run.stderr_tail), "unusable": list(verdict.unusable), "quick": verdict.quick}
    if verdict.action == "retry":
        if verdict.unusable != unusable:
            left = [t for t in allowed if t not in verdict.unusable]
            job.spec = {**job.spec, "gpus": {**(job.spec.get("gpus") or {}), "types": left}}
        _retry(session, job, parts, verdict.reason, data)
    else:
        _fail(session, job, verdict.reason, ends, data)
    return True
