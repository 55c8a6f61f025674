"""Plan and dispatch: from stored + new jobs to a Plan, and from a Plan to Slurm parts in the store.

``slurmhet submit`` (the fast path) and ``slurmhet replan`` (the periodic one)
share this. Order matters for "no job is lost": jobs are stored (and committed)
before sbatch runs, each Slurm answer is recorded right after, and every Slurm
job carries ``--comment=slurmhet:<id>`` so a crash between sbatch and the record
is found by the next sync. A refusal leaves the job SUBMIT_FAILED with Slurm's
words, and the next replan retries it.
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from slurmhet.cluster import Inventory, OpenWorld
from slurmhet.config import Settings
from slurmhet.emit.from_plan import (EmitSettings, consolidation_request, container_runtime_for, pack_parts,
                                    requests_for, sweep_arrays)
from slurmhet.emit.multipart import MultiPartOutcome, MultiPartSubmitter, Part, expected_rows, shown_ids
from slurmhet.errors import InputError
from slurmhet.forking import DEFAULT_ROUND_S, ForkedJob, job_forker
from slurmhet.planner import (
    POLICIES, QUEUE_PREPARE, Allocation, JobPlan, Plan, PlanningInput, Progress, is_overdue, plan_job_from_spec,
)
from slurmhet.runtime.progress import job_steps, read_progress
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.profile import SiteProfile
from slurmhet.slurm.runner import SlurmCommandError, SlurmRunner
from slurmhet.slurm.world import is_ours
from slurmhet.shared_cluster import SharedCluster, check_access, narrowed, read_shared, within_reach
from slurmhet.spec import JobSpec, check_against_cluster, parse_job
from slurmhet.startup import StartupCosts, learned_startup
from slurmhet.store import Database, Job, JobState, SlurmJob, add_event, create_job, get_job, list_jobs
from slurmhet.store.lock import dispatch_lock
from slurmhet.sync import (UNPLACED, adopt_ended, adopt_orphans, ask_slurm, clear_dispatching, cut_off,
                           live_parts, lost_consolidation, mark_dispatching, ran_again, record_fork, sync_jobs)
from slurmhet.dependencies import Verdicts, preview_hold, resolve, verdicts
from slurmhet.site_table import live_table, site_table, with_specs
from slurmhet.throughput import ThroughputTable

#: Seconds between Slurm's USR2 (``--signal=B:USR2@N``) and the time limit; the runtime checkpoints then.
SIGNAL_LEAD_S = 120
#: Jobs holding (or about to hold) GPUs: pinned where they are.
PLACED = (JobState.SUBMITTED, JobState.RUNNING)
#: Seconds per HadarE round (forked copies train this long, then consolidate); the environment overrides it.
FORK_ROUND_ENV = "SLURMHET_FORK_ROUND_S"
#: Part roles of a forked round.
FORK_ROLES = ("array", "consolidation")
#: Part roles that are a whole plain job in Slurm's queue (not a pack, a forked round or an array of a sweep).
PLAIN_ROLES = frozenset({"batch", "het", "adopted"})


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def job_environment(settings: Settings, inventory: Inventory) -> tuple[tuple[str, str], ...]:
    """What every launched program needs besides its spec: where progress goes, how to reach nodes."""
    env = [("SLURMHET_PROGRESS_DIR", str(settings.progress_dir)), ("SLURMHET_SIGNAL_LEAD_S", str(SIGNAL_LEAD_S))]
    addrs = ",".join(f"{n.name}={n.addr}" for n in inventory.nodes if n.addr)
    if addrs:
        env.append(("SLURMHET_NODE_ADDRS", addrs))
    if os.environ.get("SLURMHET_EMULATE_THROUGHPUT") == "1":
        env.append(("SLURMHET_EMULATE_THROUGHPUT", "1"))
        if os.environ.get("SLURMHET_EMULATION_TABLE"):
            env.append(("SLURMHET_EMULATION_TABLE", os.environ["SLURMHET_EMULATION_TABLE"]))
    return tuple(env)


def emit_settings(settings: Settings, store_tag: str, inventory: Inventory,
                  partitions: Mapping[str, str] | None = None) -> EmitSettings:
    """How parts are written; ``partitions`` maps a GPU type to the partition its jobs go to."""
    slurmhet = (sys.executable, "-m", "slurmhet")
    return EmitSettings(log_dir=str(settings.log_dir), launcher=(*slurmhet, "run", "--"), slurmhet=slurmhet,
                        partition=settings.slurm.partition, pack_sharing="auto", store_tag=store_tag,
                        partitions=dict(partitions or {}),
                        env=job_environment(settings, inventory),
                        # A consolidation ends by planning the next round at once; cron catches up otherwise.
                        after_consolidation=(*slurmhet, "replan", "--once"))


def fork_round_s() -> float:
    """HadarE's round length in seconds (``$SLURMHET_FORK_ROUND_S``, default ``DEFAULT_ROUND_S``)."""
    text = os.environ.get(FORK_ROUND_ENV, "")
    try:
        value = float(text) if text else DEFAULT_ROUND_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InputError(f"{FORK_ROUND_ENV}={text!r} is not a positive number of seconds", place=FORK_ROUND_ENV,
                         hint="e.g. 360 (the paper's slot for large mixes) or 90 for small ones")
    return value


def fork_facts(fork: ForkedJob) -> dict[str, Any]:
    """What the store records of a forked round once sbatch took it (``sync.record_fork``); a dispatch's mark
    keeps it too, so a cut-off round is adopted as a round."""
    return {"plan": fork.record(), "slots": [list(s) for s in fork.slots],
            "message": f"forked into {len(fork.copies)} copies (round {fork.round}, {fork.total_round_steps} steps: "
                       f"{'+'.join(map(str, fork.round_steps))})",
            "data": {"round": fork.round, "copies": describe(Allocation(fork.slots)),
                     "round_steps": list(fork.round_steps)}}


