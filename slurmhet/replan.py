"""The cron-driven replanner: lock, sync, learn throughput, detect reset events, plan, apply the diff.

Each run (``slurmhet replan --once``) is idempotent: jobs already in Slurm stay
pinned where they are unless their nodes went away (then they are cancelled and
re-planned), unplaced jobs are submitted when the plan starts them now, and a
second run with nothing new changes nothing. A run killed midway loses nothing:
Slurm jobs carry ``--comment=slurmhet:<id>``, and the next run adopts any that
were submitted but not recorded instead of submitting them again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from slurmhet.cluster import Inventory
from slurmhet.config import Settings
from slurmhet.planner import Allocation
from slurmhet.runtime.progress import ProgressRecord, job_steps, read_progress
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.limits import PartitionRecord
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.profile import SiteProfile
from slurmhet.slurm.runner import SlurmRunner
from slurmhet.spec import parse_job
from slurmhet.startup import StartupCosts, fold_startup, learned_startup
from slurmhet.store import Database, Job, JobState, SlurmJob, add_event, list_jobs
from slurmhet.store.lock import dispatch_lock
from slurmhet.store.models import ClusterSnapshot, Event, ProgressMark, ThroughputObservation
from slurmhet.shared_cluster import SharedCluster, read_shared
from slurmhet.submission import (PLACED, UNPLACED, Candidate, Dispatcher, after_ok_of, cancel_doomed, candidate_of,
                                 dependency_verdicts, describe, dispatches, pending_in_slurm, queue_overdue,
                                 with_verdicts, foreign_gpu_nodes, next_round, plan_for, render_parts,
                                 stored_allocation, unplaceable)
from slurmhet.site_table import learned_table, site_table
from slurmhet.sync import (CANCELLING, LIVE_PART_STATES, adopt_ended, adopt_lost_rerun, adopt_orphans, ask_slurm,
                           cut_off, finished_waiting, forked_round, lost_consolidation, settle_finished, still_cut_off,
                           sync_jobs)
from slurmhet.throughput import ThroughputTable, canonical_key

#: A refused job is retried this many times, then left SUBMIT_FAILED for a person to look at.
MAX_SUBMIT_ATTEMPTS = 5
#: A throughput estimate moving by more than this fraction is a reset event (seed 001 III-C).
THROUGHPUT_SHIFT = 0.2
#: Slurm pending reasons that another GPU type can cure. Any other (QOSMaxGRESPerUser, AssocGrpGRES,
#: ReqNodeNotAvail in a reservation, BeginTime, Dependency, held jobs) is left alone and shown in status.
MOVABLE_REASONS = frozenset({"Resources", "Priority"})
#: The hold Slurm puts on a job it requeued (preempted, its node failed): about two minutes of BeginTime.
#: Such a job restarts from its checkpoint wherever it starts, so the move rule may judge it too.
REQUEUE_HOLD = "BeginTime"
#: Hysteresis of the move rule: another type must finish a pending job at least this many seconds
#: sooner, and by at least MOVE_SHARE of its time left where it waits, so jobs do not flap.
MOVE_MARGIN_S = 60.0
MOVE_SHARE = 0.2


@dataclass
class ReplanResult:
    already_running: bool = False
    events: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    dry_run_parts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- reset events


def node_view(inventory: Inventory) -> dict[str, Any]:
    return {n.name: {"available": n.available, "gpus": dict(n.gpus), "state": n.state} for n in inventory.nodes}


def cluster_events(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """Drained/returned nodes and GPU types appearing or disappearing since the last run."""
    if previous is None:
        return []
    events = []
    for name, now in sorted(current.items()):
        before = previous.get(name)
        if before is None:
            events.append(f"node {name} appeared")
        elif before["available"] and not now["available"]:
            events.append(f"node {name} became unavailable ({now['state']})")
        elif not before["available"] and now["available"]:
            events.append(f"node {name} returned")
    events += [f"node {name} disappeared" for name in sorted(set(previous) - set(current))]

    def types(view: dict[str, Any]) -> set[str]:
        return {t for n in view.values() if n["available"] for t, c in n["gpus"].items() if c}

    events += [f"GPU type {t} appeared" for t in sorted(types(current) - types(previous))]
    events += [f"GPU type {t} disappeared" for t in sorted(types(previous) - types(current))]
    return events


def fold_progress(session: Session, records: Sequence[ProgressRecord], workloads: dict[str, str],
                  table: ThroughputTable) -> tuple[ThroughputTable, list[str]]:
    """EWMA each new per-rank throughput sample into the table; each update is counted once."""
    events = []
    marks = {m.key: m for m in session.scalars(select(ProgressMark))}
    for record in records:
        key = f"{record.job_id}.{record.slurm_job_id}.{record.rank}"
        workload = workloads.get(record.job_id)
        mark = marks.get(key)
        if workload is None or not record.gpu_type or record.samples_per_second <= 0 or (
                mark is not None and mark.updated_at >= record.updated_at):
            continue
        cell = (canonical_key(workload), record.gpu_type.lower())
        before = table.entries.get(cell)
        table = table.observe(workload, record.gpu_type, record.samples_per_second)
        after = table.entries[cell]
        if before is not None and abs(after.value - before.value) > THROUGHPUT_SHIFT * before.value:
            events.append(f"throughput of {workload} on {record.gpu_type} moved {before.value:.1f} -> "
                          f"{after.value:.1f} samples/s")
        obs = session.get(ThroughputObservation, cell)
        if obs is None:
            session.add(ThroughputObservation(workload=cell[0], gpu_type=cell[1], samples_per_s=after.value,
                                              samples=after.samples))
        else:
            obs.samples_per_s, obs.samples, obs.source = after.value, after.samples, "ewma"
        if mark is None:
            mark = marks[key] = ProgressMark(key=key, updated_at=record.updated_at)
            session.add(mark)
        mark.updated_at = record.updated_at
    return table, events


def with_progress(job: Job, reached: dict[str, int], saved: dict[str, int]) -> Candidate | None:
    """The job as the planner sees it, with its work done: the steps its live run reached, or for a job waiting
    for a run the steps its checkpoints hold, where that run resumes (``reached``/``saved``: ``job_steps``).

    A job whose run lost its work since the last checkpoint (a node failure, a preemption) is planned with that
    work left to do again; one whose command saves nothing is planned from its start.
    A job with a live run that reached every step is left for the sync to close when the run ends. A job
    waiting for a run is planned even then, with its last step left: its run saved every step but never
    said it finished (``finished_waiting`` finds one that did), killed as it exited, say,
    with its node failing under it. It runs again from its checkpoint and redoes at most the work since.
    """
    base = candidate_of(job)
    steps = reached if job.state is JobState.RUNNING else saved
    done = steps.get(str(job.id), 0) * base.spec.global_batch
    if done >= base.spec.total_samples:
        if job.state not in UNPLACED:
            return None
        done = max(0, base.spec.total_samples - base.spec.global_batch)
    return replace(base, samples_done=float(done))


# --------------------------------------------------------------------------- the run


def displaced(job: Job, inventory: Inventory) -> tuple[str, ...]:
    """The planned nodes that are gone under a job waiting in Slurm (its pending parts must be re-planned):
    a job not yet started, or one Slurm requeued after its node failed. Empty when none is gone."""
    alloc = stored_allocation(job)
    if job.state is not JobState.SUBMITTED or alloc is None:
        return ()
    if any(p.state != "PENDING" for p in job.slurm_jobs if p.current):
        return ()
    usable = {n.name for n in inventory.usable().nodes}
    return tuple(sorted({node for node, _, _ in alloc.slots if node not in usable}))


def supersede(job: Job) -> None:
    """Retire the job's current parts: the store's record that their Slurm jobs are to be cancelled."""
    for part in job.slurm_jobs:
        if part.current:
            part.role, part.state = "superseded", CANCELLING


def owed_cancels(jobs: Sequence[Job], queue: Sequence[QueueRecord]) -> list[str]:
    """Slurm jobs of superseded parts that squeue still lists as live: a replan was stopped between its
    store write and its scancel. Cancelled now, before anything new of the job is submitted."""
    live = [r for r in queue if r.state in LIVE_PART_STATES]
    targets = {r.root_id for r in live} | {f"{r.root_id}_{r.array_task}" for r in live if r.array_task is not None}
    return sorted({p.target for j in jobs for p in j.slurm_jobs
                   if p.role == "superseded" and p.state == CANCELLING and p.target in targets})


def stranded_copies(job: Job, inventory: Inventory) -> list[tuple[SlurmJob, tuple[str, ...]]]:
    """Forked copies of the job's round pending on their pinned node, now down or drained (Slurm requeued the
    copy there when the node failed under it, or it never started), with those nodes: left there, the round's
    consolidation (afterany) would wait forever."""
    usable = {n.name for n in inventory.usable().nodes}
    out = []
    for part in job.slurm_jobs:
        if part.role != "array" or part.state != "PENDING":
            continue
        gone = tuple(n for n in part.nodes.split(",") if n and n not in usable)
        if gone:
            out.append((part, gone))
    return out


def requeued(job: Job) -> bool:
    """Slurm requeued the job's current run under its own id (preempted, or its node failed)."""
    return any(p.restarts for p in job.slurm_jobs if p.current)


