"""click commands; thin: parse, call, print. Exit 2 for user errors, 1 for system failures."""

from __future__ import annotations

import grp
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import click
from rich.console import Console
from rich.table import Table

from slurmhet import spec as specmod
from slurmhet.cluster import Inventory, OpenWorld, cluster_option, inventory_yaml, load_inventory_yaml
from slurmhet.config import Settings, load_settings
from slurmhet.errors import InputError, SlurmhetError, SystemFailure
from slurmhet.runtime.progress import atomic_write_text
from slurmhet.slurm import pyslurm_client
from slurmhet.slurm.client import SlurmCli, SlurmClient
from slurmhet.slurm.parsers import SlurmOutputError
from slurmhet.slurm.profile import SiteProfile, load_profile
from slurmhet.slurm.runner import SlurmCommandError, SubprocessRunner
from slurmhet.slurm.world import Access, SlurmWorld, read_world
from slurmhet.store import Database, JobState, list_jobs, get_job, add_event

if TYPE_CHECKING:
    from slurmhet.throughput import ThroughputTable

#: A pipe or a file gets whole tables (rich would cut every cell to fit 80 columns: `make demo`'s report
#: read "COMP…"); a terminal keeps its own width.
console = Console(width=None if sys.stdout.isatty() else 240)
err_console = Console(stderr=True)


class Context:
    """Lazily opened resources, so `validate` needs neither Slurm nor a database."""

    def __init__(self) -> None:
        self.settings: Settings = load_settings()

    @cached_property
    def runner(self) -> SubprocessRunner:
        return SubprocessRunner(timeout=self.settings.slurm.command_timeout_s)

    @cached_property
    def client(self) -> SlurmClient:
        """The command-line client, or pyslurm's when it is installed and matches this Slurm."""
        cli = SlurmCli(self.runner, timeout=self.settings.slurm.command_timeout_s)
        if importlib.util.find_spec("pyslurm") is None:
            return cli
        module, _reason = pyslurm_client.available(cli.version())
        return pyslurm_client.PyslurmClient(module, cli) if module is not None else cli

    @cached_property
    def db(self) -> Database:
        return Database(self.settings.database_url)

    @cached_property
    def profile(self) -> SiteProfile:
        return load_profile(self.client, self.settings.state_dir / "site-profile.json", self.settings.slurm)

    def inventory(self) -> Inventory:
        """The live inventory; each read also refreshes the cache that planning without Slurm falls back on."""
        inventory = Inventory(tuple(self.client.nodes()))
        path, text = self.inventory_cache, inventory_yaml(inventory)
        try:
            if not path.is_file() or path.read_text() != text:
                atomic_write_text(path, text)
        except OSError as exc:  # only a cache: the command itself must not fail for it
            err_console.print(f"slurmhet: warning: cannot cache the inventory in {path}: {exc}", markup=False)
        return inventory

    @property
    def inventory_cache(self) -> Path:
        return self.settings.state_dir / "inventory.yaml"

    def planning_cluster(self, cluster_spec: str | None, gpus_per_node: int) -> "PlanningCluster":
        """Where `plan` and `submit --dry-run` plan: ``--cluster``, else live Slurm, else the cached inventory."""
        from slurmhet.slurm.profile import cached_profile

        if cluster_spec:
            profile, _ = cached_profile(self.settings.state_dir / "site-profile.json", self.settings.slurm)
            return PlanningCluster(cluster_option(cluster_spec, gpus_per_node), profile, "--cluster",
                                   f"planned for --cluster {cluster_spec}; Slurm was not asked")
        try:
            return PlanningCluster(self.inventory(), None, "slurm", "")
        except (SlurmCommandError, SlurmOutputError) as exc:
            cache = self.inventory_cache
            if not cache.is_file():
                why = exc.message if isinstance(exc, SlurmCommandError) else str(exc)
                raise InputError(f"Slurm cannot be reached ({why}) and no inventory is cached "
                                 f"in {self.settings.state_dir}", place="--cluster",
                                 hint="plan for a cluster shape: --cluster v100:4,t4:8 (or a cluster YAML)") from exc
            profile, _ = cached_profile(self.settings.state_dir / "site-profile.json", self.settings.slurm)
            stamp = datetime.fromtimestamp(cache.stat().st_mtime, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            return PlanningCluster(load_inventory_yaml(cache), profile, "cache",
                                   f"Slurm cannot be reached: planned on the inventory cached {stamp} ({cache})")

    def planning_table(self, live: bool) -> "ThroughputTable":
        """The site table with the store's measurements; offline, only a store that exists already is read."""
        from slurmhet.site_table import learned_table, site_table

        table = site_table(self.settings)
        url = self.settings.database_url
        if not live and url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
            return table
        with self.db.snapshot() as session:
            return learned_table(session, table)

    def is_admin(self) -> bool:
        """Root, or a member of the configured admin group, may see and cancel every user's jobs."""
        if os.getuid() == 0:
            return True
        group = self.settings.admin_group
        if not group:
            return False
        try:
            entry = grp.getgrnam(group)
        except KeyError:
            return False
        from slurmhet.submission import current_user

        return entry.gr_gid in os.getgroups() or current_user() in entry.gr_mem


@dataclass(frozen=True)
class PlanningCluster:
    """The cluster a plan is made for; ``profile`` is None when Slurm answered (probe it live)."""

    inventory: Inventory
    profile: SiteProfile | None
    source: str  # "slurm" | "--cluster" | "cache"
    note: str


class SlurmhetGroup(click.Group):
    """Turns slurmhet's errors into one line on stderr and the right exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SlurmCommandError as exc:
            err_console.print(f"slurmhet: error: Slurm: {exc.describe()}", markup=False, highlight=False,
                              soft_wrap=True)
            sys.exit(1)
        except SlurmhetError as exc:
            kind = "error" if isinstance(exc, InputError) else "failure"
            err_console.print(f"slurmhet: {kind}: {exc}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(exc.exit_code)


@click.group(cls=SlurmhetGroup)
@click.version_option(package_name="slurmhet")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Heterogeneity-aware batch layer for Slurm."""
    ctx.obj = Context()


CLUSTER_HELP = "plan for this cluster shape without Slurm: v100:4,t4:8 or a cluster YAML (as `simulate`)"


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _load_specs(files: Sequence[str]) -> list[tuple[specmod.JobSpec, str]]:
    out = []
    for path in files:
        out += [(s, path) for s in specmod.load_file(path)]
    return out


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...]) -> None:
    """Check job spec FILES without Slurm or the database."""
    specs = _load_specs(files)
    for spec, path in specs:
        click.echo(f"ok  {path}: {spec.name} ({spec.workload.key}, {spec.gpus.min}-{spec.gpus.max} GPUs)"
                   + (f" [group {spec.group}]" if spec.group else ""))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_obj
