"""Submission requests: one dataclass per Slurm form, each with a pure ``materialize()``.

``materialize()`` returns the sbatch argv (options only; the script goes on
stdin) and the script text. Options live on the command line, not in ``#SBATCH``
lines, so no spec value is ever parsed by sbatch's script reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Sequence

from slurmhet.emit.render import render, slurm_job_name
from slurmhet.errors import InputError

GPU_REQUEST_STYLES = ("gres", "gpus-per-node")
#: Slurm may send a ``--signal`` up to this many seconds before the time it was asked for (sbatch(1)).
SIGNAL_RESOLUTION_S = 60


def option_value(argv: Sequence[str], name: str) -> str | None:
    """The value of sbatch option ``--name=value`` in a materialized (or stored) argv; None when absent."""
    prefix = f"--{name}="
    return next((a.removeprefix(prefix) for a in argv if a.startswith(prefix)), None)


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
    #: Environment modules the script loads before srun (the spec's ``modules:``).
    modules: tuple[str, ...] = ()
    #: Extra srun options (pyxis's ``--container-image``).
    srun_options: tuple[str, ...] = ()

    def script_vars(self) -> dict[str, tuple[str, ...]]:
        """The launch variables every job script template reads, passed the same way by each request form."""
        return {"launcher": self.launcher, "program": self.program, "modules": self.modules,
                "srun_options": self.srun_options}


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
    #: Further slurmhet jobs this Slurm job carries (a pack's other members), so adoption finds them all.
    also: tuple[int, ...] = ()
    #: The site has slurmhet's SPANK plugin (profile.spank_plugin): pass ``--slurmhet-job``.
    spank: bool = False
    #: The store's instance id: job ids are per store, so the tag says whose ids these are.
    store_tag: str = ""
    #: One task per GPU: the spec's CPUs and memory per GPU are per task (``--cpus-per-task``,
    #: ``--mem-per-cpu``), which every GPU request style and every part shape accepts.
    cpus_per_gpu: int | None = None
    mem_per_gpu_mb: int | None = None
    workdir: str | None = None
    #: Slurm jobs this one starts after, each completed successfully (``--dependency=afterok``).
    after_ok: tuple[str, ...] = ()

    @property
    def warned(self) -> bool:
        """Whether Slurm is asked for a time-limit warning: not when the limit is within the lead plus Slurm's
        timer resolution, since the signal could then come as the job starts (before its launcher traps it, it
        kills the task). Such a job gets SIGTERM at its limit, which the runtime also takes for the timeout."""
        return self.time_limit_min is None or self.time_limit_min * 60 > self.signal_s + SIGNAL_RESOLUTION_S

    def log_path(self, ext: str, log_pattern: str = "%j") -> str:
        """Its ``--output`` (``out``) or ``--error`` (``err``) file, Slurm's ``%`` patterns unfilled."""
        return f"{self.log_dir}/slurmhet-{self.job_id}-{log_pattern}.{ext}"

    def options(self, log_pattern: str = "%j") -> list[str]:
        """Shared options; arrays pass ``%A_%a`` so a task's log names its array and index."""
        ids = ",".join(str(i) for i in (self.job_id, *self.also))
        opts = [
            f"--job-name={slurm_job_name(self.name)}",
            f"--comment=slurmhet:{ids}" + (f"@{self.store_tag}" if self.store_tag else ""),
            f"--output={self.log_path('out', log_pattern)}",
            f"--error={self.log_path('err', log_pattern)}",
            *([f"--signal=B:USR2@{self.signal_s}"] if self.warned else []),
            "--open-mode=append",  # a requeued run must not truncate the log of the run it continues
        ]
        if self.time_limit_min is not None:
            opts.append(f"--time={self.time_limit_min}")
        if self.partition:
            opts.append(f"--partition={self.partition}")
        if self.spank:
            opts.append(f"--slurmhet-job={self.job_id}")
        if self.cpus_per_gpu:
            opts.append(f"--cpus-per-task={self.cpus_per_gpu}")
        if self.mem_per_gpu_mb:
            opts.append(f"--mem-per-cpu={-(-self.mem_per_gpu_mb // (self.cpus_per_gpu or 1))}M")
        if self.workdir:
            opts.append(f"--chdir={self.workdir}")
        if self.after_ok:
            opts.append("--dependency=afterok:" + ":".join(self.after_ok))
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
class GpuShape:
    """``nodes`` nodes with ``gpus_per_node`` GPUs of one type each, one task per GPU."""

    gpu_type: str
    gpus_per_node: int
    nodes: int = 1
    nodelist: tuple[str, ...] = ()
    #: A het component's own partition (components of one job may differ); None: the common one.
    partition: str | None = None

    @property
    def tasks(self) -> int:
        return self.nodes * self.gpus_per_node

    def check(self, place: str) -> None:
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise InputError("a request needs at least one node and one GPU", place=place,
                             hint="check the plan's allocation")

    def options(self, style: str) -> list[str]:
        opts = [gpu_option(style, self.gpu_type, self.gpus_per_node), f"--nodes={self.nodes}",
                f"--ntasks-per-node={self.gpus_per_node}"]
        if self.nodelist:
            opts.append("--nodelist=" + ",".join(self.nodelist))
        return opts


