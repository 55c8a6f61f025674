"""Commands about one's jobs: status (all, or one in full), logs, result, explain, cancel."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from slurmhet import spec as specmod
from slurmhet.cli.app import Context, _emit_json, console, err_console, main
from slurmhet.cluster import OpenWorld
from slurmhet.config import Settings
from slurmhet.errors import InputError, SystemFailure
from slurmhet.slurm.parsers import SlurmOutputError
from slurmhet.slurm.runner import SlurmCommandError
from slurmhet.slurm.world import Access, SlurmWorld, read_world
from slurmhet.store import Database, JobState, add_event, get_job, list_jobs
from slurmhet.store.models import RETIRED_ROLES

if TYPE_CHECKING:
    from slurmhet.throughput import ThroughputTable


#: A job held by ``after:`` waits for jobs, not GPUs: no Slurm reason, start or GPU story to tell.
_NOT_WAITING_FOR_GPUS = {"slurm_reason": "", "slurm_expected_start": None, "planned_start": None, "why": ""}


def _pending_reason(job: Any, held: dict[int, str]) -> str:
    """A stored job's reason, with ``after:`` holds as they stand now rather than at the last plan."""
    if job.id in held:
        return held[job.id]
    if job.reason.endswith("(after:)"):
        return "its predecessors completed: the next `slurmhet replan` plans it"
    return job.reason


def _visible_jobs(obj: Context, session: Any, all_users: bool) -> list[Any]:
    from slurmhet.submission import current_user

    owner = None if (all_users and obj.is_admin()) else current_user()
    if all_users and not obj.is_admin():
        raise InputError("--all needs root or the admin group", place="--all", hint="drop --all to see your jobs")
    return list_jobs(session, owner=owner)


@main.command()
@click.argument("job_id", type=int, required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("--all", "all_users", is_flag=True, help="every user's jobs (root or admin group)")
@click.pass_obj
def status(obj: Context, job_id: int | None, as_json: bool, all_users: bool) -> None:
    """Your jobs and their Slurm parts, refreshed from Slurm, with why each waiting job waits;
    with an ID, that job in full (spec, plan, speeds, Slurm parts, times, log files, events)."""
    from slurmhet.jobview import slurm_dependency
    from slurmhet.submission import current_user, dependency_verdicts
    from slurmhet.sync import fetch_view, restarts, sync_jobs

    if job_id is not None:
        _status_one(obj, job_id, as_json)
        return
    user = current_user()
    with obj.db.snapshot() as session:  # Slurm is asked outside the write transaction
        try:
            view = fetch_view(obj.client, _visible_jobs(obj, session, all_users))
            world = read_world(obj.client, user)
        except (SlurmCommandError, SlurmOutputError) as exc:
            raise SystemFailure(f"cannot reach Slurm to refresh job states ({exc}); "
                                "the store was left as it was") from exc
    context = _WaitContext.of(obj, world, user)
    files = _log_files(obj)
    with obj.db.transaction() as session:
        jobs = _visible_jobs(obj, session, all_users)
        sync_jobs(session, jobs, view, obj.settings.progress_dir)
        held = dependency_verdicts(session, jobs).held  # predecessors as they stand now, not at the last plan
        logs = {j.id: _log_parts(obj, j, files) for j in jobs}
        rows = [{
            "id": j.id, "name": j.name, "owner": j.owner, "group": j.spec.get("group"), "state": j.state.value,
            "restarts": restarts(j),
            "reason": _pending_reason(j, held) if j.state is JobState.PENDING else j.reason,
            "slurm": [{"id": p.slurm_job_id, "role": p.role, "round": p.round, "het_offset": p.het_offset,
                       "array_task": p.array_task,
                       "gpu_type": p.gpu_type, "gpus": p.gpu_count, "state": p.state, "nodes": p.nodes,
                       "reason": p.reason, "after": slurm_dependency(p.argv)} for p in j.slurm_jobs],
            "throughput_priors": list((j.plan or {}).get("priors") or ()),
            "logs": [str(part.path) for part in logs[j.id]],
            "stderr_logs": [str(part.stderr) for part in logs[j.id] if part.stderr],
            **(_waiting_view(j, context) if j.id not in held else _NOT_WAITING_FOR_GPUS),
        } for j in jobs]
    if as_json:
        _emit_json({"jobs": rows})
        return
    table = Table(title="slurmhet status")
    for column in ("id", "name", "owner", "state", "slurm", "gpus", "nodes", "reason", "log"):
        table.add_column(column)
    for row in rows:
        parts = [p for p in row["slurm"] if p["role"] not in RETIRED_ROLES]
        why = "; ".join(x for x in (row["reason"], row["slurm_reason"] and f"Slurm: {row['slurm_reason']}",
                                    row["throughput_priors"] and not JobState(row["state"]).final
                                    and "planned on a prior speed for " + ", ".join(row["throughput_priors"]),
                                    row["slurm_expected_start"] and f"Slurm expects start {row['slurm_expected_start']}",
                                    row["planned_start"] and f"plan: start {row['planned_start']}", row["why"]) if x)
        table.add_row(str(row["id"]), row["name"], row["owner"],
                      row["state"] + (f" ({row['restarts']} restarts)" if row["restarts"] else ""),
                      " ".join(dict.fromkeys(f"{p['id']}_{p['array_task']}" if p["role"] == "sweep" else p["id"]
                                             for p in parts)),
                      " ".join(f"{p['gpus']}x{p['gpu_type']}" for p in parts),
                      " ".join(p["nodes"] for p in parts), why, row["logs"][-1] if row["logs"] else "")
    console.print(table)


def _status_one(obj: Context, job_id: int, as_json: bool) -> None:
    from sqlalchemy import select

    from slurmhet.jobview import detail_lines, job_detail
    from slurmhet.site_table import with_specs
    from slurmhet.store.models import Event
    from slurmhet.submission import current_user

    job = _refresh(obj, job_id)
    with obj.db.snapshot() as session:
        events = list(session.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id)))
        session.expunge_all()
    spec = specmod.parse_job(job.spec, f"store:job {job.id}")
    waiting: dict[str, Any] = {}
    context: _WaitContext | None = None
    try:
        world = read_world(obj.client, current_user())
        context = _WaitContext.of(obj, world, current_user())
        inventory_types = world.inventory.gpu_types
        waiting = _waiting_view(job, context)
    except (SlurmCommandError, SlurmOutputError):
        inventory_types = ()
    table = with_specs(context.table if context is not None else obj.planning_table(live=True), [spec])
    speeds = {}
    for gpu_type in spec.gpus.types or inventory_types:
        try:
            speeds[gpu_type] = table.get(spec.workload.key, gpu_type)
        except InputError:
            continue
    detail = job_detail(job, spec, events, _log_parts(obj, job), speeds, waiting)
    if as_json:
        _emit_json(detail)
    else:
        for line in detail_lines(detail):
            click.echo(line)