def dependency_lost(job: Job) -> bool:
    """A dependant waiting in Slurm on an afterok that can no longer be met: the predecessor run it names
    failed and was retried under a new Slurm id (one that failed for good dooms the dependant instead)."""
    parts = [p for p in job.slurm_jobs if p.current]
    return job.state is JobState.SUBMITTED and bool(parts) and all(
        p.state == "PENDING" and p.reason == "DependencyNeverSatisfied" for p in parts)


def requeue_held(job: Job) -> tuple[str, ...]:
    """The Slurm jobs (scontrol targets) of a job that Slurm requeued and holds until its BeginTime; empty if none.
    The hold only delays the restart from its checkpoint: released, the job starts as soon as Slurm can place it."""
    parts = [p for p in job.slurm_jobs if p.current and p.state == "PENDING"]
    return tuple(sorted({p.target for p in parts if p.restarts and p.reason == REQUEUE_HOLD}))


def outranked(targets: Sequence[str], queue: Sequence[QueueRecord], partitions: Sequence[PartitionRecord]) -> bool:
    """Whether a pending job of a partition with a higher PriorityTier than the targets' shares their nodes:
    the job that preempted them, which Slurm's requeue hold lets start first."""
    tier = {p.name: p.priority_tier for p in partitions}
    nodes = {p.name: set(p.nodes) for p in partitions}
    ids = {t.split("_")[0] for t in targets}
    mine = [r for r in queue if r.root_id in ids]
    return any(r.state == "PENDING" and r.root_id not in ids and tier.get(r.partition, 1) > tier.get(m.partition, 1)
               and nodes.get(r.partition, set()) & nodes.get(m.partition, set()) for m in mine for r in queue)


