"""The site profile: what this Slurm can do, probed once and cached.

Probing costs several commands, so the result is cached in the state directory
and re-probed only when slurm.conf changes. Config overrides win over probes.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from slurmhet.config import SlurmOverrides
from slurmhet.runtime.progress import atomic_write_text
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.runner import SlurmCommandError

_UNLIMITED_SUBMIT = 1_000_000


@dataclass(frozen=True)
class SiteProfile:
    slurm_version: str
    accounting: bool
    max_array_size: int
    max_submit_jobs: int
    gpu_request_style: str  # "gres" | "gpus-per-node"
    spank_plugin: bool
    has_mps: bool
    has_shard: bool
    conf_stamp: str = ""
    #: How jobs run container images: "pyxis" (srun --container-image), "apptainer"/"singularity", or "none".
    container_runtime: str = "none"
    #: Whether sacct keeps a job's ``--comment`` (AccountingStoreFlags=job_comment): the tag by which a cut-off
    #: dispatch's job is found once it has left the queue (``sync.ask_slurm``). None: not probed (an older cache).
    job_comments: bool | None = None

    @property
    def major(self) -> int:
        return int(self.slurm_version.split(".")[0])


def slurm_conf_path() -> Path:
    return Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))


def _conf_stamp() -> str:
    try:
        stat = slurm_conf_path().stat()
    except OSError:
        return ""
    return f"{stat.st_mtime_ns}:{stat.st_size}"


def probe(client: SlurmClient) -> SiteProfile:
    """Ask Slurm directly; needs slurmctld up."""
    version = ".".join(map(str, client.version()))
    config = client.config()
    accounting_type = config.get("AccountingStorageType", "accounting_storage/none")
    accounting = accounting_type != "accounting_storage/none"
    if accounting:
        try:
            client.accounting(job_ids=["1"])
        except SlurmCommandError:
            accounting = False
    # Array indices run 0..MaxArraySize-1, so one array holds at most MaxArraySize tasks.
    max_array = int(config.get("MaxArraySize", "1001"))
    nodes = client.nodes()
    style = "gpus-per-node" if "cons_tres" in config.get("SelectType", "") else "gres"
    sbatch_help = client.sbatch_help()
    return SiteProfile(
        slurm_version=version,
        accounting=accounting,
        max_array_size=max(1, max_array),
        max_submit_jobs=_UNLIMITED_SUBMIT,
        gpu_request_style=style,
        spank_plugin="--slurmhet-mps" in sbatch_help,
        container_runtime=container_runtime(sbatch_help),
        has_mps=any(n.mps for n in nodes),
        has_shard=any(n.shards for n in nodes),
        conf_stamp=_conf_stamp(),
        job_comments=accounting and "job_comment" in config.get("AccountingStoreFlags", "").split(","),
    )


def container_runtime(sbatch_help: str) -> str:
    """pyxis when its SPANK options are in ``sbatch --help``, else apptainer/singularity when on PATH, else none."""
    if "--container-image" in sbatch_help:
        return "pyxis"
    return next((name for name in ("apptainer", "singularity") if shutil.which(name)), "none")


def apply_overrides(profile: SiteProfile, overrides: SlurmOverrides) -> SiteProfile:
    changes = {
        "container_runtime": overrides.container_runtime,
        "gpu_request_style": overrides.gpu_request_style,
        "max_array_size": overrides.max_array_size,
        "max_submit_jobs": overrides.max_submit_jobs,
        "accounting": overrides.accounting,
    }
    return replace(profile, **{k: v for k, v in changes.items() if v is not None})


#: What slurmhet renders for when it has never seen the site (planning offline, no cache): a cons_tres
#: Slurm with no SPANK plugin, MPS or shards, and Slurm's default MaxArraySize.
GENERIC = SiteProfile(slurm_version="0", accounting=False, max_array_size=1001, max_submit_jobs=_UNLIMITED_SUBMIT,
                      gpu_request_style="gpus-per-node", spank_plugin=False, has_mps=False, has_shard=False)


def cached_profile(cache: Path, overrides: SlurmOverrides) -> tuple[SiteProfile, bool]:
    """For planning without Slurm: the last probed profile whatever slurm.conf says now, else :data:`GENERIC`;
    and whether it was the cache."""
    try:
        return apply_overrides(SiteProfile(**json.loads(cache.read_text())), overrides), True
    except (OSError, ValueError, TypeError):
        return apply_overrides(GENERIC, overrides), False


def load_profile(client: SlurmClient, cache: Path, overrides: SlurmOverrides, refresh: bool = False) -> SiteProfile:
    """The cached profile when slurm.conf is unchanged, else a fresh probe (then cached)."""
    if not refresh and cache.is_file():
        try:
            cached = SiteProfile(**json.loads(cache.read_text()))
        except (ValueError, TypeError):
            cached = None
        if cached is not None and cached.conf_stamp == _conf_stamp():
            return apply_overrides(cached, overrides)
    profile = probe(client)
    # A temporary file of its own: concurrent commands probing at once must not rename each other's.
    atomic_write_text(cache, json.dumps(asdict(profile), indent=1))
    return apply_overrides(profile, overrides)