@dataclass
class _WaitContext:
    """What every waiting job's explanation shares, derived once per ``status``."""

    world: SlurmWorld
    access: Access
    facts: OpenWorld
    settings: Settings
    #: GPUs per type held by this store's running jobs.
    ours: dict[str, int]
    now: float
    db: Database

    @classmethod
    def of(cls, obj: Context, world: SlurmWorld, user: str) -> "_WaitContext":
        from slurmhet.shared_cluster import user_groups
        from slurmhet.slurm.world import access_of, by_type, gpus_held, open_world

        now = datetime.now(timezone.utc).timestamp()
        access = access_of(world, user, user_groups(user))
        return cls(world, access, open_world(world, obj.db.instance, access, now), obj.settings,
                   by_type(gpus_held(world, obj.db.instance)["slurmhet"]), now, obj.db)

    @cached_property
    def table(self) -> ThroughputTable:
        """Read only when some job waits (a status of running jobs needs no table)."""
        from slurmhet.site_table import live_table

        return live_table(self.settings, self.db)


def _waiting_view(job: Any, context: _WaitContext) -> dict[str, Any]:
    """Slurm's pending reason and expected start, the plan's start, and why a waiting job waits."""
    from slurmhet.explain import why_waiting
    from slurmhet.site_table import with_specs
    from slurmhet.submission import stored_allocation

    world = context.world
    out: dict[str, Any] = {"slurm_reason": "", "slurm_expected_start": None, "planned_start": None, "why": ""}
    parts = [p for p in job.slurm_jobs if p.current and p.state == "PENDING"]
    out["slurm_reason"] = ",".join(sorted({p.reason for p in parts if p.reason}))
    starts = [world.starts[p.slurm_job_id].expected_start for p in parts if p.slurm_job_id in world.starts]
    known = [s for s in starts if s is not None]
    out["slurm_expected_start"] = min(known).astimezone().isoformat(timespec="seconds") if known else None
    if job.state.final or job.state.value == "RUNNING" or (job.state.value == "SUBMITTED" and not parts):
        return out
    planned = (job.plan or {}).get("start_s")
    if planned is not None:
        out["planned_start"] = datetime.fromtimestamp(max(planned, job.created_at.timestamp()), timezone.utc
                                                      ).astimezone().isoformat(timespec="seconds")
    spec = specmod.parse_job(job.spec, f"store:job {job.id}")
    inventory = world.inventory
    access = context.access
    allowed = [t for t in (spec.gpus.types or inventory.gpu_types) if t in access.types or not access.types]
    alloc = stored_allocation(job) if parts else None
    # Pending in Slurm: the types it was submitted to; waiting in slurmhet: the types its plan waits for.
    planned_types = sorted((job.plan or {}).get("waits_on") or ())
    waits_on = sorted(alloc.by_type()) if alloc else planned_types or allowed
    rates = {}
    table = with_specs(context.table, [spec])
    for gpu_type in allowed:
        try:
            rates[gpu_type] = table.rate(spec.workload.key, gpu_type)
        except InputError:
            continue
    out["why"] = why_waiting(spec.gpus.min, waits_on, allowed, rates, inventory, context.facts, context.ours,
                             context.now)
    return out