def next_round(job: Job) -> int:
    """The round a job's next forked dispatch is: one past its last forked round, else 0."""
    rounds = [p.round for p in job.slurm_jobs if p.role in FORK_ROLES]
    return max(rounds) + 1 if rounds else 0


def foreign_gpu_nodes(queue: Sequence[QueueRecord], store_tag: str) -> frozenset[str]:
    """Nodes where a running Slurm job that this store did not submit holds GPUs: no copies go there."""
    from slurmhet.runtime.hostlist import expand_hostlist

    busy: set[str] = set()
    for record in queue:
        if record.state not in ("RUNNING", "COMPLETING", "SUSPENDED") or "gres/gpu" not in record.alloc_tres:
            continue
        if is_ours(record.comment, store_tag):
            continue
        busy.update(expand_hostlist(record.nodes) if record.nodes else [])
    return frozenset(busy)


@dataclass(frozen=True)
class Candidate:
    """A job as the planner input needs it: its id, spec, when it arrived, and where it runs (if it does)."""

    job_id: int
    spec: JobSpec
    submitted_at: float
    current: Allocation | None = None
    samples_done: float = 0.0
    owner: str = ""
    #: The Slurm pack job this job shares a GPU in: its members hold that GPU once, not once each.
    pack: str | None = None
    #: Why it may not be placed yet although it could be: predecessors (``after:``) still to complete.
    held: str = ""
    #: Slurm ids its predecessors run as: placed now, it goes to Slurm with ``--dependency=afterok`` on them.
    after_ok: tuple[str, ...] = ()
    #: Pending in Slurm's queue on ``current``, never started (:attr:`PlanJob.queued`).
    queued: bool = False


def running_allocation(planned: Allocation, running: Sequence[tuple[str, int, str]]) -> Allocation:
    """Where a job really runs: ``planned`` with each one-type, one-node part moved to the node Slurm chose.

    ``running``: ``(gpu_type, gpu_count, nodes as Slurm reports them)`` of the job's running parts.
    Slurm picks the node of an unpinned part, so the plan's node name may be wrong; a part
    on one node whose type and count match exactly one planned slot takes that slot's place.
    Anything else (several nodes, no unique slot) stays as planned.
    """
    slots = list(planned.slots)
    for gpu_type, count, nodes in running:
        if not nodes or any(c in nodes for c in ",["):
            continue
        same = [i for i, (_, t, c) in enumerate(slots) if t == gpu_type and c == count]
        if len(same) == 1:
            slots[same[0]] = (nodes, gpu_type, count)
    if slots == list(planned.slots):
        return planned
    counts: dict[tuple[str, str], int] = {}
    for node, gpu_type, count in slots:
        counts[(node, gpu_type)] = counts.get((node, gpu_type), 0) + count
    return Allocation.of(counts)


def stored_allocation(job: Job) -> Allocation | None:
    """The job's planned allocation, where its running parts really run (see :func:`running_allocation`)."""
    slots = (job.plan or {}).get("slots")
    if not slots:
        return None
    running = [(p.gpu_type, p.gpu_count, p.nodes) for p in job.slurm_jobs
               if p.state == "RUNNING" and p.gpu_type and p.current]
    return running_allocation(Allocation(tuple((n, t, int(c)) for n, t, c in slots)), running)


#: Part roles whose Slurm job is the whole rest of a running job: an afterok on it means "after the job".
_FINAL_ROLES = frozenset({"batch", "sweep"})
#: What a dependant waiting in Slurm on its afterok shows while its predecessors run.
IN_SLURM_AFTER = "waits in Slurm for its predecessors to complete (afterok)"


def final_slurm_jobs(job: Job) -> tuple[str, ...]:
    """The Slurm ids whose completion is ``job``'s, while it runs as its final Slurm job (batch job or sweep
    task); () otherwise (pending: replan may still move it; forked rounds, packs, het jobs, adopted parts)."""
    live = live_parts(job)
    if job.state is not JobState.RUNNING or not live or any(p.role not in _FINAL_ROLES for p in live):
        return ()
    return tuple(sorted({p.target for p in live}))


def dependency_verdicts(session: Session, jobs: Sequence[Job]) -> Verdicts:
    """The verdicts for the live ``jobs`` with ``after:`` (slurmhet/dependencies.py), predecessors read
    from the store."""
    after = {j.id: [int(i) for i in j.spec.get("after") or ()] for j in jobs if not j.state.final
             and j.spec.get("after")}
    wanted = sorted({i for ids in after.values() for i in ids})
    preds = list(session.scalars(select(Job).where(Job.id.in_(wanted)))) if wanted else []
    return verdicts(after, {p.id: (p.name, p.state) for p in preds}, {p.id: final_slurm_jobs(p) for p in preds})


def with_verdicts(candidate: Candidate, found: Verdicts) -> Candidate:
    """The candidate held by its predecessors, or chained to them in Slurm; one that already waits
    there on its afterok keeps that hold."""
    if candidate.held:
        return candidate
    if candidate.job_id in found.chained:
        return replace(candidate, after_ok=found.chained[candidate.job_id])
    return replace(candidate, held=found.held.get(candidate.job_id, ""))