@dataclass(frozen=True)
class Waiting:
    """One of the caller's jobs that is pending in Slurm and has never started."""

    job_id: int
    slurm_job_ids: tuple[str, ...]
    types: tuple[str, ...]
    reason: str
    #: Requeued by Slurm after it ran (it resumes from its checkpoint wherever it starts next).
    requeued: bool = False


def waiting_in_slurm(job: Job) -> Waiting | None:
    """The job as a candidate for the move rule, or None when it runs or is not a plain pending job. A job
    that started is one only once Slurm requeued it: it starts over from its checkpoint either way."""
    alloc = stored_allocation(job)
    again = requeued(job)
    # Packs, arrays and their consolidations stay put: only a plain job's parts may move.
    if alloc is None or not pending_in_slurm(job, again):
        return None
    parts = [p for p in job.slurm_jobs if p.current]
    return Waiting(job.id, tuple(sorted({p.slurm_job_id for p in parts})), tuple(sorted(alloc.by_type())),
                   ",".join(sorted({p.reason for p in parts if p.reason})), again)


@dataclass(frozen=True)
class Move:
    """The move rule's verdict on one pending job: where it finishes if it stays, and if it moves."""

    job_id: int
    slurm_job_ids: tuple[str, ...]
    stay_finish_s: float
    move_finish_s: float
    #: The types it may go to (allowed, reachable, not where it waits) and those the plan chose.
    elsewhere: tuple[str, ...]
    to: str