def _own_job(obj: Context, session: Any, job_id: int) -> Any:
    """A stored job the caller may see (their own; any as root or admin), else exit 2."""
    from slurmhet.submission import current_user

    job = get_job(session, job_id)
    if job is None or (job.owner != current_user() and not obj.is_admin()):
        raise InputError(f"no job {job_id} of yours in the store", place="ID",
                         hint="`slurmhet status` lists your jobs and their ids")
    return job


def _log_files(obj: Context) -> list[Path]:
    """Emitted scripts' logs, and submitit's (entrypoint jobs) in their per-job folders."""
    log_dir, submitit_dir = obj.settings.log_dir, obj.settings.state_dir / "submitit"
    return ((list(log_dir.glob("*.out")) + list(log_dir.glob("*.err")) if log_dir.is_dir() else [])
            + (list(submitit_dir.glob("*/*_log.out")) + list(submitit_dir.glob("*/*_log.err"))
               if submitit_dir.is_dir() else []))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_parts(obj: Context, job: Any, files: list[Path] | None = None) -> list[Any]:
    from slurmhet.joblogs import PartInfo, log_parts

    infos = [PartInfo(p.slurm_job_id, p.role, p.submitted_at, p.state, p.gpu_type, p.gpu_count, p.nodes,
                      p.array_task, p.het_offset, p.round) for p in job.slurm_jobs]
    return log_parts(infos, _log_files(obj) if files is None else files, job.id)