def cancel_doomed(session: Session, jobs: Sequence[Job], doomed: Mapping[int, str],
                  cancel: Callable[[list[str]], None]) -> list[str]:
    """Dependants whose predecessor failed: CANCELLED with the reason. One already in Slurm on its afterok
    is scancelled first (``cancel``), so a failing scancel leaves it for the next run."""
    actions = []
    for job in jobs:
        if job.id in doomed and not job.state.final:
            live = sorted({p.target for p in live_parts(job)})
            if live:
                cancel(live)
            for part in job.slurm_jobs:
                if part.target in live:
                    part.state = "CANCELLED"
            job.state, job.reason = JobState.CANCELLED, doomed[job.id]
            add_event(session, job, "cancelled", doomed[job.id], slurm_job_ids=live)
            actions.append(f"job {job.id} ({job.name}) {doomed[job.id]}"
                           + (f"; cancelled Slurm job(s) {','.join(live)}" if live else ""))
    return actions


def candidate_of(job: Job, samples_done: float = 0.0) -> Candidate:
    """The job as the planner sees it. One waiting in Slurm on its afterok holds no GPUs (Slurm keeps none
    for it) and is not planned until Slurm releases it."""
    spec = parse_job(job.spec, f"store:job {job.id}")
    live = live_parts(job)
    if job.state is JobState.SUBMITTED and live and all(p.state == "PENDING" and p.reason == "Dependency"
                                                       for p in live):
        return Candidate(job.id, spec, job.created_at.timestamp(), None, samples_done, job.owner,
                         held=IN_SLURM_AFTER)
    current = stored_allocation(job) if job.state in PLACED else None
    packs = [p.slurm_job_id for p in job.slurm_jobs if p.role == "pack"]
    return Candidate(job.id, spec, job.created_at.timestamp(), current, samples_done, job.owner,
                     packs[-1] if packs and current is not None else None,
                     queued=current is not None and pending_in_slurm(job))


def pending_in_slurm(job: Job, again: bool = False) -> bool:
    """Every current part of the job is a plain job (PLAIN_ROLES: not a pack, an array or a consolidation)
    pending in Slurm that never started, or (``again``) that started before Slurm requeued it."""
    parts = [p for p in job.slurm_jobs if p.current]
    return job.state is JobState.SUBMITTED and (job.started_at is None or again) and bool(parts) and all(
        p.state == "PENDING" and (p.started_at is None or again) and p.role in PLAIN_ROLES for p in parts)


def unplaceable(candidates: Sequence[Candidate], inventory: Inventory) -> dict[int, str]:
    """Unplaced jobs whose allowed types cannot hold ``gpus.min`` on the usable nodes now (drains, outages).

    They wait with this reason instead of failing the plan for everyone else.
    """
    have = inventory.usable().gpus_by_type()
    out = {}
    for c in candidates:
        if c.held and c.current is None:
            out[c.job_id] = c.held
            continue
        types = c.spec.gpus.types or tuple(have)
        capacity = sum(have.get(t, 0) for t in types)
        if c.current is None and capacity < c.spec.gpus.min:
            out[c.job_id] = (f"waits: its GPU types ({', '.join(types) or 'any'}) have {capacity} usable GPU(s) "
                             f"now and it needs {c.spec.gpus.min}")
    return out


def plan_for(candidates: Sequence[Candidate], inventory: Inventory, table: ThroughputTable, policy: str,
             now: float, progress: Progress | None = None, shared: SharedCluster | None = None,
             only: Mapping[int, tuple[str, ...]] | None = None, startup: StartupCosts | None = None,
             max_wait_s: float | None = None) -> Plan:
    """Run the chosen planner over every candidate; placed jobs stay pinned, unplaceable ones wait.

    ``startup`` is charged to every job not placed yet (None: no start-up cost); ``max_wait_s`` is the
    site's starvation limit (``Settings.max_wait_h``).

    On a shared cluster the planner gets its capacity facts, and the caller's jobs only the GPU
    types the caller may reach; ``only`` keeps some jobs to some types (the move rule's what-ifs).
    """
    if policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}", place="default_policy",
                         hint="set the config's default_policy to one of " + ", ".join(POLICIES))
    table = with_specs(table, [c.spec for c in candidates])
    usable = inventory.usable()
    nodes = {n.name for n in usable.nodes}
    waiting = unplaceable(candidates, inventory)
    # A job still running on a drained node holds no GPU the planner could hand out: leave it out.
    candidates = [c for c in candidates if c.job_id not in waiting and
                  (c.current is None or all(n in nodes for n, _, _ in c.current.slots))]
    # Members of a running MPS pack share one GPU: pin it once, through the first member.
    first_of_pack: dict[str, int] = {}
    for c in candidates:
        if c.pack is not None:
            first_of_pack.setdefault(c.pack, c.job_id)
    candidates = [c for c in candidates if c.pack is None or first_of_pack[c.pack] == c.job_id]
    reach = within_reach({c.job_id: c.owner for c in candidates}, shared, only)
    jobs = tuple(narrowed(plan_job_from_spec(str(c.job_id), c.spec, c.submitted_at, samples_done=c.samples_done,
                                             current=c.current, user=c.owner, queued=c.queued,
                                             startup_s=startup.for_spec(c.spec)[0] if startup else 0.0),
                             reach.get(c.job_id), usable)
                 for c in candidates)
    try:
        inp = PlanningInput(jobs, usable, table, now=now, world=shared.facts if shared else OpenWorld(),
                            max_wait_s=max_wait_s)
        return POLICIES[policy](QUEUE_PREPARE.get(policy, lambda given: given)(inp), progress=progress)
    except InputError as exc:
        # Planner errors name the planner's job id; users know their jobs by name and spec line.
        for c in candidates:
            if f"job {str(c.job_id)!r}" in exc.cause:
                raise InputError(exc.cause.replace(f"job {str(c.job_id)!r}", f"job {c.spec.name!r}"),
                                 place=c.spec.place("workload"), hint=exc.hint) from exc
        raise