def judge_moves(waiting: Sequence[Waiting], candidates: Sequence[Candidate], inventory: Inventory,
                table: ThroughputTable, policy: str, now: float, shared: SharedCluster,
                startup: StartupCosts | None = None, max_wait_s: float | None = None) -> list[Move]:
    """Which pending jobs another allowed GPU type finishes sooner, by the margin (pure, two plans per job).

    Staying finishes at Slurm's expected start (``squeue --start``; else the plan's predicted start on
    the job's own types) plus its run time there; moving, at the plan's predicted finish with the job
    unplaced and kept off its current types. Only reasons in MOVABLE_REASONS are judged.
    """
    out = []
    have = inventory.usable().gpus_by_type()
    for wait in waiting:
        movable = MOVABLE_REASONS | ({REQUEUE_HOLD} if wait.requeued else set())
        if not wait.reason or not set(wait.reason.split(",")) <= movable:
            continue
        others = [c for c in candidates if c.job_id != wait.job_id]
        mine = next((c for c in candidates if c.job_id == wait.job_id), None)
        if mine is None:
            continue
        free = replace(mine, current=None)
        allowed = mine.spec.gpus.types or inventory.gpu_types
        # Only types the caller may reach: an empty reach would leave the what-if free to use any type.
        elsewhere = tuple(t for t in allowed if t not in wait.types and t in shared.access.types)
        # Either what-if must be able to hold the job now (a node down leaves fewer GPUs than gpus.min).
        if not elsewhere or min(sum(have.get(t, 0) for t in types) for types in (elsewhere, wait.types)) \
                < mine.spec.gpus.min:
            continue
        stay = plan_for([*others, free], inventory, table, policy, now, shared=shared,
                        only={wait.job_id: wait.types}, startup=startup, max_wait_s=max_wait_s).job(str(wait.job_id))
        slurm_starts = [shared.world.starts[i].expected_start for i in wait.slurm_job_ids if i in shared.world.starts]
        known = [s.timestamp() for s in slurm_starts if s is not None]
        stay_finish = (max(max(known), now) + stay.run_seconds) if known else stay.finish_s
        move = plan_for([*others, free], inventory, table, policy, now, shared=shared,
                        only={wait.job_id: elsewhere}, startup=startup, max_wait_s=max_wait_s).job(str(wait.job_id))
        gain = stay_finish - move.finish_s
        if gain >= max(MOVE_MARGIN_S, MOVE_SHARE * (stay_finish - now)):
            to = "+".join(move.allocation.by_type()) if move.allocation else "/".join(elsewhere)
            out.append(Move(wait.job_id, wait.slurm_job_ids, stay_finish, move.finish_s, elsewhere, to))
    return out


def round_consolidated(part: SlurmJob, own_slurm_job_id: str | None) -> bool:
    """The round's average is written: its consolidation completed, or this replan is that consolidation's
    ``then`` step (which runs only after ``slurmhet consolidate`` succeeded, while the part still runs)."""
    return part.state == "COMPLETED" or (own_slurm_job_id is not None and part.slurm_job_id == own_slurm_job_id)


def job_tracker(session: Session, jobs: Sequence[Job], steps: dict[str, int], dry_run: bool,
                own_slurm_job_id: str | None) -> tuple[list[str], list[str]]:
    """HadarE's Job Tracker after a forked round: aggregate the copies' steps, then plan the next round or finish.

    A job whose round is consolidated and has steps left goes back to PENDING (the plan dispatches round
    k+1); one whose steps are all done is COMPLETED. A round still running is left alone. Returns
    (events, actions).
    """
    events, actions = [], []
    for job in jobs:
        part = forked_round(job)
        if part is None or job.state in UNPLACED or job.state.final or not round_consolidated(part, own_slurm_job_id):
            continue
        total = parse_job(job.spec, f"store:job {job.id}").total_steps
        done = steps.get(str(job.id), 0)
        if done < total:
            events.append(f"job {job.id} ({job.name}) round {part.round} consolidated at step {done}")
            actions.append(f"plan round {part.round + 1} of job {job.id}: {total - done} steps left")
            if not dry_run:
                job.state, job.reason, job.ended_at = JobState.PENDING, f"round {part.round} consolidated at step " \
                    f"{done}; next round to plan", None
                add_event(session, job, "round", f"round {part.round} consolidated at step {done}",
                          round=part.round, steps=done)
        elif part.state != "COMPLETED":
            # This replan is the last round's consolidation itself: the next replan closes the job once it ends.
            events.append(f"job {job.id} ({job.name}) round {part.round} consolidated at step {done}: all steps done")
        else:
            events.append(f"job {job.id} ({job.name}) completed all {total} steps in {part.round + 1} round(s)")
            if not dry_run:
                add_event(session, job, "state", f"{job.state.value} -> {JobState.COMPLETED.value}")
                job.state, job.reason = JobState.COMPLETED, ""
                job.ended_at = part.ended_at or datetime.now(timezone.utc)
                add_event(session, job, "round", f"round {part.round} consolidated at step {done}: all steps done",
                          round=part.round, steps=done)
    return events, actions