def plan_env(job_id: int, weights: tuple[float, ...], rank_types: list[str],
             extra: tuple[tuple[str, str], ...] = ()) -> tuple[tuple[str, str], ...]:
    """The launcher's plan contract: shard weight and GPU type of every rank, in global rank order."""
    tasks = len(rank_types)
    weights = weights or tuple(1.0 / tasks for _ in range(tasks))
    if len(weights) != tasks:
        raise InputError(f"the plan gives {len(weights)} shard weights for {tasks} ranks", place=f"job {job_id}",
                         hint="one weight per planned GPU, in rank order")
    return (
        ("SLURMHET_JOB_ID", str(job_id)),
        ("SLURMHET_SHARD_WEIGHTS", ",".join(f"{w:.6f}" for w in weights)),
        ("SLURMHET_RANK_GPU_TYPES", ",".join(rank_types)),
        *extra,
    )


def _gres_names(option: str) -> list[str]:
    """GRES names in one option: ``--gres=gpu:t4:2,mps:100`` -> [gpu, mps]; ``--gpus*`` count as gpu."""
    name, _, value = option.removeprefix("--").partition("=")
    if name in ("gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket", "G"):
        return ["gpu"]
    if name == "gres":
        return [item.split(":", 1)[0] for item in value.split(",") if item]
    return []


def check_slurm_can(components: list[list[str]]) -> None:
    """Refuse, before sbatch does less clearly, what Slurm cannot run: het arrays, gpu with mps."""
    flat = [o for comp in components for o in comp]
    if len(components) > 1 and any(o == "--array" or o.startswith(("--array=", "-a")) for o in flat):
        raise InputError("a heterogeneous job cannot also be a job array (a Slurm rule)", place="sbatch --array",
                         hint="submit forked copies of a multi-type job as separate heterogeneous jobs")
    names = {n for o in flat for n in _gres_names(o)}
    if {"gpu", "mps"} <= names:
        raise InputError("gpu and mps cannot be requested together in one job (a Slurm rule)", place="sbatch --gres",
                         hint="request whole GPUs (gres/gpu) or an MPS share (gres/mps), not both")


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
        shape = GpuShape(self.gpu_type, self.gpus_per_node, self.nodes, self.nodelist)
        shape.check(f"job {self.common.job_id}")
        opts = self.common.options() + shape.options(self.gpu_request_style)
        check_slurm_can([opts])
        tasks = shape.tasks
        script = render(
            "batch.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            gpu_type=self.gpu_type,
            tasks=tasks,
            env=plan_env(self.common.job_id, self.shard_weights, [self.gpu_type] * tasks, self.plan_env)
            + self.launch.env,
            **self.launch.script_vars(),
        )
        return Materialized(tuple(opts), script)