def cluster(obj: Context, as_json: bool) -> None:
    """GPU types x nodes x counts from the live cluster, and per partition who holds them, with your limits."""
    from slurmhet.slurm.world import access_of, by_type, gpu_use, gpus_held
    from slurmhet.shared_cluster import user_groups
    from slurmhet.submission import current_user

    user = current_user()
    world = read_world(obj.client, user)
    inventory = world.inventory
    access = access_of(world, user, user_groups(user))
    use = gpu_use(world, obj.db.instance, datetime.now(timezone.utc).timestamp())
    others = by_type(gpus_held(world, obj.db.instance)["others"])
    limits = {"accounting": world.accounting, "user": user, "account": access.account, "qos": access.qos,
              "gpu_cap": access.gpu_cap, "gpu_cap_source": access.cap_source, "job_gpu_cap": access.job_gpu_cap,
              "partitions": list(access.partitions), "refused": dict(access.refused), "gpu_types": list(access.types)}
    if as_json:
        _emit_json({"nodes": [{"name": n.name, "gpus": dict(n.gpus), "features": list(n.features), "state": n.state,
                               "mps": n.mps, "shards": n.shards} for n in inventory.nodes],
                    "gpus_by_type": inventory.gpus_by_type(),
                    "others": {t: others.get(t, 0) for t in inventory.gpu_types},
                    "partitions": [{"partition": u.partition, "gpu_type": u.gpu_type, "total": u.total,
                                    "slurmhet": u.slurmhet, "others": u.others, "reserved": u.reserved,
                                    "free": u.free} for u in use],
                    "limits": limits})
        return
    types = inventory.gpu_types
    table = Table(title="slurmhet cluster")
    for column in ("node", "state", *types, "features"):
        table.add_column(column)
    for node in inventory.nodes:
        table.add_row(node.name, node.state, *(str(node.gpus.get(t, 0)) for t in types), ",".join(node.features))
    table.add_row("total", "", *(str(inventory.gpus_by_type().get(t, 0)) for t in types), "")
    console.print(table)
    table = Table(title="GPUs per partition: total / slurmhet / others / reserved / free")
    for column in ("partition", "type", "total", "slurmhet", "others", "reserved", "free", "you"):
        table.add_column(column)
    for u in use:
        table.add_row(u.partition, u.gpu_type, str(u.total), str(u.slurmhet), str(u.others), str(u.reserved),
                      str(u.free), "yes" if u.partition in access.partitions else access.refused.get(u.partition, "no"))
    console.print(table)
    if not world.accounting:
        console.print("accounting is off: no associations, QOS limits or job history to read", markup=False)
    else:
        cap = f"{access.gpu_cap} GPUs at once ({access.cap_source})" if access.gpu_cap is not None else "no GPU cap"
        console.print(f"{user}: account {access.account or '-'}, QOS {access.qos}, {cap}", markup=False)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="print the plan, each script and sbatch argv; store and submit nothing")
@click.option("--cluster", "cluster_spec", default=None, help="with --dry-run: " + CLUSTER_HELP)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True,
              help="GPUs per node for a --cluster TYPE:COUNT list")
