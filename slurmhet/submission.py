"""``slurmhet submit``: validate, store, place, emit, record.

Order matters for "no job is lost": jobs are stored (and committed) before sbatch
runs, each Slurm answer is recorded right after, and every Slurm job carries
``--comment=slurmhet:<id>`` so a crash between sbatch and the record is adopted by
the next sync. A refusal leaves the job in SUBMIT_FAILED with Slurm's words.
"""

from __future__ import annotations

import os
import pwd
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from slurmhet.cluster import Inventory
from slurmhet.config import Settings
from slurmhet.emit.requests import BatchRequest, Common, Launch, Materialized
from slurmhet.errors import InputError
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.profile import SiteProfile
from slurmhet.slurm.runner import SlurmCommandError
from slurmhet.spec import JobSpec, check_against_cluster
from slurmhet.store import Database, JobState, SlurmJob, add_event, create_job, get_job


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


@dataclass(frozen=True)
class Placement:
    """Where one job runs when it is on one GPU type."""

    gpu_type: str
    gpus_per_node: int
    nodes: tuple[str, ...]
    shard_weights: tuple[float, ...] = ()


def first_fit(spec: JobSpec, inventory: Inventory) -> Placement:
    """The first allowed type that can hold the job's max (else min) GPUs, packed onto as few nodes as possible."""
    usable = inventory.usable()
    by_type = usable.gpus_by_type()
    for gpu_type in spec.gpus.types or tuple(by_type):
        have = by_type.get(gpu_type, 0)
        if have < spec.gpus.min:
            continue
        want = min(spec.gpus.max, have)
        nodes = sorted((n for n in usable.nodes if n.gpus.get(gpu_type, 0) > 0), key=lambda n: -n.gpus[gpu_type])
        # equal GPUs per node (Slurm's --gpus-per-node is per node): the largest even split that fits
        for count in range(want, spec.gpus.min - 1, -1):
            for n_nodes in range(1, len(nodes) + 1):
                if count % n_nodes == 0 and all(n.gpus[gpu_type] >= count // n_nodes for n in nodes[:n_nodes]):
                    return Placement(gpu_type, count // n_nodes, tuple(n.name for n in nodes[:n_nodes]))
    raise InputError(f"job {spec.name!r}: no allowed GPU type has {spec.gpus.min} usable GPUs",
                     place=spec.place("gpus"), hint="allow more types or lower gpus.min")


def launch_for(spec: JobSpec) -> Launch:
    """The job's program behind slurmhet's launcher, which sets RANK/WORLD_SIZE and the shard plan."""
    return Launch(program=spec.command, launcher=(sys.executable, "-m", "slurmhet", "run", "--"), env=spec.env)


def batch_request(job_id: int, spec: JobSpec, placement: Placement, profile: SiteProfile,
                  settings: Settings, partition: str | None = None) -> BatchRequest:
    return BatchRequest(
        common=Common(job_id=job_id, name=spec.name, log_dir=str(settings.log_dir),
                      time_limit_min=spec.time_limit_min, partition=partition, extra=spec.sbatch),
        launch=launch_for(spec),
        gpu_type=placement.gpu_type,
        gpus_per_node=placement.gpus_per_node,
        nodes=len(placement.nodes),
        nodelist=placement.nodes,
        gpu_request_style=profile.gpu_request_style,
        shard_weights=placement.shard_weights,
    )


@dataclass
class SubmitOutcome:
    job_id: int
    name: str
    state: str
    slurm_job_id: str | None
    gpu_type: str
    gpus: int
    nodes: tuple[str, ...]
    reason: str = ""
    script: str = ""
    argv: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def _submit_entrypoint(job_id: int, spec: JobSpec, placement: Placement, profile: SiteProfile,
                       settings: Settings, client_runner: object) -> str:
    """Python entrypoints go through submitit, so users keep its Job handles and results."""
    from slurmhet.emit.entrypoint import call_entrypoint
    from slurmhet.emit.submitit_executor import RunnerSlurmExecutor

    executor = RunnerSlurmExecutor(settings.state_dir / "submitit" / str(job_id), runner=client_runner)  # type: ignore[arg-type]
    gres_key = "gres" if profile.gpu_request_style == "gres" else "gpus_per_node"
    gres_value = f"gpu:{placement.gpu_type}:{placement.gpus_per_node}" if gres_key == "gres" else f"{placement.gpu_type}:{placement.gpus_per_node}"
    extra = {k.replace("-", "_"): (v if v is not None else True) for k, v in spec.sbatch}
    executor.update_parameters(
        job_name=spec.name[:64], comment=f"slurmhet:{job_id}", time=spec.time_limit_min or 60,
        nodes=len(placement.nodes), ntasks_per_node=1, **{gres_key: gres_value},
        additional_parameters={"nodelist": ",".join(placement.nodes), **extra},
    )
    job = executor.submit(call_entrypoint, spec.entrypoint, list(spec.args), os.getcwd())
    return str(job.job_id)


class Submitter:
    """Submits stored jobs; one instance per command."""

    def __init__(self, db: Database, client: SlurmClient, profile: SiteProfile, settings: Settings,
                 runner: object) -> None:
        self.db, self.client, self.profile, self.settings, self.runner = db, client, profile, settings, runner

    def render(self, job_id: int, spec: JobSpec, placement: Placement) -> Materialized:
        return batch_request(job_id, spec, placement, self.profile, self.settings).materialize()

    def submit_new(self, specs: Sequence[tuple[JobSpec, str]], inventory: Inventory, dry_run: bool) -> list[SubmitOutcome]:
        for spec, _ in specs:
            check_against_cluster(spec, inventory.usable())
        placements = [first_fit(spec, inventory) for spec, _ in specs]
        if dry_run:
            return [self._outcome(0, spec, p, "DRY_RUN", None, rendered=self.render(0, spec, p) if spec.command else None)
                    for (spec, _), p in zip(specs, placements)]
        owner = current_user()
        with self.db.transaction() as session:
            ids = [create_job(session, spec, owner, source).id for spec, source in specs]
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        return [self.submit_one(job_id, spec, p) for job_id, (spec, _), p in zip(ids, specs, placements)]

    def submit_one(self, job_id: int, spec: JobSpec, placement: Placement) -> SubmitOutcome:
        rendered: Materialized | None = None
        try:
            if spec.entrypoint:
                slurm_id = _submit_entrypoint(job_id, spec, placement, self.profile, self.settings, self.runner)
                argv: list[str] = ["submitit", spec.entrypoint]
            else:
                rendered = self.render(job_id, spec, placement)
                slurm_id = self.client.submit(rendered.argv, rendered.script)
                argv = rendered.sbatch_argv()
        except SlurmCommandError as exc:
            with self.db.transaction() as session:
                job = get_job(session, job_id)
                assert job is not None
                job.state, job.reason, job.attempts = JobState.SUBMIT_FAILED, exc.message, job.attempts + 1
                add_event(session, job, "submit_failed", exc.message, argv=exc.argv, returncode=exc.returncode)
            return self._outcome(job_id, spec, placement, "SUBMIT_FAILED", None, reason=exc.message, rendered=rendered)
        with self.db.transaction() as session:
            job = get_job(session, job_id)
            assert job is not None
            job.state, job.reason, job.attempts = JobState.SUBMITTED, "", job.attempts + 1
            job.slurm_jobs.append(SlurmJob(slurm_job_id=slurm_id, role="batch", gpu_type=placement.gpu_type,
                                           gpu_count=placement.gpus_per_node * len(placement.nodes),
                                           nodes=",".join(placement.nodes), state="PENDING", argv=argv))
            add_event(session, job, "submitted", f"Slurm job {slurm_id}", slurm_job_id=slurm_id)
        return self._outcome(job_id, spec, placement, "SUBMITTED", slurm_id, rendered=rendered)

    @staticmethod
    def _outcome(job_id: int, spec: JobSpec, p: Placement, state: str, slurm_id: str | None, reason: str = "",
                 rendered: Materialized | None = None) -> SubmitOutcome:
        return SubmitOutcome(job_id, spec.name, state, slurm_id, p.gpu_type, p.gpus_per_node * len(p.nodes), p.nodes,
                             reason, rendered.script if rendered else "", tuple(rendered.sbatch_argv()) if rendered else ())


def log_path(settings: Settings, job_id: int, slurm_id: str) -> Path:
    return settings.log_dir / f"slurmhet-{job_id}-{slurm_id}.out"