def plan_record(job_plan: JobPlan, policy: str, startup: tuple[float, bool] = (0.0, False)) -> dict[str, Any]:
    """What the store keeps of a job's plan (the replanner diffs against it); ``startup``: the start-up
    seconds its run time includes and whether they are the prior."""
    alloc = job_plan.allocation
    return {
        "policy": policy, "slots": [list(s) for s in alloc.slots] if alloc else None,
        "shard_weights": list(job_plan.shard_weights), "order": job_plan.order, "start_s": job_plan.start_s,
        "finish_s": job_plan.finish_s, "jct_s": job_plan.jct_s, "colocation_group": job_plan.colocation_group,
        "wait_reason": job_plan.wait_reason, "waits_on": list(job_plan.waits_on), "priors": list(job_plan.priors),
        "startup_s": startup[0], "startup_prior": startup[1],
        "emulated": os.environ.get("SLURMHET_EMULATE_THROUGHPUT") == "1",
    }


@dataclass
class Dispatch:
    """One slurmhet job's (or one pack's) Slurm parts, about to be submitted."""

    job_ids: tuple[int, ...]
    specs: tuple[JobSpec, ...]
    parts: list[Part]
    #: HadarE: the job's forked copies this round (None: the plan's own allocation).
    fork: ForkedJob | None = None
    #: An entrypoint job's predecessors in Slurm (emitted parts carry theirs in their options).
    after_ok: tuple[str, ...] = ()


@dataclass
class Outcome:
    job_id: int
    name: str
    state: str
    slurm_job_ids: list[str] = field(default_factory=list)
    allocation: str = ""
    reason: str = ""
    rendered: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def describe(alloc: Allocation | None) -> str:
    if alloc is None:
        return "waiting"
    return " + ".join(f"{c}x{t}@{n}" for n, t, c in alloc.slots)


def queue_overdue(plan: Plan, candidates: Sequence[Candidate], ready: Mapping[int, JobSpec], inventory: Inventory,
                  max_wait_s: float | None) -> tuple[Plan, frozenset[int]]:
    """``plan`` with every ready job that is overdue and waits placed in Slurm's queue on its minimum GPUs of one
    type it waits on, one node (no ``--nodelist``: any node of that type will do); and those jobs' ids.

    Keeping free GPUs for an overdue job binds only slurmhet's own jobs; other users' pending jobs that Slurm
    starts would still take each GPU that frees up. In Slurm's queue its priority, which grows with age,
    puts it before younger jobs (unless fairshare or a partition's tier ranks them higher), and Slurm's backfill
    reserves GPUs for it, so a younger job starts before it only where it ends first. Of the types it waits
    on, the one with the most GPUs on one node is asked for; a job whose minimum no node of those types holds
    stays in the store, waiting as before.
    """
    if max_wait_s is None:
        return plan, frozenset()
    plans = {jp.job_id: jp for jp in plan.jobs}
    nodes = inventory.usable().nodes
    queued: dict[str, JobPlan] = {}
    for c in candidates:
        jp = plans.get(str(c.job_id))
        if c.job_id not in ready or c.current is not None or c.held or c.after_ok or jp is None \
                or jp.allocation is not None or not is_overdue(c.submitted_at, plan.now, max_wait_s):
            continue
        need = c.spec.gpus.min
        fits = [(n.gpus.get(t, 0), t, n.name) for t in jp.waits_on for n in nodes if n.gpus.get(t, 0) >= need]
        if not fits:
            continue
        _, gpu_type, node = min(fits, key=lambda f: (-f[0], f[1], f[2]))
        queued[jp.job_id] = replace(jp, allocation=Allocation.of({(node, gpu_type): need}),
                                    shard_weights=(1.0 / need,) * need,
                                    wait_reason=queued_reason(jp.wait_reason, need, gpu_type))
    if not queued:
        return plan, frozenset()
    return (replace(plan, jobs=tuple(queued.get(jp.job_id, jp) for jp in plan.jobs)),
            frozenset(int(i) for i in queued))


def queued_reason(reason: str | None, count: int, gpu_type: str) -> str:
    """A queued overdue job's wait reason: the plan's, and what it is queued in Slurm for."""
    return (f"{reason}; queued in Slurm for {count} x {gpu_type}, so that Slurm serves it before younger jobs "
            f"and reserves GPUs for it")


def after_ok_of(candidates: Sequence[Candidate | None]) -> dict[int, tuple[str, ...]]:
    """The Slurm ids each chained candidate goes to Slurm after (``--dependency=afterok``)."""
    return {c.job_id: c.after_ok for c in candidates if c is not None and c.after_ok}