@dataclass(frozen=True)
class HetJobRequest:
    """A job spread over several GPU types: one component per type, one ``srun --het-group`` step over all.

    Ranks are numbered across components in order (Slurm's ``SLURM_PROCID`` is
    global in a multi-group step), so ``shard_weights`` is in that order too.
    """

    common: Common
    launch: Launch
    components: tuple[GpuShape, ...]
    gpu_request_style: str = "gres"
    shard_weights: tuple[float, ...] = ()
    plan_env: tuple[tuple[str, str], ...] = field(default=())

    def materialize(self) -> Materialized:
        place = f"job {self.common.job_id}"
        if len(self.components) < 2:
            raise InputError("a heterogeneous job needs at least two components", place=place,
                             hint="a job on one GPU type is a BatchRequest")
        for shape in self.components:
            shape.check(place)
        # Options go on argv, components separated by ":" (sbatch's command-line form of "#SBATCH hetjob").
        per_component = [(replace(self.common, partition=c.partition) if c.partition else self.common).options()
                         + c.options(self.gpu_request_style) for c in self.components]
        check_slurm_can(per_component)
        argv: list[str] = []
        for i, opts in enumerate(per_component):
            argv += ([":"] if i else []) + opts
        rank_types = [c.gpu_type for c in self.components for _ in range(c.tasks)]
        script = render(
            "het.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            components=self.components,
            groups=",".join(str(i) for i in range(len(self.components))),
            env=plan_env(self.common.job_id, self.shard_weights, rank_types, self.plan_env) + self.launch.env,
            **self.launch.script_vars(),
        )
        return Materialized(tuple(argv), script)


@dataclass(frozen=True)
class ArrayChunk:
    """One sbatch --array: Slurm indices ``first_index .. first_index+count-1``, task = ``task_offset`` + index."""

    first_index: int
    count: int
    task_offset: int = 0

    @property
    def last_index(self) -> int:
        return self.first_index + self.count - 1


def chunk_array(first_index: int, count: int, max_array_size: int) -> list[ArrayChunk]:
    """Split tasks ``first_index .. first_index+count-1`` into arrays whose indices stay below MaxArraySize.

    Slurm refuses any index >= MaxArraySize, so a range that fits is kept as is
    (forked copies keep their task numbers); otherwise every chunk restarts at
    index 0 and carries the offset that recovers the task number.
    """
    if count < 1 or first_index < 0 or max_array_size < 1:
        raise InputError(f"cannot chunk {count} array task(s) from index {first_index} under MaxArraySize "
                         f"{max_array_size}", place="array", hint="count >= 1, first index >= 0")
    if first_index + count <= max_array_size:
        return [ArrayChunk(first_index, count)]
    return [ArrayChunk(0, min(max_array_size, count - start), first_index + start)
            for start in range(0, count, max_array_size)]


@dataclass(frozen=True)
class ArrayRequest:
    """Forked copies of one job (HadarE) or many identical jobs, as one job array on one GPU shape.

    One Slurm array has one resource shape; copies on different GPU types are
    separate ArrayRequests with disjoint index ranges, so ``SLURM_ARRAY_TASK_ID``
    (which names a copy's checkpoint) stays unique within the round.
    """

    common: Common
    launch: Launch
    shape: GpuShape
    chunk: ArrayChunk
    throttle: int | None = None
    round: int = 0
    gpu_request_style: str = "gres"
    plan_env: tuple[tuple[str, str], ...] = field(default=())

    def chunks(self, max_array_size: int) -> list["ArrayRequest"]:
        return [replace(self, chunk=c)
                for c in chunk_array(self.chunk.first_index + self.chunk.task_offset, self.chunk.count, max_array_size)]

    def array_spec(self) -> str:
        c = self.chunk
        spec = str(c.first_index) if c.count == 1 else f"{c.first_index}-{c.last_index}"
        return spec + (f"%{self.throttle}" if self.throttle else "")

    def materialize(self) -> Materialized:
        place = f"job {self.common.job_id}"
        self.shape.check(place)
        if self.chunk.count < 1 or self.chunk.first_index < 0 or (self.throttle is not None and self.throttle < 1):
            raise InputError(f"bad array {self.array_spec()!r}", place=place, hint="count >= 1, throttle >= 1")
        opts = self.common.options("%A_%a") + self.shape.options(self.gpu_request_style)
        opts.append(f"--array={self.array_spec()}")
        check_slurm_can([opts])
        env = plan_env(self.common.job_id, (), [self.shape.gpu_type] * self.shape.tasks,
                       (("SLURMHET_ROUND", str(self.round)), *self.plan_env))
        script = render(
            "array.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            shape=self.shape,
            round=self.round,
            array=self.array_spec(),
            task_offset=self.chunk.task_offset,
            env=env + self.launch.env,
            **self.launch.script_vars(),
        )
        return Materialized(tuple(opts), script)


