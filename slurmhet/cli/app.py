"""The `slurmhet` command group and what every command shares: the lazily opened context (settings,
Slurm client, store, site profile), error-to-exit-code mapping, and output helpers. Thin: parse, call, print."""

from __future__ import annotations

import errno
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

from slurmhet import spec as specmod
from slurmhet.cluster import (
    Inventory,
    cluster_option,
    inventory_yaml,
    load_inventory_yaml,
)
from slurmhet.config import Settings, load_settings
from slurmhet.errors import InputError, SlurmhetError
from slurmhet.runtime.progress import atomic_write_text
from slurmhet.slurm import pyslurm_client
from slurmhet.slurm.client import SlurmCli, SlurmClient
from slurmhet.slurm.parsers import SlurmOutputError
from slurmhet.slurm.profile import SiteProfile, load_profile
from slurmhet.slurm.runner import SlurmCommandError, SubprocessRunner
from slurmhet.store import Database

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
        from slurmhet.site_table import live_table, site_table

        url = self.settings.database_url
        if not live and url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
            return site_table(self.settings)
        return live_table(self.settings, self.db)

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


#: What a file system says when it cannot take a write: read-only, full, over quota, not ours.
_UNWRITABLE = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM})


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
        except OSError as exc:
            if exc.errno not in _UNWRITABLE or not exc.filename:
                raise
            # A read-only or full state directory (or log/checkpoint directory): the path, not a traceback.
            err_console.print(f"slurmhet: failure: cannot write {exc.filename}: {exc.strerror} (free space there, or "
                              "make it writable; every write is write-then-rename, so what was there is intact)",
                              markup=False, highlight=False, soft_wrap=True)
            sys.exit(1)


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


def _shell_join(argv: Sequence[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]


def _progress_bar(total_label: str) -> Any:
    """A rich progress bar on a terminal, nothing otherwise (pipes and --json stay clean)."""
    from rich.progress import Progress

    return Progress(console=err_console, transient=True, disable=not err_console.is_terminal)