def dispatches(plan: Plan, ready: dict[int, JobSpec], profile: SiteProfile, settings: Settings,
               inventory: Inventory, store_tag: str = "", *, table: ThroughputTable | None = None,
               steps_done: dict[int, int] | None = None, rounds: dict[int, int] | None = None,
               busy_nodes: frozenset[str] = frozenset(), partitions: Mapping[str, str] | None = None,
               after_ok: Mapping[int, tuple[str, ...]] | None = None,
               queued: frozenset[int] = frozenset()) -> list[Dispatch]:
    """Parts for every ready job the plan places now; co-location groups become one pack each.

    With ``table``, HadarE's Job Forker offers the GPUs the plan leaves idle to forkable jobs;
    a job it forks is emitted as copies (arrays + a consolidation) for round ``rounds[job]``.
    A job in ``after_ok`` (its predecessors run in Slurm) goes alone, unforked and unpacked, with
    ``--dependency=afterok`` on them: a pack or a round would wait for it, or it for their end.
    A ``queued`` job (:func:`queue_overdue`) goes alone too, as one plain job the move rule can judge.
    """
    after_ok = after_ok or {}
    emit = emit_settings(settings, store_tag, inventory, partitions)
    table = with_specs(table, ready.values()) if table is not None else None
    forkable = {i: spec for i, spec in ready.items() if i not in after_ok and i not in queued}
    forks = job_forker(plan, inventory, table, forkable, steps_done=steps_done, rounds=rounds,
                       round_s=fork_round_s(), busy_nodes=busy_nodes) if table is not None else {}
    out: list[Dispatch] = []
    singles: list[tuple[int, JobSpec, Part]] = []
    groups: dict[str, list[tuple[int, JobSpec, JobPlan]]] = {}
    for job_plan in sorted(plan.jobs, key=lambda jp: jp.order):
        job_id = int(job_plan.job_id)
        fork = forks.get(job_plan.job_id)
        if job_id not in ready or (job_plan.allocation is None and fork is None):
            continue
        spec = ready[job_id]
        if fork is not None:
            out.append(Dispatch((job_id,), (spec,), requests_for(
                job_id, spec, job_plan, profile, emit, copies=fork.copies, round=fork.round,
                round_steps=fork.round_steps), fork))
        elif job_plan.colocation_group and job_id not in after_ok:
            groups.setdefault(job_plan.colocation_group, []).append((job_id, spec, job_plan))
        elif job_id in queued and not spec.entrypoint:
            out.append(Dispatch((job_id,), (spec,), requests_for(job_id, spec, job_plan, profile, emit,
                                                                   inventory=inventory)))
        elif not spec.entrypoint:
            singles += [(job_id, spec, part) for part in requests_for(
                job_id, spec, job_plan, profile, emit, inventory=inventory, after_ok=after_ok.get(job_id, ()))]
        else:
            out.append(Dispatch((job_id,), (spec,), [], after_ok=after_ok.get(job_id, ())))  # through submitit
    for members in groups.values():
        if len(members) == 1 or any(spec.entrypoint for _, spec, _ in members):
            for job_id, spec, job_plan in members:
                out.append(Dispatch((job_id,), (spec,), requests_for(job_id, spec, job_plan, profile, emit,
                                                                       inventory=inventory)))
        else:
            out.append(Dispatch(tuple(m[0] for m in members), tuple(m[1] for m in members),
                                pack_parts(members, profile, emit, inventory)))
    return out + [Dispatch(ids, specs, parts) for ids, specs, parts in sweep_arrays(singles, emit,
                                                                                    profile.max_array_size)]


def render_parts(parts: Sequence[Part]) -> list[dict[str, Any]]:
    """Materialize parts for --dry-run; dependencies show as placeholders."""
    placeholders = [f"<part{i}>" for i in range(len(parts))]
    out = []
    for part in parts:
        m = part.resolved(placeholders).materialize()
        out.append({"role": part.role, "argv": m.sbatch_argv(), "script": m.script})
    return out