@dataclass(frozen=True)
class SweepMember:
    """One sweep variant as an array task: its own slurmhet job, program and environment."""

    job_id: int
    name: str
    program: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SweepArrayRequest:
    """Variants of one sweep that the plan puts on one GPU shape at once, as one job array.

    Task ``i`` runs ``members[i]``, each a slurmhet job of its own (its id in ``SLURMHET_JOB_ID``),
    so one ``sbatch`` and one array in ``squeue`` stand for the sweep instead of N. Unlike forked
    copies, the tasks are not copies of one job: no round, no consolidation, and each task keeps
    its own ``checkpoint.pt`` (``SLURMHET_ARRAY_INDEX``, which names a copy's checkpoint, is not set).
    """

    common: Common
    launch: Launch
    shape: GpuShape
    members: tuple[SweepMember, ...]
    gpu_request_style: str = "gres"

    def array_spec(self) -> str:
        return f"0-{len(self.members) - 1}"

    def task_of(self, job_id: int) -> int:
        return [m.job_id for m in self.members].index(job_id)

    def materialize(self) -> Materialized:
        place = f"job {self.common.job_id}"
        self.shape.check(place)
        if len(self.members) < 2 or self.shape.nodelist or self.shape.nodes != 1:
            raise InputError("a sweep array needs two or more variants on one unpinned node each", place=place,
                             hint="a lone variant is a BatchRequest")
        opts = self.common.options("%A_%a") + self.shape.options(self.gpu_request_style)
        opts.append(f"--array={self.array_spec()}")
        check_slurm_can([opts])
        rank_types = [self.shape.gpu_type] * self.shape.tasks
        members = [(m, plan_env(m.job_id, (), rank_types) + m.env) for m in self.members]
        script = render(
            "sweep.sh.j2",
            ids=",".join(str(m.job_id) for m in self.members),
            name=self.common.name,
            shape=self.shape,
            array=self.array_spec(),
            env=self.launch.env,
            members=members,
            **self.launch.script_vars(),  # each member brings its own program
        )
        return Materialized(tuple(opts), script)


#: Dependency placeholder a dry run prints where the array's job ids will go.
DRY_RUN_DEPENDENCY = "ARRAY_JOB_ID"


@dataclass(frozen=True)
class ConsolidationRequest:
    """Weight-averages a round's copies once their array is over (``afterany``: a failed copy must not block).

    Copies write ``copy-<task>.pt`` into the shared checkpoint directory; the
    average goes to ``consolidated.pt`` there, which the next round resumes
    from. ``then`` (e.g. a replan command) runs afterwards so the next round is planned.
    """

    common: Common
    slurmhet: tuple[str, ...]  # how to run the slurmhet CLI on a compute node, e.g. (python, -m, slurmhet)
    checkpoint_dir: str
    copy_tasks: tuple[int, ...]
    after: tuple[str, ...] = ()
    round: int = 0
    then: tuple[str, ...] = ()
    #: Exported before ``slurmhet consolidate`` (job id and progress dir, so the aggregated steps are recorded).
    env: tuple[tuple[str, str], ...] = ()
    #: A second run of the round's consolidation after a fault (its node failed, it was preempted) ended the first,
    #: perhaps before it wrote the average: the copies are over and their checkpoints kept, so it waits for nothing.
    again: bool = False

    def materialize(self) -> Materialized:
        place = f"job {self.common.job_id}"
        if not (self.after or self.again) or not self.copy_tasks:
            raise InputError("a consolidation needs the round's array job ids and copy tasks", place=place,
                             hint="submit it through MultiPartSubmitter after its array")
        if not self.checkpoint_dir:
            raise InputError("forked copies need a checkpoint_dir to consolidate", place=place,
                             hint="set checkpoint_dir in the job spec")
        after = [f"--dependency=afterany:{':'.join(self.after)}"] if self.after else []
        opts = self.common.options() + [*after, "--nodes=1", "--ntasks=1"]
        check_slurm_can([opts])
        script = render(
            "consolidate.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            round=self.round,
            checkpoint_dir=self.checkpoint_dir,
            copy_tasks=self.copy_tasks,
            slurmhet=self.slurmhet,
            then=self.then,
            env=self.env,
            again=self.again,
        )
        return Materialized(tuple(opts), script)


