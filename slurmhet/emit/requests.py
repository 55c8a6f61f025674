"""Submission requests: one dataclass per Slurm form, each with a pure ``materialize()``.

``materialize()`` returns the sbatch argv (options only; the script goes on
stdin) and the script text. Options live on the command line, not in ``#SBATCH``
lines, so no spec value is ever parsed by sbatch's script reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slurmhet.emit.render import render, slurm_job_name
from slurmhet.errors import InputError

GPU_REQUEST_STYLES = ("gres", "gpus-per-node")


@dataclass(frozen=True)
class Materialized:
    argv: tuple[str, ...]
    script: str

    def sbatch_argv(self) -> list[str]:
        return ["sbatch", "--parsable", *self.argv]


@dataclass(frozen=True)
class Launch:
    """How the job's program is started inside the allocation."""

    program: tuple[str, ...]  # the user's argv (or the entrypoint runner's)
    launcher: tuple[str, ...]  # e.g. (python, -m, slurmhet, run, --)
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Common:
    """Options every request form shares."""

    job_id: int
    name: str
    log_dir: str
    time_limit_min: int | None = None
    partition: str | None = None
    extra: tuple[tuple[str, str | None], ...] = ()
    signal_s: int = 120

    def options(self) -> list[str]:
        opts = [
            f"--job-name={slurm_job_name(self.name)}",
            f"--comment=slurmhet:{self.job_id}",
            f"--output={self.log_dir}/slurmhet-{self.job_id}-%j.out",
            f"--signal=B:USR2@{self.signal_s}",
        ]
        if self.time_limit_min is not None:
            opts.append(f"--time={self.time_limit_min}")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        opts += [f"--{k}={v}" if v is not None else f"--{k}" for k, v in self.extra]
        return opts


def gpu_option(style: str, gpu_type: str, per_node: int) -> str:
    if style not in GPU_REQUEST_STYLES:
        raise InputError(f"unknown GPU request style {style!r}", place="slurm.gpu_request_style",
                         hint=" | ".join(GPU_REQUEST_STYLES))
    if style == "gres":
        return f"--gres=gpu:{gpu_type}:{per_node}"
    return f"--gpus-per-node={gpu_type}:{per_node}"


@dataclass(frozen=True)
class BatchRequest:
    """A job on one GPU type: ``nodes`` nodes with ``gpus_per_node`` GPUs each, one task per GPU."""

    common: Common
    launch: Launch
    gpu_type: str
    gpus_per_node: int
    nodes: int = 1
    nodelist: tuple[str, ...] = ()
    gpu_request_style: str = "gres"
    shard_weights: tuple[float, ...] = ()
    plan_env: tuple[tuple[str, str], ...] = field(default=())

    def materialize(self) -> Materialized:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise InputError("a batch request needs at least one node and one GPU", place=f"job {self.common.job_id}",
                             hint="check the plan's allocation")
        opts = self.common.options()
        opts += [
            gpu_option(self.gpu_request_style, self.gpu_type, self.gpus_per_node),
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.gpus_per_node}",
        ]
        if self.nodelist:
            opts.append("--nodelist=" + ",".join(self.nodelist))
        tasks = self.nodes * self.gpus_per_node
        weights = self.shard_weights or tuple(1.0 / tasks for _ in range(tasks))
        plan_env = (
            ("SLURMHET_JOB_ID", str(self.common.job_id)),
            ("SLURMHET_SHARD_WEIGHTS", ",".join(f"{w:.6f}" for w in weights)),
            ("SLURMHET_RANK_GPU_TYPES", ",".join([self.gpu_type] * tasks)),
            *self.plan_env,
        )
        script = render(
            "batch.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            gpu_type=self.gpu_type,
            tasks=tasks,
            env=plan_env + self.launch.env,
            launcher=self.launch.launcher,
            program=self.launch.program,
        )
        return Materialized(tuple(opts), script)