class Dispatcher:
    """Submits what a plan places and records every part; one instance per command."""

    def __init__(self, db: Database, client: SlurmClient, profile: SiteProfile, settings: Settings,
                 runner: SlurmRunner) -> None:
        self.db, self.client, self.profile, self.settings, self.runner = db, client, profile, settings, runner

    def record_plan(self, plan: Plan, job_ids: Sequence[int], waiting: dict[int, str] | None = None,
                    startup: StartupCosts | None = None, queued: Sequence[int] = ()) -> None:
        """Store each job's plan, and the reason for jobs the plan could not place at all.

        ``startup`` as given to :func:`plan_for`: the jobs recorded are not placed yet, so it charged them.
        ``queued``: jobs waiting in Slurm's queue (:attr:`Candidate.queued`); for each the plan still waits
        (overdue), only the forecast is stored (start, finish, order, reason), since Slurm holds the job on
        its stored slots, which stay.
        """
        wanted = {str(i) for i in job_ids}
        with self.db.transaction() as session:
            for job_id in queued:
                self._refresh_queued(session, job_id, plan)
            for job_id, reason in (waiting or {}).items():
                job = get_job(session, job_id)
                if job is not None and job.state in UNPLACED and job_id in job_ids:
                    job.reason = reason
            for job_plan in plan.jobs:
                if job_plan.job_id not in wanted:
                    continue
                job = get_job(session, int(job_plan.job_id))
                assert job is not None
                cost = startup.for_spec(parse_job(job.spec, f"store:job {job.id}")) if startup else (0.0, False)
                job.plan = plan_record(job_plan, plan.policy, cost)
                job.predicted_jct_s = job_plan.jct_s
                if job_plan.allocation is None and job.state in UNPLACED:
                    job.reason = job_plan.wait_reason or "waiting for GPUs"

    @staticmethod
    def _refresh_queued(session: Session, job_id: int, plan: Plan) -> None:
        """Store the plan's forecast for a job queued in Slurm, so ``status`` shows when it is now expected to
        start, not when it was queued; its slots stay, since they are what it waits on in Slurm."""
        job = get_job(session, job_id)
        jp = next((p for p in plan.jobs if p.job_id == str(job_id)), None)
        slots = (job.plan or {}).get("slots") if job is not None else None
        if job is None or jp is None or jp.allocation is not None or not slots or len(slots) != 1:
            return
        [(_, gpu_type, count)] = slots
        job.plan = {**(job.plan or {}), "order": jp.order, "start_s": jp.start_s, "finish_s": jp.finish_s,
                    "jct_s": jp.jct_s, "waits_on": list(jp.waits_on),
                    "wait_reason": queued_reason(jp.wait_reason, int(count), str(gpu_type))}
        job.predicted_jct_s = jp.jct_s

    def submit(self, dispatch: Dispatch, plan: Plan) -> list[Outcome]:
        """Submit one dispatch; record the parts on every member job, or the refusal."""
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        first = dispatch.job_ids[0]
        if not dispatch.parts:
            return [self._submit_entrypoint(first, dispatch.specs[0], plan.job(str(first)), dispatch.after_ok)]
        fork = dispatch.fork
        facts = fork_facts(fork) if fork is not None else None
        expected = expected_rows(dispatch.parts, dispatch.job_ids)
        with self.db.transaction() as session:  # committed before sbatch runs: see sync.DISPATCHING
            mark_dispatching(session, dispatch.job_ids, expected, facts)
            on_record = {p.slurm_job_id for i in dispatch.job_ids for j in [get_job(session, i)] if j is not None
                         for p in j.slurm_jobs}
        outcome = MultiPartSubmitter(self.client, on_record).submit(dispatch.parts)
        with self.db.transaction() as session:
            results = []
            for job_id, spec in zip(dispatch.job_ids, dispatch.specs):
                job = get_job(session, job_id)
                assert job is not None
                alloc = Allocation(fork.slots) if fork is not None else plan.job(str(job_id)).allocation
                results.append(self._record(session, job, spec, outcome, alloc))
                if facts is not None and outcome.ok:
                    record_fork(session, job, facts)
        return results

    def consolidate_again(self, job_id: int, inventory: Inventory) -> str:
        """Run a forked round's consolidation again, after a fault cut its first run off (``lost_consolidation``):
        the same averaging of the same copies in the same partitions, now with nothing to wait for. The lost run
        is retired (kept for logs and restarts); what happened, as a replan action."""
        with self.db.snapshot() as session:
            job = get_job(session, job_id)
            lost = lost_consolidation(job) if job is not None else None
            if job is None or lost is None:
                return f"job {job_id}: no lost consolidation to run again"
            spec, forked = parse_job(job.spec, f"store:job {job.id}"), (job.plan or {}).get("forked") or {}
            lost_id, round, cut, argv = lost.slurm_job_id, lost.round, cut_off(lost), list(lost.argv)
            on_record = {p.slurm_job_id for p in job.slurm_jobs}
        types = [str(copy[1]) for copy in forked.get("copies") or ()]
        if not types:
            return f"job {job_id}: round {round}'s copies are not on record; its consolidation cannot run again"
        request = consolidation_request(job_id, spec, types, len(types), self.profile,
                                        emit_settings(self.settings, self.db.instance, inventory), round, again=True)
        partition = next((a.split("=", 1)[1] for a in argv if a.startswith("--partition=")), None)
        if partition:  # where the first run was sent, as the round's copies' partitions were then
            request = replace(request, common=replace(request.common, partition=partition))
        outcome = MultiPartSubmitter(self.client, on_record).submit([Part(request)])
        with self.db.transaction() as session:
            job = get_job(session, job_id)
            assert job is not None
            rows = [row for part in outcome.live for row in part.store_rows(job.id)]
            job.slurm_jobs.extend(SlurmJob(**row) for row in rows)
            if not outcome.ok:  # the reason shows in `slurmhet status` while every replan tries again
                job.reason = f"round {round}'s consolidation could not be run again: {outcome.message}"
                add_event(session, job, "submit_failed", f"round {round}'s consolidation again: {outcome.message}",
                          round=round, maybe_submitted=outcome.maybe_submitted,  # see sync.adopt_lost_rerun
                          argv=request.materialize().sbatch_argv())
                return f"job {job_id}: round {round}'s consolidation not submitted again ({outcome.message})"
            ids = shown_ids(rows)
            note = f"{cut}; run again as Slurm job {','.join(ids)} on the copies' checkpoints"
            ran_again(session, job, lost_id, round, ids, note)
        return f"job {job_id} ({spec.name}): {note}"

    def _record(self, session: Any, job: Job, spec: JobSpec, outcome: MultiPartOutcome,
                alloc: Allocation | None) -> Outcome:
        rows = [row for part in outcome.live for row in part.store_rows(job.id)]
        for row in rows:
            job.slurm_jobs.append(SlurmJob(**row))
        ids = shown_ids(rows)
        job.attempts += 1
        if outcome.ok or not outcome.maybe_submitted:
            # Kept where sbatch may have taken a part without answering: the next replan looks for it as for a
            # cut-off dispatch (squeue, then sacct), so a part that ran and left the queue is not run again.
            clear_dispatching(session, job)
        if outcome.ok:
            job.state, job.reason = JobState.SUBMITTED, ""
            add_event(session, job, "submitted", "Slurm job(s) " + ",".join(ids), slurm_job_ids=ids,
                      allocation=describe(alloc))
            return Outcome(job.id, spec.name, "SUBMITTED", ids, describe(alloc))
        job.state, job.reason = JobState.SUBMIT_FAILED, outcome.message
        add_event(session, job, "submit_failed", outcome.message, cancelled=list(outcome.cancelled),
                  cancel_failed=list(outcome.cancel_failed), maybe_submitted=outcome.maybe_submitted)
        return Outcome(job.id, spec.name, "SUBMIT_FAILED", ids, describe(alloc), outcome.message)

    def _submit_entrypoint(self, job_id: int, spec: JobSpec, job_plan: JobPlan,
                           after_ok: tuple[str, ...] = ()) -> Outcome:
        """Python entrypoints go through submitit, so users keep its Job handles and results.

        submitit holds one resource shape per job, so the job runs on the plan's
        largest single-type share of its allocation; on one node, Slurm picks which.
        """
        from slurmhet.emit.entrypoint import call_entrypoint
        from slurmhet.emit.submitit_executor import RunnerSlurmExecutor

        assert job_plan.allocation is not None
        by_type = job_plan.allocation.by_type()
        gpu_type = max(by_type, key=lambda t: (by_type[t], t))
        slots = [(n, c) for n, t, c in job_plan.allocation.slots if t == gpu_type]
        per_node = min(c for _, c in slots)
        executor = RunnerSlurmExecutor(self.settings.state_dir / "submitit" / str(job_id), runner=self.runner)
        gpu_key, gpu_value = (("gres", f"gpu:{gpu_type}:{per_node}") if self.profile.gpu_request_style == "gres"
                              else ("gpus_per_node", f"{gpu_type}:{per_node}"))
        extra = {k.replace("-", "_"): (v if v is not None else True) for k, v in spec.sbatch}
        nodelist = ",".join(n for n, _ in slots) if len(slots) > 1 else ""
        executor.update_parameters(
            job_name=spec.name[:64], comment=f"slurmhet:{job_id}@{self.db.instance}", time=spec.time_limit_min or 60,
            nodes=len(slots), ntasks_per_node=1, **{gpu_key: gpu_value},
            additional_parameters={**({"nodelist": nodelist} if nodelist else {}),
                                   **({"dependency": "afterok:" + ":".join(after_ok)} if after_ok else {}), **extra},
        )
        with self.db.transaction() as session:  # committed before sbatch runs: see sync.DISPATCHING
            mark_dispatching(session, [job_id])
        try:  # sbatch runs outside the write transaction; a crash in between leaves an orphan that sync adopts
            handle = executor.submit(call_entrypoint, spec.entrypoint, list(spec.args), os.getcwd())
        except SlurmCommandError as exc:
            with self.db.transaction() as session:
                job = get_job(session, job_id)
                assert job is not None
                job.attempts += 1
                if exc.returncode is not None:  # a timeout may hide a job sbatch took: see _record
                    clear_dispatching(session, job)
                job.state, job.reason = JobState.SUBMIT_FAILED, exc.message
                add_event(session, job, "submit_failed", exc.message, argv=exc.argv)
            return Outcome(job_id, spec.name, "SUBMIT_FAILED", [], describe(job_plan.allocation), exc.message)
        slurm_id = str(handle.job_id)
        with self.db.transaction() as session:
            job = get_job(session, job_id)
            assert job is not None
            job.attempts += 1
            clear_dispatching(session, job)
            job.state, job.reason = JobState.SUBMITTED, ""
            job.slurm_jobs.append(SlurmJob(slurm_job_id=slurm_id, role="batch", gpu_type=gpu_type,
                                           gpu_count=per_node * len(slots), nodes=nodelist,
                                           state="PENDING", argv=["submitit", str(spec.entrypoint)]))
            add_event(session, job, "submitted", f"Slurm job {slurm_id} (submitit)", slurm_job_ids=[slurm_id])
        return Outcome(job_id, spec.name, "SUBMITTED", [slurm_id], describe(job_plan.allocation))