#: Runs of one round's consolidation that faults may cut off before its job is FAILED: a node that keeps failing
#: under a short CPU step is the site's to repair, not a job to resubmit for ever.
CONSOLIDATION_RUNS = 3


def _refusals_since_last_run(events: Sequence[Event]) -> list[Event]:
    """The refused runs again of a round's consolidation (``submit_failed``, oldest first) since it last ran: each
    replan tries once more, up to ``MAX_SUBMIT_ATTEMPTS``, as for a job's own dispatch. A refusal sbatch may have
    taken without answering is not counted: the next replan finds such a run by its tag (``adopt_lost_rerun``)."""
    refused: list[Event] = []
    for event in events:
        refused = [] if event.kind == "consolidated_again" else refused
        if event.kind == "submit_failed" and not (event.data or {}).get("maybe_submitted"):
            refused.append(event)
    return refused


def lost_rounds(session: Session, jobs: Sequence[Job], dry_run: bool) -> tuple[list[int], list[str], list[str]]:
    """Forked jobs whose round's consolidation a fault cut off (``sync.lost_consolidation``): the ones whose
    consolidation runs again, and FAILED the ones cut off ``CONSOLIDATION_RUNS`` times. Returns (job ids to
    consolidate again, events, actions)."""
    again: list[int] = []
    events, actions = [], []
    for job in jobs:
        part = lost_consolidation(job)
        if part is None or job.state.final or job.state in UNPLACED:  # unplaced: the Job Tracker took the round
            continue  # as consolidated (this replan ran in it, after its average was written)
        earlier = [e for e in session.scalars(select(Event).where(
            Event.job_id == job.id, Event.kind.in_(("consolidated_again", "submit_failed"))).order_by(Event.id))
            if (e.data or {}).get("round") == part.round]
        runs = 1 + sum(1 for e in earlier if e.kind == "consolidated_again")
        refused = _refusals_since_last_run(earlier)
        cut = cut_off(part)
        events.append(f"job {job.id} ({job.name}): {cut} (run {runs})")
        if runs < CONSOLIDATION_RUNS and len(refused) < MAX_SUBMIT_ATTEMPTS:
            again.append(job.id)
            if dry_run:
                actions.append(f"would run round {part.round}'s consolidation of job {job.id} again")
            continue
        kept = f"the copies' checkpoints and the last average are kept in {job.spec.get('checkpoint_dir')}"
        if len(refused) >= MAX_SUBMIT_ATTEMPTS:
            reason = (f"{cut}: its run again was refused {len(refused)} times (MAX_SUBMIT_ATTEMPTS), last: "
                      f"{refused[-1].message}; {kept}")
        else:
            reason = f"{cut}: {runs} runs of it cut off by faults (CONSOLIDATION_RUNS); {kept}"
        actions.append(f"{'would fail' if dry_run else 'failed'} job {job.id} ({job.name}): {reason}")
        if not dry_run:
            job.state, job.reason = JobState.FAILED, reason
            job.ended_at = part.ended_at or datetime.now(timezone.utc)
            add_event(session, job, "failed", reason, round=part.round, slurm_job_ids=[part.slurm_job_id])
    return ([] if dry_run else again), events, actions