def _refresh(obj: Context, job_id: int) -> Any:
    """The job re-read after syncing its parts with Slurm (a Slurm that does not answer leaves it as stored)."""
    from slurmhet.sync import fetch_view, sync_jobs

    with obj.db.snapshot() as session:
        job = _own_job(obj, session, job_id)
        try:
            view = fetch_view(obj.client, [job])
        except (SlurmCommandError, SlurmOutputError):
            view = None
    with obj.db.transaction() as session:
        job = _own_job(obj, session, job_id)
        if view is not None:
            sync_jobs(session, [job], view, obj.settings.progress_dir)
        session.expunge_all()
        return job


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def explain(obj: Context, job_id: int, as_json: bool) -> None:
    """Why the plan put job ID where it is (each allowed type and size: when it would start, how long it would
    run, when it would finish, and the reason for the choice), or why it waits."""
    import math

    from slurmhet.explain import Option, options, reason
    from slurmhet.planner.model import job_rates, plan_job_from_spec
    from slurmhet.runtime.progress import job_steps, read_progress
    from slurmhet.site_table import with_specs
    from slurmhet.startup import learned_startup
    from slurmhet.submission import current_user, stored_allocation

    job = _refresh(obj, job_id)
    spec = specmod.parse_job(job.spec, f"store:job {job.id}")
    user = current_user()
    world = read_world(obj.client, user)
    context = _WaitContext.of(obj, world, user)
    inventory = world.inventory
    # A finished job is explained as its whole work would be planned now; a running one from the step it reached,
    # one waiting for a run from its last checkpoint, as replan plans them.
    done = 0
    if not job.state.final:
        steps = job_steps(read_progress(obj.settings.progress_dir, str(job_id)),
                          saved=job.state is not JobState.RUNNING)
        done = steps.get(str(job_id), 0) * spec.global_batch
    with obj.db.snapshot() as session:  # the start-up it pays before its first step, as the plan charges it
        startup = learned_startup(session).for_spec(spec)[0] if job.started_at is None or job.state.final else 0.0
    plan_job = plan_job_from_spec(str(job.id), spec, job.created_at.timestamp(),
                                  samples_done=min(float(done), spec.total_samples - 1.0), startup_s=startup)
    types = tuple(t for t in inventory.usable().gpu_types if not context.access.types or t in context.access.types)
    rates, priors = job_rates(plan_job, with_specs(context.table, [spec]), types)
    ours = dict(context.ours)
    current = stored_allocation(job) if job.state in (JobState.RUNNING, JobState.SUBMITTED) else None
    for gpu_type, count in (current.by_type() if current else {}).items():  # its own GPUs do not delay it
        ours[gpu_type] = max(0, ours.get(gpu_type, 0) - count)
    opts = options(plan_job, rates, priors, inventory, context.facts, ours, context.now)
    plan = job.plan or {}
    chosen, label = None, ""
    if plan.get("slots"):
        by_type: dict[str, int] = {}
        for _, gpu_type, count in plan["slots"]:
            by_type[gpu_type] = by_type.get(gpu_type, 0) + count
        label = " + ".join(f"{t} x{c}" for t, c in sorted(by_type.items()))
        start = context.now if job.state.final else max(float(plan.get("start_s") or context.now), context.now)
        run = float(plan.get("finish_s") or 0.0) - float(plan.get("start_s") or 0.0)
        chosen = Option(next(iter(by_type)) if len(by_type) == 1 else label, sum(by_type.values()), run, start,
                        any(t in priors for t in by_type))
    why = reason(chosen, opts, label) if chosen else ("waits: " + (plan.get("wait_reason") or "not planned yet"))
    waiting = _waiting_view(job, context).get("why", "")
    if as_json:
        _emit_json({"job": job.id, "name": job.name, "state": job.state.value,
                    "chosen": {"label": label, **chosen.to_json()} if chosen else None,
                    "options": [o.to_json() for o in opts], "reason": why, "waiting": waiting})
        return

    def clock(at: float) -> str:
        return "unknown" if math.isinf(at) else ("now" if at <= context.now + 1 else
                                                 datetime.fromtimestamp(at).strftime("%H:%M"))

    if job.state.final:
        click.echo(f"job {job.id} {job.name!r} ({job.state.value}): ran on {label or 'nothing'}; its options, "
                   "were it submitted now:")
    else:
        click.echo(f"job {job.id} {job.name!r} ({job.state.value})"
                   + (f": planned on {label}, start {clock(chosen.start_s)}, finish ~{clock(chosen.finish_s)}"
                      if chosen else ""))
    click.echo(f"why: {why}")
    if waiting:
        click.echo(f"waiting: {waiting}")
    table = Table(title="options (predicted from now)")
    for column in ("type", "gpus", "starts", "runs (s)", "finishes", "speed"):
        table.add_column(column)
    for o in opts:
        table.add_row(o.gpu_type, str(o.gpus), clock(o.start_s), f"{o.run_s:.0f}", clock(o.finish_s),
                      "PRIOR" if o.prior else "measured")
    console.print(table)


@main.command()
@click.argument("job_id", type=int)
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="whose return value")
@click.option("--json", "as_json", is_flag=True, help="the value as JSON (repr where JSON has no form)")
@click.pass_obj
def result(obj: Context, job_id: int, rank: int, as_json: bool) -> None:
    """An entrypoint job's return value (rank 0 by default), or its exception with the traceback (exit 1)."""
    from slurmhet.results import read_result, result_path

    job = _refresh(obj, job_id)
    if not job.spec.get("entrypoint"):
        raise InputError(f"job {job_id} runs a command, not a Python entrypoint: it returns no value", place="ID",
                         hint=f"its output is in `slurmhet logs {job_id}`")
    runs = sorted((p for p in job.slurm_jobs if p.current), key=lambda p: (p.submitted_at, p.id))
    outcome = read_result(result_path(obj.settings.state_dir, job_id, runs[-1].slurm_job_id, rank)) if runs else None
    if outcome is None:
        err_console.print(f"slurmhet: failure: job {job_id} is {job.state.value} and left no result"
                          + (f" for rank {rank}" if rank else "") + f" (see `slurmhet logs {job_id}`)", markup=False)
        sys.exit(1)
    if not outcome.ok:
        err_console.print(outcome.traceback, markup=False, highlight=False)
        err_console.print(f"slurmhet: failure: job {job_id} raised (traceback above)", markup=False)
        sys.exit(1)
    click.echo(json.dumps(outcome.value, default=repr) if as_json else repr(outcome.value))