@click.option("--profile-first", is_flag=True,
              help="first profile each job on its allowed types nobody measured yet (`slurmhet profile`)")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def submit(obj: Context, files: tuple[str, ...], dry_run: bool, cluster_spec: str | None, gpus_per_node: int,
           profile_first: bool, as_json: bool) -> None:
    """Validate and store the jobs in FILES, plan them with the pending ones, submit what starts now."""
    from slurmhet.submission import current_user, dry_run_outcomes, submit_new

    if cluster_spec and not dry_run:
        raise InputError("--cluster plans for a shape that is not this Slurm: it goes with --dry-run only",
                         place="--cluster", hint="add --dry-run, or drop --cluster to submit to the live cluster")
    if profile_first and dry_run:
        raise InputError("--profile-first runs jobs on the cluster; --dry-run runs nothing", place="--profile-first",
                         hint="`slurmhet profile FILES` first, then `submit --dry-run`")
    specs = _load_specs(files)
    if profile_first:
        for row in _run_profiles(obj, specs, (), 100, 10, skip_measured=True, quiet=as_json):
            if not as_json:
                rate = f"{row.samples_per_s:.1f} samples/s" if row.samples_per_s else f"nothing measured ({row.state})"
                err_console.print(f"slurmhet: profiled {row.job} on {row.gpu_type}: {rate}", markup=False)
    where = obj.planning_cluster(cluster_spec, gpus_per_node) if dry_run else None
    if where is not None and where.profile is not None:
        import time

        if not as_json:
            err_console.print(f"slurmhet: note: {where.note}", markup=False, highlight=False, soft_wrap=True)
        for spec, _ in specs:
            specmod.check_against_cluster(spec, where.inventory.usable())
        outcomes = dry_run_outcomes(specs, [], where.inventory, obj.planning_table(live=False), where.profile,
                                    obj.settings, time.time(), current_user())
    else:
        inventory = where.inventory if where is not None else obj.inventory()
        outcomes = submit_new(None if dry_run else obj.db, (obj.client, obj.profile, obj.settings, obj.runner),
                              specs, inventory, dry_run)
    if as_json:
        _emit_json({"jobs": [o.to_json() for o in outcomes]})
    else:
        for o in outcomes:
            if dry_run:
                click.echo(f"# job {o.name!r}: {o.allocation}" + (f" ({o.reason})" if o.reason else ""))
                for part in o.rendered:
                    click.echo(f"# {part['role']} argv: " + " ".join(_shell_join(part["argv"])))
                    click.echo(part["script"])
            else:
                tail = ("Slurm job " + ",".join(o.slurm_job_ids)) if o.slurm_job_ids else o.reason
                click.echo(f"{o.job_id}\t{o.name}\t{o.state}\t{o.allocation}\t{tail}")
    if any(o.state == "SUBMIT_FAILED" for o in outcomes):
        err_console.print("slurmhet: failure: Slurm refused some jobs; they stay stored as SUBMIT_FAILED "
                          "and `slurmhet replan` retries them", markup=False)
        sys.exit(1)


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--types", "types_text", default="", help="comma-separated GPU types [default: each job's allowed types]")
@click.option("--steps", type=click.IntRange(min=1), default=100, show_default=True,
              help="steps each run measures before it is stopped")
@click.option("--max-minutes", type=click.IntRange(min=1), default=10, show_default=True,
              help="time limit of each profiling run")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def profile(obj: Context, files: tuple[str, ...], types_text: str, steps: int, max_minutes: int,
            as_json: bool) -> None:
    """Run each job in FILES briefly on each GPU type, store the measured samples/s, print the table.

    Every later plan of these workloads uses the measurements (no table file needed); runtime
    progress keeps refining them.
    """
    specs = _load_specs(files)
    only = tuple(t.strip().lower() for t in types_text.split(",") if t.strip())
    result = _run_profiles(obj, specs, only, steps, max_minutes, skip_measured=False, quiet=as_json)
    if as_json:
        _emit_json({"profiles": [r.to_json() for r in result]})
    else:
        _print_profiles(result)
    if any(r.samples_per_s is None for r in result):
        err_console.print("slurmhet: failure: some runs measured nothing (see their state; `slurmhet status`)",
                          markup=False)
        sys.exit(1)


def _run_profiles(obj: Context, specs: Sequence[tuple[specmod.JobSpec, str]], only: tuple[str, ...], steps: int,
                  minutes: int, skip_measured: bool, quiet: bool) -> list[Any]:
    from slurmhet.profiling import run_profiles

    def say(line: str) -> None:
        if not quiet:
            err_console.print(f"slurmhet profile: {line}", markup=False)

    return run_profiles(obj.db, (obj.client, obj.profile, obj.settings, obj.runner), specs, obj.inventory(),
                        obj.planning_table(live=True), only, steps, minutes, skip_measured, say)


def _print_profiles(result: Sequence[Any]) -> None:
    table = Table(title="slurmhet profile (samples/s per GPU)")
    for column in ("job", "workload", "gpu type", "samples/s", "vs fastest", "state", "slurmhet id", "Slurm"):
        table.add_column(column)
    for r in result:
        table.add_row(r.job, r.workload, r.gpu_type, f"{r.samples_per_s:.1f}" if r.samples_per_s else "-",
                      f"{r.ratio:.2f}" if r.ratio else "-", r.state, str(r.stored_job_id), " ".join(r.slurm_job_ids))
    console.print(table)


def _shell_join(argv: Sequence[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]


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
    from slurmhet.submission import current_user
    from slurmhet.sync import fetch_view, sync_jobs

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
        sync_jobs(session, jobs, view)
        rows = [{
            "id": j.id, "name": j.name, "owner": j.owner, "group": j.spec.get("group"), "state": j.state.value,
            "reason": j.reason,
            "slurm": [{"id": p.slurm_job_id, "role": p.role, "het_offset": p.het_offset, "array_task": p.array_task,
                       "gpu_type": p.gpu_type, "gpus": p.gpu_count, "state": p.state, "nodes": p.nodes,
                       "reason": p.reason} for p in j.slurm_jobs],
            "throughput_priors": list((j.plan or {}).get("priors") or ()),
            "logs": [str(part.path) for part in _log_parts(obj, j, files)],
            **_waiting_view(j, context),
        } for j in jobs]
    if as_json:
        _emit_json({"jobs": rows})
        return
    table = Table(title="slurmhet status")
    for column in ("id", "name", "owner", "state", "slurm", "gpus", "nodes", "reason", "log"):
        table.add_column(column)
    for row in rows:
        parts = [p for p in row["slurm"] if p["role"] != "superseded"]
        why = "; ".join(x for x in (row["reason"], row["slurm_reason"] and f"Slurm: {row['slurm_reason']}",
                                    row["throughput_priors"] and not JobState(row["state"]).final
                                    and "planned on a prior speed for " + ", ".join(row["throughput_priors"]),
                                    row["slurm_expected_start"] and f"Slurm expects start {row['slurm_expected_start']}",
                                    row["planned_start"] and f"plan: start {row['planned_start']}", row["why"]) if x)
        table.add_row(str(row["id"]), row["name"], row["owner"], row["state"],
                      " ".join(p["id"] for p in parts), " ".join(f"{p['gpus']}x{p['gpu_type']}" for p in parts),
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
    try:
        world = read_world(obj.client, current_user())
        context = _WaitContext.of(obj, world, current_user())
        inventory_types = world.inventory.gpu_types
        waiting = _waiting_view(job, context)
    except (SlurmCommandError, SlurmOutputError):
        inventory_types = ()
    table = with_specs(obj.planning_table(live=True), [spec])
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
        from slurmhet.site_table import learned_table, site_table

        with self.db.snapshot() as session:
            return learned_table(session, site_table(self.settings))


def _waiting_view(job: Any, context: _WaitContext) -> dict[str, Any]:
    """Slurm's pending reason and expected start, the plan's start, and why a waiting job waits."""
    from slurmhet.explain import why_waiting
    from slurmhet.site_table import with_specs
    from slurmhet.submission import stored_allocation

    world = context.world
    out: dict[str, Any] = {"slurm_reason": "", "slurm_expected_start": None, "planned_start": None, "why": ""}
    parts = [p for p in job.slurm_jobs if p.role != "superseded" and p.state == "PENDING"]
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
    return ((list(log_dir.glob("*.out")) if log_dir.is_dir() else [])
            + (list(submitit_dir.glob("*/*_log.out")) if submitit_dir.is_dir() else []))


def _log_parts(obj: Context, job: Any, files: list[Path] | None = None) -> list[Any]:
    from slurmhet.joblogs import PartInfo, log_parts

    infos = [PartInfo(p.slurm_job_id, p.role, p.submitted_at, p.state, p.gpu_type, p.gpu_count, p.nodes,
                      p.array_task, p.het_offset, p.round) for p in job.slurm_jobs]
    return log_parts(infos, _log_files(obj) if files is None else files)


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
            sync_jobs(session, [job], view)
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
    from slurmhet.submission import current_user, stored_allocation

    job = _refresh(obj, job_id)
    spec = specmod.parse_job(job.spec, f"store:job {job.id}")
    user = current_user()
    world = read_world(obj.client, user)
    context = _WaitContext.of(obj, world, user)
    inventory = world.inventory
    done = job_steps(read_progress(obj.settings.progress_dir)).get(str(job_id), 0) * spec.global_batch
    plan_job = plan_job_from_spec(str(job.id), spec, job.created_at.timestamp(),
                                  samples_done=min(float(done), spec.total_samples - 1.0))
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
        start = max(float(plan.get("start_s") or context.now), context.now)
        run = float(plan.get("finish_s") or start) - float(plan.get("start_s") or start)
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
    runs = sorted((p for p in job.slurm_jobs if p.role != "superseded"), key=lambda p: (p.submitted_at, p.id))
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
@click.pass_obj
def logs(obj: Context, job_id: int, follow: bool, part_no: int | None) -> None:
    """The output of job ID across all its Slurm parts (components, array copies, consolidations,
    resubmissions) in order, each headed by its Slurm id, GPUs and nodes; stdout and stderr share a file."""
    import time

    from slurmhet.joblogs import Tail, numbered

    tail = Tail()
    job = _refresh(obj, job_id)
    last_sync = time.monotonic()
    while True:
        listed = numbered(_log_parts(obj, job))
        if part_no is not None and not follow and part_no > len(listed):
            raise InputError(f"job {job_id} has {len(listed)} part(s) with output", place="--part",
                             hint="leave --part out to see them all")
        for number, part in listed:
            if part_no is not None and number != part_no:
                continue
            first = not tail.seen(part.path)
            data = tail.read_new(part.path)
            if first:
                click.echo(f"==> part {number}: {part.header} <==")
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
        if not follow or job.state.final:
            if follow or not listed:
                click.echo(f"==> job {job_id} {job.state.value}" + (f": {job.reason}" if job.reason else "") + " <==")
            return
        time.sleep(1.0)
        if time.monotonic() - last_sync >= 5.0:
            job, last_sync = _refresh(obj, job_id), time.monotonic()


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
        live = [p.slurm_job_id for j in jobs for p in j.slurm_jobs if p.state in ("PENDING", "RUNNING", "UNKNOWN")]
        obj.client.cancel(sorted(set(live)))
        for job in jobs:
            if not job.state.final:
                add_event(session, job, "cancelled", f"by {current_user()}")
                job.state = JobState.CANCELLED
                for part in job.slurm_jobs:
                    if part.state in ("PENDING", "RUNNING", "UNKNOWN"):
                        part.state = "CANCELLED"
            click.echo(f"{job.id}\t{job.name}\tCANCELLED")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def run(argv: tuple[str, ...]) -> None:
    """Run CMD as one rank of the planned job (used by every emitted script)."""
    from slurmhet.runtime.launcher import launch

    sys.exit(launch(list(argv)))


@main.command()
@click.option("--since", type=click.DateTime(), default=None, help="only jobs stored since this time")
@click.option("--user", default=None, help="another user's jobs (root or admin group)")
@click.option("--group", default=None, help="only this group's jobs (a sweep's variants share its name)")
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True)
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None, help="write PNG plots here")
@click.pass_obj
def report(obj: Context, since: Any, user: str | None, group: str | None, as_json: bool, as_csv: bool,
           plot_dir: str | None) -> None:
    """JCT, queueing, makespan and GPU-hours per type, from sacct joined with the store, beside other users' jobs."""
    from datetime import datetime, timezone

    from slurmhet.report import GpuShares, build_report, foreign_report, records_from_queue, write_plots
    from slurmhet.submission import current_user

    if as_json and as_csv:
        raise InputError("--json and --csv exclude each other", place="--csv", hint="pick one")
    me = current_user()
    if user not in (None, me) and not obj.is_admin():
        raise InputError(f"--user {user} needs root or the admin group", place="--user", hint="drop --user")
    with obj.db.snapshot() as session:
        stored = [j for j in list_jobs(session, owner=user or (None if obj.is_admin() else me))
                  if (since is None or j.created_at.replace(tzinfo=None) >= since)
                  and (group is None or j.spec.get("group") == group)]
        if group is not None and not stored:
            raise InputError(f"no jobs in group {group!r}", place="--group", hint="`slurmhet status` shows groups")
        jobs = [_stored_view(j) for j in stored]
    ids = sorted({i for j in jobs for i in j.slurm_ids})
    notices: list[str] = []
    if obj.profile.accounting:
        records = obj.client.accounting(ids)
    else:
        records = records_from_queue(obj.client.queue(ids), datetime.now(timezone.utc))
        notices.append("accounting is off at this site: times come from squeue/scontrol and cover live jobs only")
    inventory = obj.inventory()
    shares = {n.name: GpuShares(next(iter(n.gpus)), n.mps / n.gpus[next(iter(n.gpus))],
                                n.shards / n.gpus[next(iter(n.gpus))])
              for n in inventory.nodes if len(n.gpus) == 1 and next(iter(n.gpus.values()))}
    result = build_report(jobs, records, inventory.gpus_by_type(), notices, shares)
    if result.window[0] is not None:  # the jobs slurmhet's shared the cluster with
        try:
            others = (obj.client.accounting(None, since=result.window[0]) if obj.profile.accounting
                      else records_from_queue(obj.client.queue(), datetime.now(timezone.utc)))
            result.foreign = foreign_report(others, obj.db.instance, result.window, ids)
        except (SlurmCommandError, SlurmOutputError) as exc:
            result.notices.append(f"other users' jobs in the window are unknown: {exc}")
    if plot_dir:
        for path in write_plots(result, plot_dir):
            err_console.print(f"wrote {path}", markup=False)
    if as_json:
        _emit_json(result.to_json())
        return
    if as_csv:
        click.echo(result.to_csv(), nl=False)
        return
    _print_report(result)


def _stored_view(job: Any) -> Any:
    from slurmhet.report import StoredJob

    roles = [p.role for p in job.slurm_jobs]
    restarts = max(0, sum(1 for r in roles if r in ("batch", "het", "pack")) - 1)
    return StoredJob(id=job.id, name=job.name, owner=job.owner, weight=float(job.spec.get("weight", 1.0)),
                     predicted_jct_s=job.predicted_jct_s, slurm_ids=tuple(p.slurm_job_id for p in job.slurm_jobs),
                     restarts=restarts, emulated=bool((job.plan or {}).get("emulated")), stored_at=job.created_at)


def _print_report(result: Any) -> None:
    types = sorted(result.gpu_hours)
    table = Table(title="slurmhet report")
    for column in ("id", "name", "state", "queue s", "run s", "JCT s", "pred JCT s", *[f"{t} GPU-h" for t in types]):
        table.add_column(column)

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f}"

    for j in result.jobs:
        table.add_row(str(j.id), j.name[:28], j.state, fmt(j.queue_s), fmt(j.run_s), fmt(j.jct_s),
                      fmt(j.predicted_jct_s), *[f"{j.gpu_hours.get(t, 0.0):.4f}" for t in types])
    console.print(table)
    util = ", ".join(f"{t} {u:.1%}" for t, u in sorted(result.utilization.items()))
    console.print(f"makespan {fmt(result.makespan_s)} s, avg JCT {fmt(result.avg_jct_s)} s, weighted JCT "
                  f"{fmt(result.weighted_jct_s)} s, avg queue {fmt(result.avg_queue_s)} s", markup=False)
    console.print("GPU-hours " + ", ".join(f"{t} {h:.4f}" for t, h in sorted(result.gpu_hours.items())) +
                  f"; utilisation {util}", markup=False)
    if result.plan_error is not None:
        console.print(f"plan vs actual JCT error: {result.plan_error:.1%}", markup=False)
    if result.foreign is not None:
        _print_foreign(result.foreign, fmt)
    for notice in result.notices:
        console.print(f"note: {notice}", markup=False)