class Replanner:
    def __init__(self, db: Database, client: SlurmClient, profile: SiteProfile, settings: Settings,
                 runner: SlurmRunner, owner: str) -> None:
        self.db, self.client, self.profile, self.settings, self.runner = db, client, profile, settings, runner
        self.owner = owner

    def run(self, dry_run: bool = False) -> ReplanResult:
        with dispatch_lock(self.db, self.settings.state_dir, self.owner) as held:
            if not held:
                return ReplanResult(already_running=True)
            return self._run(dry_run)

    def _run(self, dry_run: bool) -> ReplanResult:
        result = ReplanResult()
        inventory = Inventory(tuple(self.client.nodes()))
        now = datetime.now(timezone.utc).timestamp()
        answers = ask_slurm(self.db, self.client, UNPLACED + PLACED, self.owner)
        view, queue = answers.view, answers.queue
        records = read_progress(self.settings.progress_dir)
        with self.db.transaction() as session:
            jobs = list_jobs(session, states=UNPLACED + PLACED)
            sync_jobs(session, jobs, view, self.settings.progress_dir)
            mine = [j for j in jobs if j.owner == self.owner]
            result.actions += adopt_orphans(session, mine, queue, self.db.instance, self.owner)
            result.actions += adopt_ended(session, mine, answers.ended, self.db.instance, self.owner,
                                          self.settings.progress_dir, answers.behind)
            unsettled = still_cut_off(session, mine)
            result.actions += adopt_lost_rerun(session, mine, queue, self.db.instance, self.owner)
            # A forked job's round ending is the Job Tracker's to judge (next round, or done): see job_tracker.
            result.events += [f"job {j.id} ({j.name}) ended {j.state.value}" for j in jobs
                              if j.state.final and forked_round(j) is None]
            result.events += [f"job {j.id} ({j.name}) arrived" for j in mine if j.plan is None]
            workloads = {str(j.id): self._workload(j) for j in jobs}
            table, shifts = fold_progress(session, records, workloads,
                                          learned_table(session, site_table(self.settings)))
            result.events += shifts
            fold_startup(session, jobs, records, workloads, table.ewma_alpha)
            startup = learned_startup(session)
            view = node_view(inventory)
            last = session.scalars(select(ClusterSnapshot).order_by(ClusterSnapshot.id.desc()).limit(1)).first()
            result.events += cluster_events(last.nodes if last else None, view)
            if last is None or last.nodes != view:
                session.add(ClusterSnapshot(nodes=view))
            for event in result.events:
                add_event(session, None, "reset", event)
            owed = self._displace(session, mine, inventory, queue, dry_run, result)
            finished = finished_waiting(mine, records)
            for job, total, done_at in finished:
                result.actions.append(f"{'would complete' if dry_run else 'completed'} job {job.id} ({job.name}): its "
                                      f"command had finished all {total} steps before it was re-planned")
                if not dry_run:
                    settle_finished(session, job, total, done_at)
            steps, saved = job_steps(records), job_steps(records, saved=True)
            # Forked jobs whose round ended: the sync leaves them open for the Job Tracker.
            forked = [j for j in mine if forked_round(j) is not None]
            tracked_events, tracked_actions = job_tracker(session, forked, steps, dry_run,
                                                          os.environ.get("SLURM_JOB_ID"))
            result.events += tracked_events
            result.actions += tracked_actions
            consolidate, lost_events, lost_actions = lost_rounds(session, forked, dry_run)
            result.events += lost_events
            result.actions += lost_actions
            rounds = {j.id: next_round(j) for j in mine if j.state in UNPLACED and next_round(j)}
            waiting = [w for w in (waiting_in_slurm(j) for j in mine) if w is not None]
            closed = {j.id for j, _, _ in finished}  # in a dry run: would be, so not planned either
            live_jobs = [j for j in jobs if not j.state.final and j.id not in closed]
            found = dependency_verdicts(session, live_jobs)
            mine_doomed = {j.id: found.doomed[j.id] for j in mine if j.id in found.doomed}
            if dry_run:
                result.actions += [f"would cancel job {i}: {why}" for i, why in mine_doomed.items()]
            else:
                result.actions += cancel_doomed(session, mine, mine_doomed, self.client.cancel)
            live_jobs = [j for j in live_jobs if not j.state.final and j.id not in mine_doomed]
            candidates = [c if c is None else with_verdicts(c, found)
                          for c in (with_progress(j, steps, saved) for j in live_jobs)]
            kept_back = unsettled | {j.id for j in mine
                                     if j.state is JobState.SUBMIT_FAILED and j.attempts >= MAX_SUBMIT_ATTEMPTS}
        if owed and not dry_run:
            self._cancel(owed)
        dispatcher = Dispatcher(self.db, self.client, self.profile, self.settings, self.runner)
        result.actions += [dispatcher.consolidate_again(job_id, inventory) for job_id in consolidate]
        candidates = [c for c in candidates if c is not None]
        if not candidates:  # a job whose steps are all done may still be held (preempted as it ended)
            self._release_holds(mine, queue, owed, dry_run, result)
            return result
        shared = read_shared(self.client, queue, self.db.instance, self.owner, now,
                             [c.spec for c in candidates if c.current is None])
        moves = judge_moves(waiting, candidates, inventory, table, self.settings.default_policy, now, shared,
                            startup, self.settings.max_wait_s)
        moved = {m.job_id: m.elsewhere for m in moves}
        for move in moves:
            note = (f"job {move.job_id} pending in Slurm {','.join(move.slurm_job_ids)} moves to {move.to}: "
                    f"finishes ~{move.move_finish_s - now:.0f} s from now there vs ~{move.stay_finish_s - now:.0f} s "
                    f"where it waits")
            result.events.append(note)
            result.actions.append(f"cancel Slurm job(s) {','.join(move.slurm_job_ids)} of job {move.job_id}: {note}")
            if not dry_run:
                self._supersede(move, note)
        self._release_holds([j for j in mine if j.id not in moved], queue, owed, dry_run, result)
        # A moved job is planned afresh, kept off the types it waited for (this run's verdict stands).
        candidates = [replace(c, current=None) if c.job_id in moved else c for c in candidates]
        plan = plan_for(candidates, inventory, table, self.settings.default_policy, now, shared=shared, only=moved,
                        startup=startup, max_wait_s=self.settings.max_wait_s)
        ready = {c.job_id: c.spec for c in candidates
                 if c.current is None and c.owner == self.owner and c.job_id not in kept_back}
        plan, queued = queue_overdue(plan, candidates, ready, inventory, self.settings.max_wait_s)
        work = dispatches(plan, ready, self.profile, self.settings, inventory, self.db.instance, table=table,
                          steps_done={c.job_id: int(c.samples_done // c.spec.global_batch) for c in candidates},
                          rounds=rounds, busy_nodes=foreign_gpu_nodes(queue, self.db.instance),
                          partitions=shared.partitions(), after_ok=after_ok_of(candidates), queued=queued)
        if dry_run:
            for d in work:
                alloc = Allocation(d.fork.slots) if d.fork else plan.job(str(d.job_ids[0])).allocation
                result.actions.append(f"submit job(s) {','.join(map(str, d.job_ids))}: {describe(alloc)}"
                                      + (f" (forked into {len(d.fork.copies)} copies)" if d.fork else "")
                                      + (" (overdue: queued in Slurm)" if queued & set(d.job_ids) else ""))
                result.dry_run_parts += render_parts(d.parts)
            return result
        dispatcher.record_plan(plan, list(ready), unplaceable(candidates, inventory), startup,
                               queued=[c.job_id for c in candidates if c.queued and c.owner == self.owner])
        for d in work:
            for outcome in dispatcher.submit(d, plan):
                forked_note = f" forked into {len(d.fork.copies)} copies, round {d.fork.round}" if d.fork else ""
                result.actions.append(f"job {outcome.job_id} ({outcome.name}): {outcome.state} {outcome.allocation}"
                                      + forked_note
                                      + (" queued in Slurm (overdue)" if outcome.job_id in queued else "")
                                      + (f" Slurm {','.join(outcome.slurm_job_ids)}" if outcome.slurm_job_ids else "")
                                      + (f" ({outcome.reason})" if outcome.reason else ""))
        return result

    def _displace(self, session: Session, mine: Sequence[Job], inventory: Inventory, queue: Sequence[QueueRecord],
                  dry_run: bool, result: ReplanResult) -> list[str]:
        """Re-plan jobs waiting in Slurm on nodes that are gone or on an afterok that cannot be met, and leave
        out of its round a forked copy pending on its dead node. Returns the Slurm jobs to cancel once this
        transaction is committed: the store says first (parts ``superseded``, state CANCELLING), Slurm is told
        after, so a replan killed in between leaves a record that the next run finishes (see ``owed_cancels``),
        never a job whose cancelled parts read as the user's cancel."""
        owed = owed_cancels(mine, queue)
        if not dry_run:
            for job in mine:
                for part in job.slurm_jobs:
                    if part.role == "superseded" and part.state == CANCELLING and part.target not in owed:
                        part.state = "CANCELLED"
        for job in mine:
            for part, nodes in stranded_copies(job, inventory):
                left_out = (f"node {','.join(nodes)} "
                            + ("failed under" if part.restarts or part.started_at else "is gone for")
                            + f" job {job.id} ({job.name}): copy {part.array_task} of round {part.round} is left "
                              "out, the round is consolidated without it")
                result.events.append(left_out)
                result.actions.append(f"cancel Slurm job {part.element} of job {job.id}: {left_out}")
                owed.append(part.element)
                if not dry_run:
                    part.state = CANCELLING  # the next sync reads Slurm's word; still pending there: judged again
                    add_event(session, None, "reset", left_out)
                    add_event(session, job, "reset", left_out)
            gone = displaced(job, inventory)
            if gone and requeued(job):
                failed = (f"node {','.join(gone)} failed under job {job.id} ({job.name}); Slurm requeued it "
                          f"there: re-planned now, resumes from its checkpoint")
                result.events.append(failed)
                if not dry_run:
                    add_event(session, None, "reset", failed)
            why = ("its nodes became unavailable" if gone else
                   "the Slurm job(s) it was to start after will never complete (a predecessor was retried)"
                   if dependency_lost(job) else "")
            if not why:
                continue
            live = sorted({p.target for p in job.slurm_jobs if p.current and p.state == "PENDING"})
            result.actions.append(f"cancel Slurm job(s) {','.join(live)} of job {job.id}: "
                                  + ("nodes gone" if gone else why))
            owed += live
            if not dry_run:
                supersede(job)
                job.state, job.reason = JobState.PENDING, f"re-planned: {why}"
                add_event(session, job, "displaced", job.reason, slurm_job_ids=live)
        return list(dict.fromkeys(owed))  # a pack's members share one Slurm job: cancelled once

    def _release_holds(self, jobs: Sequence[Job], queue: Sequence[QueueRecord], cancelled: Sequence[str],
                       dry_run: bool, result: ReplanResult) -> None:
        """Release Slurm's requeue hold on the jobs it holds, unless this run cancelled them or a job of a higher
        partition tier waits for those nodes (it preempted this one: the hold lets it start first)."""
        held = {job.id: targets for job in jobs if not job.state.final
                and (targets := tuple(t for t in requeue_held(job) if t not in cancelled))}
        if not held:
            return
        partitions = self.client.partitions()
        released: list[str] = []
        for job_id, targets in held.items():
            if outranked(targets, queue, partitions):
                continue
            result.actions.append(f"release Slurm's requeue hold on {','.join(targets)} of job {job_id}: it "
                                  "resumes from its checkpoint as soon as Slurm can start it")
            released += targets
        if released and not dry_run:
            # a pack's members share one Slurm job: released once, or the second release meets a started job
            self.client.release_requeue_hold(list(dict.fromkeys(released)))

    def _supersede(self, move: Move, note: str) -> None:
        """Put a pending job back in the store's queue, then cancel its Slurm parts: a replan killed in between
        leaves them CANCELLING, and the next run cancels them (``owed_cancels``) before it submits anything."""
        with self.db.transaction() as session:
            job = session.get(Job, move.job_id)
            assert job is not None
            supersede(job)
            job.state, job.reason = JobState.PENDING, f"moved: {note}"
            add_event(session, job, "reset", note, slurm_job_ids=list(move.slurm_job_ids),
                      stay_finish_s=move.stay_finish_s, move_finish_s=move.move_finish_s, to=move.to)
        self._cancel(list(move.slurm_job_ids))

    def _cancel(self, targets: Sequence[str]) -> None:
        """scancel what the store already marked CANCELLING, then record that Slurm took it."""
        self.client.cancel(list(targets))
        with self.db.transaction() as session:
            for part in session.scalars(select(SlurmJob).where(SlurmJob.state == CANCELLING)).all():
                if part.target in targets or part.element in targets:
                    part.state = "CANCELLED"  # a superseded part, or a forked copy left out of its round

    @staticmethod
    def _workload(job: Job) -> str:
        w = job.spec.get("workload", {})
        return f"{w.get('model')} (batch size {w.get('batch_size')})"
