"""`slurmhet report`: JCT, queueing, makespan and GPU-hours per type from sacct joined with the store."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import click
from rich.table import Table

from slurmhet.cli.app import Context, _emit_json, console, err_console, main
from slurmhet.errors import InputError
from slurmhet.slurm.parsers import SlurmOutputError
from slurmhet.slurm.runner import SlurmCommandError
from slurmhet.store import list_jobs


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

    from slurmhet.report import (
        GpuShares,
        build_report,
        foreign_report,
        records_from_queue,
        write_plots,
    )
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
    ids = sorted({i.partition("_")[0] for j in jobs for i in j.slurm_ids})  # an array's tasks come with it
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

    from slurmhet.sync import restarts

    return StoredJob(id=job.id, name=job.name, owner=job.owner, weight=float(job.spec.get("weight", 1.0)),
                     predicted_jct_s=job.predicted_jct_s, slurm_ids=tuple(p.target for p in job.slurm_jobs),
                     restarts=restarts(job), emulated=bool((job.plan or {}).get("emulated")), stored_at=job.created_at,
                     settled=job.state.value if job.state.final else None)


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