@main.command()
@click.argument("job_id", type=int)
@click.option("--follow", "-f", is_flag=True, help="keep printing as the job writes, until it ends (like tail -f)")
@click.option("--part", "part_no", type=click.IntRange(min=1), default=None,
              help="only part K, as numbered in the headers")
@click.option("--stderr", "stderr", is_flag=True, help="the parts' stderr instead of their stdout")
@click.pass_obj
def logs(obj: Context, job_id: int, follow: bool, part_no: int | None, stderr: bool) -> None:
    """The output of job ID across all its Slurm parts (components, array copies, consolidations,
    resubmissions) in order, each headed by its Slurm id, GPUs and nodes; stdout, or with --stderr stderr
    (a part that wrote to stderr says so after its stdout)."""
    import time

    from slurmhet.joblogs import Tail, numbered

    def shown(listed: list[tuple[int, Any]]) -> list[tuple[int, Any, Path]]:
        # --stderr: a part from before the streams were split has it in its stdout, so no path of its own
        return [(number, part, path) for number, part in listed
                if (part_no is None or number == part_no) and (path := part.stderr if stderr else part.path)]

    def sync() -> tuple[Any, list[tuple[int, Any]], float]:
        # Files are listed before the sync: Slurm starts a part before its file exists, so a listed part's
        # header names its started state and nodes, not a PENDING read just before the file appeared. A job
        # that has ended starts no part, so its files are listed again: none that began meanwhile is missed.
        files = _log_files(obj)
        job = _refresh(obj, job_id)
        return job, numbered(_log_parts(obj, job, _log_files(obj) if job.state.final else files)), time.monotonic()

    tail = Tail()
    job, listed, last_sync = sync()
    while True:
        if part_no is not None and not follow and part_no > len(listed):
            raise InputError(f"job {job_id} has {len(listed)} part(s) with output", place="--part",
                             hint="leave --part out to see them all")
        for number, part, path in shown(listed):
            first = not tail.seen(path)
            data = tail.read_new(path)
            if first:
                click.echo(f"==> part {number}: {part.header}" + (" stderr" if stderr else "") + " <==")
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
            if not follow and not stderr and part.stderr is not None and _size(part.stderr):
                click.echo(f"(part {number} also wrote to stderr: slurmhet logs {job_id} --stderr --part {number})",
                           err=True)
        if not follow or job.state.final:
            if follow or not listed:
                click.echo(f"==> job {job_id} {job.state.value}" + (f": {job.reason}" if job.reason else "") + " <==")
            return
        time.sleep(1.0)
        listed = numbered(_log_parts(obj, job, _log_files(obj)))
        if any(not tail.seen(path) for _, _, path in shown(listed)) or time.monotonic() - last_sync >= 5.0:
            job, listed, last_sync = sync()


@main.command()
@click.argument("job_ids", nargs=-1, type=int)
@click.option("--group", default=None, help="every live job of this group (a sweep's variants share its name)")
@click.pass_obj
def cancel(obj: Context, job_ids: tuple[int, ...], group: str | None) -> None:
    """Cancel slurmhet jobs by ID or --group (yours, or anyone's as root/admin)."""
    from slurmhet.submission import current_user

    if not job_ids and group is None:
        raise InputError("nothing to cancel", place="ID", hint="give job ids or --group NAME")
    with obj.db.transaction() as session:
        if group is not None:
            owner = None if obj.is_admin() else current_user()
            members = [j.id for j in list_jobs(session, owner=owner)
                       if j.spec.get("group") == group and not j.state.final]
            if not members:
                raise InputError(f"no live jobs in group {group!r}", place="--group",
                                 hint="`slurmhet status` shows each job's group")
            job_ids = tuple(sorted(set(job_ids) | set(members)))
        jobs = []
        for job_id in job_ids:
            job = get_job(session, job_id)
            if job is None:
                raise InputError(f"no slurmhet job {job_id}", place="ID", hint="see `slurmhet status`")
            if job.owner != current_user() and not obj.is_admin():
                raise InputError(f"job {job_id} belongs to {job.owner}", place="ID", hint="you can cancel your own jobs")
            jobs.append(job)
        live = [p.target for j in jobs for p in j.slurm_jobs if p.state in ("PENDING", "RUNNING", "UNKNOWN")]
        obj.client.cancel(sorted(set(live)))
        for job in jobs:
            if not job.state.final:
                add_event(session, job, "cancelled", f"by {current_user()}")
                job.state = JobState.CANCELLED
                for part in job.slurm_jobs:
                    if part.state in ("PENDING", "RUNNING", "UNKNOWN"):
                        part.state = "CANCELLED"
            click.echo(f"{job.id}\t{job.name}\tCANCELLED")
