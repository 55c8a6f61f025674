"""Commands that plan and submit: validate, cluster, plan, profile, submit, replan."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from typing import Any, Sequence

import click
from rich.table import Table

from slurmhet import spec as specmod
from slurmhet.cli.app import (
    CLUSTER_HELP,
    Context,
    _emit_json,
    _load_specs,
    _progress_bar,
    _shell_join,
    console,
    err_console,
    main,
)
from slurmhet.errors import InputError
from slurmhet.slurm.world import read_world


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files: tuple[str, ...]) -> None:
    """Check job spec FILES without Slurm or the database."""
    specs = _load_specs(files)
    for spec, path in specs:
        click.echo(f"ok  {path}: {spec.name} ({spec.workload.key}, {spec.gpus.min}-{spec.gpus.max} GPUs)"
                   + (f" [group {spec.group}]" if spec.group else ""))


#: What ``cluster`` says where sacct keeps no job comments (``SiteProfile.job_comments``).
NO_JOB_COMMENTS = ("sacct keeps no job comments here (AccountingStoreFlags lacks job_comment): a job whose "
                   "submit or replan was cut off after sbatch, and which ended and left the queue before the next "
                   "replan, cannot be found by its tag and is submitted again; an admin can add job_comment")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.pass_obj
def cluster(obj: Context, as_json: bool) -> None:
    """GPU types x nodes x counts from the live cluster, and per partition who holds them, with your limits."""
    from slurmhet.shared_cluster import user_groups
    from slurmhet.slurm.world import access_of, by_type, gpu_use, gpus_held
    from slurmhet.submission import current_user

    user = current_user()
    world = read_world(obj.client, user)
    inventory = world.inventory
    access = access_of(world, user, user_groups(user))
    use = gpu_use(world, obj.db.instance, access, datetime.now(timezone.utc).timestamp())
    others = by_type(gpus_held(world, obj.db.instance)["others"])
    limits = {"accounting": world.accounting, "user": user, "account": access.account, "qos": access.qos,
              "gpu_cap": access.gpu_cap, "gpu_cap_source": access.cap_source, "job_gpu_cap": access.job_gpu_cap,
              "partitions": list(access.partitions), "refused": dict(access.refused), "gpu_types": list(access.types),
              "job_comments": obj.profile.job_comments}
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
    if obj.profile.job_comments is False:
        console.print(NO_JOB_COMMENTS, markup=False)


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
            specmod.check_against_cluster(spec, where.inventory)
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
    from slurmhet.dependencies import preview_hold
    from slurmhet.planner.registry import POLICIES
    from slurmhet.submission import Candidate, current_user, plan_for, unplaceable

    if policy is not None and policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}", place="--policy", hint="one of " + ", ".join(POLICIES))
    specs = _load_specs(files)
    where = obj.planning_cluster(cluster_spec, gpus_per_node)
    inventory = where.inventory
    for spec, _ in specs:
        specmod.check_against_cluster(spec, inventory)
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
    candidates = [Candidate(i + 1, spec, now, held=preview_hold(spec)) for i, (spec, _) in enumerate(specs)]
    with _progress_bar("planning") as bar:
        task = bar.add_task("planning", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=label)

        result = plan_for(candidates, inventory, table, policy or obj.settings.default_policy, now,
                          progress=progress, shared=shared, max_wait_s=obj.settings.max_wait_s)
    names = {str(c.job_id): c.spec.name for c in candidates}
    waiting = unplaceable(candidates, inventory)  # held by after:, or too big for the usable nodes now
    if as_json:
        from slurmhet.site_table import with_specs

        known = with_specs(table, [c.spec for c in candidates])
        by_id = {str(c.job_id): c for c in candidates}
        data = {"cluster": {"source": where.source, "note": where.note,
                            "gpus_by_type": inventory.usable().gpus_by_type()}, **plan_dict(result),
                "waiting": [{"job": names[str(i)], "reason": why} for i, why in sorted(waiting.items())]}
        for job in data["jobs"]:
            c = by_id[job["job"]]
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
    for job_id, why in sorted(waiting.items()):
        table_out.add_row(names[str(job_id)], "-", "-", "-", "-", "-", "-", "-", why)
    console.print(table_out)
