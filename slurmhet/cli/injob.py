"""Commands the emitted scripts run inside a job: run, run-pack, consolidate."""

from __future__ import annotations

import os
import sys

import click

from slurmhet.cli.app import main
from slurmhet.errors import InputError


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, required=True)
def run(argv: tuple[str, ...]) -> None:
    """Run CMD as one rank of the planned job (used by every emitted script)."""
    from slurmhet.runtime.launcher import launch

    sys.exit(launch(list(argv)))


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
@click.option("--skip-bad", is_flag=True,
              help="leave out, with a warning, copies that do not load or belong to an earlier round (in a job)")
def consolidate(out: str, ckpts: tuple[str, ...], weights: tuple[float, ...], skip_bad: bool) -> None:
    """Weight-average forked copies' checkpoints (HadarE); loads weights only, writes atomically."""
    from slurmhet.runtime.consolidate import consolidate as consolidate_checkpoints

    if weights and len(weights) != len(ckpts):
        raise InputError(f"{len(weights)} weights for {len(ckpts)} checkpoints", place="--weights",
                         hint="give one --weights per checkpoint, or none")
    env = os.environ
    result = consolidate_checkpoints(out, ckpts, list(weights) or None, progress_dir=env.get("SLURMHET_PROGRESS_DIR"),
                                     job_id=env.get("SLURMHET_JOB_ID"), skip_bad=skip_bad)
    click.echo(result.summary())