PACK_SHARING = ("gpu", "mps", "shard")
#: ``--slurmhet-mps`` for an MPS pack: the pack holds its whole share; members split it by thread_percentage.
PACK_MPS_PERCENT = 100


def member_log(path: str, job_id: int) -> str:
    """A pack member's own log file beside the pack's ``path`` (``slurmhet-<pack>-<slurm id>.err`` ->
    ``slurmhet-<pack>-<slurm id>.member-<job id>.err``): run-pack copies each member's output to both."""
    stem, _, ext = path.rpartition(".")
    return f"{stem}.member-{job_id}.{ext}"


@dataclass(frozen=True)
class PackMember:
    """One co-located slurmhet job inside a pack."""

    job_id: int
    name: str
    program: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    thread_percentage: int | None = None


@dataclass(frozen=True)
class PackRequest:
    """Several small jobs sharing one GPU: one allocation, a job-private MPS daemon, members run concurrently.

    ``sharing`` says what is requested: a whole GPU (``gpu``), or ``share_count``
    units of ``gres/mps`` or ``gres/shard`` where the site has them and the
    profile says to use them. The script runs ``slurmhet run-pack`` with the
    member list on stdin (``/dev/stdin``), so no pack file is left behind. Each
    member's output goes to the pack's log files and to its own beside them
    (:func:`member_log`), so its logs and the stderr it is judged on are its own.
    """

    common: Common
    launcher: tuple[str, ...]
    slurmhet: tuple[str, ...]
    gpu_type: str
    members: tuple[PackMember, ...]
    sharing: str = "gpu"
    share_count: int = 1
    nodelist: tuple[str, ...] = ()
    gpu_request_style: str = "gres"

    def gres_option(self) -> str:
        if self.sharing not in PACK_SHARING:
            raise InputError(f"unknown pack sharing {self.sharing!r}", place=f"job {self.common.job_id}",
                             hint=" | ".join(PACK_SHARING))
        if self.sharing == "gpu":
            return gpu_option(self.gpu_request_style, self.gpu_type, 1)
        return f"--gres={self.sharing}:{self.gpu_type}:{self.share_count}"

    def pack_document(self) -> dict[str, object]:
        """The ``run-pack`` input (slurmhet.runtime.mps.load_pack's format)."""
        members = []
        for m in self.members:
            entry: dict[str, object] = {
                "name": f"{m.job_id}-{slurm_job_name(m.name)}",
                "argv": [*self.launcher, *m.program],
                "env": dict(plan_env(m.job_id, (1.0,), [self.gpu_type]) + m.env),
                "stdout": member_log(self.common.log_path("out"), m.job_id),
                "stderr": member_log(self.common.log_path("err"), m.job_id),
            }
            if m.thread_percentage is not None:
                entry["thread_percentage"] = m.thread_percentage
            members.append(entry)
        return {"members": members}

    def materialize(self) -> Materialized:
        if len(self.members) < 2 or self.share_count < 1:
            raise InputError("a pack needs at least two members and a positive share", place=f"job {self.common.job_id}",
                             hint="a lone job is a BatchRequest")
        opts = self.common.options() + [self.gres_option(), "--nodes=1", "--ntasks=1"]
        if self.common.spank and self.sharing == "mps":
            # The plugin makes the job-private MPS directories and daemon; members keep their own percentages.
            opts.append(f"--slurmhet-mps={PACK_MPS_PERCENT}")
        if self.nodelist:
            opts.append("--nodelist=" + ",".join(self.nodelist))
        check_slurm_can([opts])
        script = render(
            "pack.sh.j2",
            job_id=self.common.job_id,
            name=self.common.name,
            gpu_type=self.gpu_type,
            sharing=self.sharing,
            members=self.members,
            pack_json=json.dumps(self.pack_document(), sort_keys=True),
            slurmhet=self.slurmhet,
        )
        return Materialized(tuple(opts), script)