def submit_new(db: Database | None, dispatcher_args: tuple[SlurmClient, SiteProfile, Settings, SlurmRunner],
               specs: Sequence[tuple[JobSpec, str]], inventory: Inventory, dry_run: bool,
               progress: Progress | None = None) -> list[Outcome]:
    """`slurmhet submit`: store the new jobs, plan them with every unplaced job, submit what starts now.

    The shared cluster is read first: a spec the user cannot run here is refused before anything is stored.
    """
    client, profile, settings, runner = dispatcher_args
    for spec, _ in specs:
        check_against_cluster(spec, inventory)
        if spec.container:
            container_runtime_for(spec, profile)
    table = live_table(settings, db) if db is not None else site_table(settings)
    now = datetime.now(timezone.utc).timestamp()
    owner = current_user()
    shared = read_shared(client, client.queue(), db.instance if db is not None else "", owner, now,
                         [spec for spec, _ in specs])
    for spec, _ in specs:
        check_access(spec, shared)
    if dry_run:
        existing: list[Candidate] = []
        startup = StartupCosts()
        if db is not None:
            with db.transaction() as session:
                existing = [candidate_of(j) for j in list_jobs(session, states=UNPLACED + PLACED)]
                startup = learned_startup(session)
        return dry_run_outcomes(specs, existing, inventory, table, profile, settings, now, owner, progress, shared,
                                startup)
    assert db is not None
    with db.transaction() as session:
        created = [create_job(session, spec, owner, source) for spec, source in specs]
        new_ids = [job.id for job in created]

        def stored(job_id: int) -> tuple[str, str] | None:
            job = session.get(Job, job_id)
            return (job.owner, job.name) if job is not None else None

        predecessors = resolve([(job.id, spec) for job, (spec, _) in zip(created, specs)], stored, owner)
        for job in created:
            if job.id in predecessors:  # the store keeps ids: names mean nothing outside their file
                job.spec = {**job.spec, "after": list(predecessors[job.id])}
    with dispatch_lock(db, settings.state_dir, owner, wait=True):
        # Re-read under the lock (a concurrent submit or replan may have placed jobs meanwhile),
        # and refresh from Slurm so finished jobs no longer hold GPUs in the plan. Slurm is asked
        # before the write transaction, so other commands are not kept waiting for the store.
        answers = ask_slurm(db, client, UNPLACED + PLACED, owner)
        view, queue = answers.view, answers.queue
        shared = shared.with_queue(queue, db.instance, now)
        with db.transaction() as session:
            jobs = list_jobs(session, states=UNPLACED + PLACED)
            sync_jobs(session, jobs, view, settings.progress_dir)
            adopt_orphans(session, [j for j in jobs if j.owner == owner], queue, db.instance, owner)
            adopt_ended(session, [j for j in jobs if j.owner == owner], answers.ended, db.instance, owner,
                        settings.progress_dir, answers.behind)
            found = dependency_verdicts(session, jobs)
            cancel_doomed(session, [j for j in jobs if j.owner == owner], found.doomed, client.cancel)
            # A concurrent submit or replan may already have placed some of our new jobs: they are now
            # pinned like any placed job, and reported as they stand instead of being submitted again.
            mine = [get_job(session, i) for i in new_ids]  # finished ones too: `jobs` holds live jobs only
            placed = {j.id: j for j in mine if j is not None and j.state not in UNPLACED}
            existing = [with_verdicts(candidate_of(j), found) for j in jobs
                        if not j.state.final and (j.id not in set(new_ids) or j.id in placed)]
            gone = {j.id for j in jobs if j.id in set(new_ids) and j.state.final}
            rounds = {j.id: next_round(j) for j in jobs if not j.state.final and next_round(j)}
            startup = learned_startup(session)
            already = {i: Outcome(i, j.name, j.state.value, sorted({p.target for p in j.slurm_jobs}),
                                  describe(stored_allocation(j))) for i, j in placed.items()}
        already.update({i: Outcome(i, spec.name, JobState.CANCELLED.value, [], "", found.doomed.get(i, ""))
                        for i, (spec, _) in zip(new_ids, specs) if i in gone})
        pending = [(i, spec) for i, spec in zip(new_ids, specs) if i not in already]
        outcomes = _plan_and_dispatch(db, (client, profile, settings, runner), existing, [i for i, _ in pending],
                                      [spec for _, spec in pending], owner, inventory, table, now, progress, rounds,
                                      shared=shared, queue=queue, startup=startup, found=found)
        by_id = {o.job_id: o for o in outcomes} | already
        return [by_id[i] for i in new_ids]