def _print_foreign(foreign: Any, fmt: Any) -> None:
    types = sorted(foreign.total.gpu_hours)
    table = Table(title="other users' jobs in the same window")
    for column in ("user", "jobs", "avg queue s", "avg JCT s", *[f"{t} GPU-h" for t in types]):
        table.add_column(column)
    for user, group in [*sorted(foreign.users.items()), ("all", foreign.total)]:
        table.add_row(user, str(group.jobs), fmt(group.avg_queue_s), fmt(group.avg_jct_s),
                      *[f"{group.gpu_hours.get(t, 0.0):.4f}" for t in types])
    console.print(table)
    console.print("(GPU-hours inside the window only; jobs not tagged by this store, pending ones included)",
                  markup=False)


@main.command("run-pack")
@click.argument("packfile", type=click.Path(dir_okay=False))
def run_pack_command(packfile: str) -> None:
    """Run a co-location pack's members concurrently under a job-private MPS daemon."""
    from slurmhet.runtime.mps import load_pack, pack_exit_status, run_pack

    sys.exit(pack_exit_status(run_pack(load_pack(packfile))))


@main.command()
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="consolidated checkpoint to write")
@click.argument("ckpts", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--weights", multiple=True, type=float, help="one per checkpoint (default: each copy's steps)")
def consolidate(out: str, ckpts: tuple[str, ...], weights: tuple[float, ...]) -> None:
    """Weight-average forked copies' checkpoints (HadarE); loads weights only, writes atomically."""
    from slurmhet.runtime.consolidate import consolidate as consolidate_checkpoints

    if weights and len(weights) != len(ckpts):
        raise InputError(f"{len(weights)} weights for {len(ckpts)} checkpoints", place="--weights",
                         hint="give one --weights per checkpoint, or none")
    env = os.environ
    result = consolidate_checkpoints(out, ckpts, list(weights) or None, progress_dir=env.get("SLURMHET_PROGRESS_DIR"),
                                     job_id=env.get("SLURMHET_JOB_ID"))
    click.echo(result.summary())


@main.command()
@click.option("--once", "mode", flag_value="once", default=True, help="one pass (for cron; the default)")
@click.option("--every", "every_s", type=click.FloatRange(min=5), default=None, help="loop, one pass every SECONDS")
@click.option("--dry-run", is_flag=True, help="print what would change; submit and cancel nothing")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def replan(obj: Context, mode: str, every_s: float | None, dry_run: bool, as_json: bool) -> None:
    """Sync from Slurm, learn throughput, re-plan unstarted work and apply the minimal change."""
    import time

    from slurmhet.replan import Replanner
    from slurmhet.submission import current_user

    replanner = Replanner(obj.db, obj.client, obj.profile, obj.settings, obj.runner, current_user())
    while True:
        result = replanner.run(dry_run=dry_run)
        if as_json:
            _emit_json(result.to_json())
        elif result.already_running:
            click.echo("slurmhet replan: already running")
        else:
            for line in result.events:
                click.echo(f"event: {line}")
            for line in result.actions:
                click.echo(f"{'would ' if dry_run else ''}{line}")
            for part in result.dry_run_parts:
                click.echo(f"# {part['role']} argv: " + " ".join(_shell_join(part["argv"])))
            if not (result.events or result.actions):
                click.echo("slurmhet replan: nothing to do")
        if every_s is None:
            return
        time.sleep(every_s)


#: ``slurmhet simulate``'s table: JSON key, header, scale, format (hours and milliseconds, so 80 columns hold it;
#: ``--json`` has every metric in seconds).
SIMULATE_COLUMNS = (("avg_jct", "JCT h", 1 / 3600, "{:,.2f}"), ("weighted_jct", "wJCT h", 1 / 3600, "{:,.0f}"),
                    ("makespan", "span h", 1 / 3600, "{:,.1f}"), ("utilization", "util", 1.0, "{:.3f}"),
                    ("avg_queue", "queue h", 1 / 3600, "{:,.2f}"), ("jain", "Jain", 1.0, "{:.3f}"),
                    ("plan_seconds", "plan ms", 1000.0, "{:,.1f}"))


def _progress_bar(total_label: str) -> Any:
    """A rich progress bar on a terminal, nothing otherwise (pipes and --json stay clean)."""
    from rich.progress import Progress

    return Progress(console=err_console, transient=True, disable=not err_console.is_terminal)


@main.command()
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Gavel .trace or CSV (submit_time,gpus,workload,steps|duration)")
@click.option("--generate", "generate_n", type=click.IntRange(min=1), default=None, help="a seeded Gavel-style trace")
@click.option("--arrivals", type=click.Choice(["poisson", "zero"]), default="poisson", show_default=True)
@click.option("--cluster", "cluster_spec", required=True, help="v100:20,p100:20,k80:20 or a cluster YAML")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per server [Gavel traces: one server per GPU type, as Gavel's throughputs assume; else 4]")
@click.option("--policy", "policy_list", default="slurmhet", show_default=True, help="comma-separated policy keys")
@click.option("--round-s", type=float, default=360.0, show_default=True)
@click.option("--restart-s", type=float, default=None,
              help="checkpoint-restart cost of a move [Gavel traces: 0, as Gavel's simulator; else 10]")
@click.option("--start-s", type=float, default=0.0, show_default=True,
              help="start-up cost of a job's first start (measure it on your site)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--bound", "with_bound", is_flag=True,
              help="lower bounds on avg JCT, weighted JCT and makespan for this instance, and each policy's ratio")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, with every job's record under each policy")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None)
def simulate(trace_path: str | None, generate_n: int | None, arrivals: str, cluster_spec: str,
             gpus_per_node: int | None, policy_list: str, round_s: float, restart_s: float | None, start_s: float,
             seed: int, with_bound: bool, as_json: bool, plot_dir: str | None) -> None:
    """Replay a trace on a simulated cluster under one or more policies (same planners as submit).

    A Gavel trace (``.trace`` or ``--generate``) runs in Gavel's set-up unless the flags say otherwise:
    one server per GPU type (Gavel's multi-GPU throughputs do not depend on placement) and free
    preemption (its simulator charges none), so its figures and ours compare.
    """
    from slurmhet import sim
    from slurmhet.cluster import cluster_option

    if (trace_path is None) == (generate_n is None):
        raise InputError("give exactly one of --trace and --generate", place="--trace/--generate",
                         hint="--generate 100 or --trace jobs.trace")
    gavel_setup = trace_path is None or not trace_path.lower().endswith(".csv")  # a CSV trace is not Gavel's
    if trace_path is not None:
        jobs = sim.load_gavel_trace(trace_path) if gavel_setup else sim.load_csv_trace(trace_path)
    else:
        jobs = sim.generate_trace(generate_n or 0, seed, arrivals)
    if gpus_per_node is None:
        gpus_per_node = sim.GAVEL_SERVER_GPUS if gavel_setup else 4
    if restart_s is None:
        restart_s = 0.0 if gavel_setup else 10.0
    inventory = cluster_option(cluster_spec, gpus_per_node)
    policies = [p.strip() for p in policy_list.split(",") if p.strip()]
    with _progress_bar("policies") as bar:
        task = bar.add_task("simulating", total=len(policies))

        def progress(name: str, index: int, total: int) -> None:
            bar.update(task, completed=index, description=f"simulating {name}")

        report = sim.simulate(jobs, inventory, None, policies, round_s=round_s, seed=seed, progress=progress,
                              restart_s=restart_s, start_s=start_s, bound=with_bound)
    report.meta.update(setup="gavel" if gavel_setup else "slurmhet", gpus_per_node=gpus_per_node)
    if plot_dir:
        for path in sim.write_plots(report, plot_dir):
            err_console.print(f"wrote {path}", markup=False)
    data = report.to_json(jobs=as_json)
    if as_json:
        _emit_json(data)
        return
    table = Table(title=f"slurmhet simulate: {len(jobs)} jobs on {sum(inventory.gpus_by_type().values())} GPUs")
    table.add_column("policy", no_wrap=True)
    for _, header, _, _ in SIMULATE_COLUMNS:
        table.add_column(header, justify="right", no_wrap=True)
    bound = data.get("bound")
    if bound:
        table.add_column("JCT/LB", justify="right", no_wrap=True)
        table.add_column("span/LB", justify="right", no_wrap=True)
    for name, metrics in data["policies"].items():
        cells = [form.format(metrics[key] * scale) if isinstance(metrics.get(key), (int, float)) else "-"
                 for key, _, scale, form in SIMULATE_COLUMNS]
        ratio = metrics.get("ratio_to_bound") or {}
        extra = [f"{ratio[k]:.3f}" if ratio.get(k) is not None else "-" for k in ("avg_jct", "makespan")] if bound else []
        table.add_row(name, *cells, *extra)
    if bound:
        table.add_row("lower bound", *(form.format(bound[key] * scale) if key in bound else ""
                                       for key, _, scale, form in SIMULATE_COLUMNS), "1", "1")
    console.print(table)


@main.group()
def bench() -> None:
    """Benchmarks that print JSON with ratios against baselines and bounds."""


@bench.command("placement")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--case", "cases", multiple=True, help="only these cases")
def bench_placement(as_json: bool, cases: tuple[str, ...]) -> None:
    """Sizing + placement vs HAS/JPS/Optimus and the exact optimum or LP bound (seed 001)."""
    from bench import placement

    _emit_json(placement.run(list(cases) or None))


@bench.command("reproduce")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--case", "cases", multiple=True, help="only these cases")
@click.option("--quick", is_flag=True, help="scaled-down instances")
def bench_reproduce(as_json: bool, cases: tuple[str, ...], quick: bool) -> None:
    """The papers' simulations (Hare, Hadar/HadarE, SJF-BCO, Gavel traces, scale)."""
    from bench import reproduce

    _emit_json(reproduce.run(list(cases) or None, quick))


@bench.command("emit")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--jobs", type=click.IntRange(min=1), default=1000, show_default=True)
def bench_emit(as_json: bool, jobs: int) -> None:
    """Submissions per second to the real slurmctld: one array vs one sbatch per job."""
    from bench import emit

    _emit_json(emit.run(jobs))


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--policy", default=None, help="planner key (default: the configured default, 'slurmhet')")
@click.option("--cluster", "cluster_spec", default=None, help=CLUSTER_HELP)
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=4, show_default=True,
              help="GPUs per node for a --cluster TYPE:COUNT list")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def plan(obj: Context, files: tuple[str, ...], policy: str | None, cluster_spec: str | None, gpus_per_node: int,
         as_json: bool) -> None:
    """Plan the jobs in FILES and print the plan; submits nothing.

    On the live cluster (with other users' jobs, partitions and limits) when Slurm answers; for a
    given shape with --cluster; on the cached inventory, said so, when Slurm cannot be reached.
    """
    import time

    from slurmhet.planner.render import HEADER, plan_dict, plan_rows
    from slurmhet.shared_cluster import check_access, read_shared
    from slurmhet.submission import Candidate, current_user, plan_for

    specs = _load_specs(files)
    where = obj.planning_cluster(cluster_spec, gpus_per_node)
    inventory = where.inventory
    for spec, _ in specs:
        specmod.check_against_cluster(spec, inventory.usable())
    now = time.time()
    shared = None
    if where.source == "slurm":
        shared = read_shared(obj.client, obj.client.queue(), obj.db.instance, current_user(), now,
                             [spec for spec, _ in specs])
        for spec, _ in specs:
            check_access(spec, shared)
    elif not as_json:
        err_console.print(f"slurmhet: note: {where.note}", markup=False, highlight=False, soft_wrap=True)
    table = obj.planning_table(live=where.source == "slurm")
    candidates = [Candidate(i + 1, spec, now) for i, (spec, _) in enumerate(specs)]
    with _progress_bar("planning") as bar:
        task = bar.add_task("planning", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = plan_for(candidates, inventory, table, policy or obj.settings.default_policy, now,
                          progress=progress, shared=shared)
    names = {str(c.job_id): c.spec.name for c in candidates}
    if as_json:
        from slurmhet.site_table import with_specs

        known = with_specs(table, [c.spec for c in candidates])
        data = {"cluster": {"source": where.source, "note": where.note,
                            "gpus_by_type": inventory.usable().gpus_by_type()}, **plan_dict(result)}
        for job, c in zip(sorted(data["jobs"], key=lambda j: int(j["job"])), candidates):
            job["job"] = c.spec.name
            job["throughput"] = {}
            for gpu_type in c.spec.gpus.types or inventory.gpu_types:
                entry = known.get(c.spec.workload.key, gpu_type)
                job["throughput"][gpu_type] = {"samples_per_s": entry.value, "source": entry.source,
                                               "provenance": entry.provenance}
        _emit_json(data)
        return
    table_out = Table(title=f"slurmhet plan ({result.policy}): avg JCT {result.avg_jct:.0f} s")
    for column in HEADER:
        table_out.add_column(column)
    for row in plan_rows(result):
        table_out.add_row(names[row[0]], *row[1:])
    console.print(table_out)


@bench.command("realcluster")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (the default output is JSON too)")
@click.option("--scale", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="multiply every job's steps (0.3: about 3 minutes per arm)")
@click.option("--replan-every", "replan_every_s", type=click.FloatRange(min=1), default=5.0, show_default=True,
              help="seconds between `slurmhet replan --once` in the slurmhet arm")
@click.option("--background", is_flag=True, help="run every arm again with other users' jobs arriving "
              "(devcluster noise; needs root)")
@click.option("--noise-rate", type=click.FloatRange(min=0, min_open=True), default=2.0, show_default=True,
              help="background jobs per minute")
@click.option("--noise-seed", type=int, default=1, show_default=True, help="background seed, the same for every arm")
def bench_realcluster(as_json: bool, scale: float, replan_every_s: float, background: bool, noise_rate: float,
                      noise_seed: int) -> None:
    """examples/jobs.yaml on the live dev cluster: slurmhet vs naive first-type FIFO vs Slurm choosing the type."""
    from bench import realcluster

    load = realcluster.Background(noise_rate, noise_seed) if background else None
    _emit_json(realcluster.run(scale, replan_every_s, load))