def dry_run_outcomes(specs: Sequence[tuple[JobSpec, str]], existing: Sequence[Candidate], inventory: Inventory,
                     table: ThroughputTable, profile: SiteProfile, settings: Settings, now: float, owner: str,
                     progress: Progress | None = None, shared: SharedCluster | None = None,
                     startup: StartupCosts | None = None) -> list[Outcome]:
    """`submit --dry-run`: plan ``specs`` beside ``existing`` and render what would be submitted; stores and
    submits nothing (also without Slurm: ``shared`` None plans for ``inventory`` alone)."""
    fresh = [Candidate(-(i + 1), spec, now, owner=owner, held=preview_hold(spec)) for i, (spec, _) in enumerate(specs)]
    plan = plan_for([*existing, *fresh], inventory, table, settings.default_policy, now, progress, shared,
                    startup=startup, max_wait_s=settings.max_wait_s)
    ready = {c.job_id: c.spec for c in fresh}
    rendered = {i: render_parts(d.parts)
                for d in dispatches(plan, ready, profile, settings, inventory, table=table,
                                    partitions=shared.partitions() if shared else None)
                for i in d.job_ids}
    waiting = unplaceable(fresh, inventory)  # held by after:, or too big for the usable nodes now: not planned
    return [Outcome(c.job_id, c.spec.name, "DRY_RUN", [], "waiting", waiting[c.job_id]) if c.job_id in waiting
            else Outcome(c.job_id, c.spec.name, "DRY_RUN", [], describe(plan.job(str(c.job_id)).allocation),
                         plan.job(str(c.job_id)).wait_reason or "", rendered.get(c.job_id, [])) for c in fresh]


def _plan_and_dispatch(db: Database, dispatcher_args: tuple[SlurmClient, SiteProfile, Settings, SlurmRunner],
                       existing: list[Candidate], new_ids: list[int], specs: Sequence[tuple[JobSpec, str]],
                       owner: str, inventory: Inventory, table: ThroughputTable, now: float,
                       progress: Progress | None, rounds: dict[int, int] | None = None,
                       *, shared: SharedCluster, queue: Sequence[QueueRecord],
                       startup: StartupCosts | None = None, found: Verdicts | None = None) -> list[Outcome]:
    client, profile, settings, runner = dispatcher_args
    fresh = [with_verdicts(Candidate(i, spec, now, owner=owner), found or Verdicts({}, {}, {}))
             for i, (spec, _) in zip(new_ids, specs)]
    plan = plan_for(existing + fresh, inventory, table, settings.default_policy, now, progress, shared,
                    startup=startup, max_wait_s=settings.max_wait_s)
    # Everyone's jobs shape the plan; only the caller's own are submitted (sbatch runs as the caller).
    unplaced = [c for c in existing if c.current is None and c.owner == owner] + fresh
    ready = {c.job_id: c.spec for c in unplaced}
    plan, queued = queue_overdue(plan, unplaced, ready, inventory, settings.max_wait_s)
    dispatcher = Dispatcher(db, client, profile, settings, runner)
    dispatcher.record_plan(plan, [c.job_id for c in unplaced], unplaceable(unplaced, inventory), startup,
                           queued=[c.job_id for c in existing if c.queued and c.owner == owner])
    results: dict[int, Outcome] = {}
    steps_done = {c.job_id: int(c.samples_done // c.spec.global_batch) for c in unplaced}
    if rounds:  # a forked job between rounds: its steps so far come from the progress files
        done = job_steps(read_progress(settings.progress_dir))
        steps_done.update({i: done.get(str(i), 0) for i in rounds})
    for dispatch in dispatches(plan, ready, profile, settings, inventory,
                               db.instance, table=table, steps_done=steps_done, rounds=rounds,
                               busy_nodes=foreign_gpu_nodes(queue, db.instance),
                               partitions=shared.partitions(), after_ok=after_ok_of(unplaced), queued=queued):
        for outcome in dispatcher.submit(dispatch, plan):
            results[outcome.job_id] = outcome
    waiting = unplaceable(fresh, inventory)
    for c in fresh:
        if c.job_id not in results:
            reason = waiting.get(c.job_id) or plan.job(str(c.job_id)).wait_reason or ""
            results[c.job_id] = Outcome(c.job_id, c.spec.name, "PENDING", [], "waiting", reason)
    return [results[c.job_id] for c in fresh]
