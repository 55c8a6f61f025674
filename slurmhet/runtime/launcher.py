"""``slurmhet run [--] CMD...``: turn a Slurm task's environment into a torch rank and run CMD.

Every emitted script starts training through this launcher, so that
``init_process_group("env://")`` and torchrun-style scripts work unchanged on
plain, multi-node, heterogeneous and array jobs, and so that the plan (shard
weights, GPU type, accumulation steps) reaches the process.

What the launcher relies on in Slurm's environment (checked against task
environments captured on the dev cluster, Slurm 22.05.8; the captures are the
test fixtures in tests/fixtures/slurm-env/):

* A task started by ``srun`` has ``SLURM_STEP_ID``; the batch script itself does
  not (or has the batch step id). Outside a step the launcher is one process:
  rank 0 of 1, unless ``RANK``/``WORLD_SIZE`` are already set (local runs).
* ``srun --het-group=0,1`` starts one step over several components with one
  ``MPI_COMM_WORLD``: ``SLURM_PROCID`` is global and ``SLURM_NTASKS`` counts the
  tasks of all components. ``SLURM_JOB_NODELIST`` is then the sorted union of the
  components' nodes, so rendezvous uses the first host of
  ``SLURM_JOB_NODELIST_HET_GROUP_0`` (where global task 0 runs).
* When the script launches one ``srun --het-group=g`` per component instead, it
  exports ``SLURMHET_HET_GROUP=g``; ``SLURM_PROCID`` is then local to the
  component and the launcher adds the task counts of the earlier components
  (``SLURM_NTASKS_HET_GROUP_<k>``, or ``SLURMHET_HET_GROUP_TASKS=2,1``).
* In a job array every task has its own ``SLURM_JOB_ID``, so the derived
  ``MASTER_PORT`` differs between array tasks sharing a node.
* Node names are assumed to resolve; where they do not (the dev cluster's
  nodes are aliases of localhost), ``SLURMHET_NODE_ADDRS=nodea=127.0.0.1,...``
  maps them to addresses. A step on a single node rendezvous on loopback.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Mapping

from slurmhet.errors import InputError
from slurmhet.runtime.emulation import enabled as emulation_enabled
from slurmhet.runtime.emulation import node_gpu_type
from slurmhet.runtime.hostlist import expand_hostlist
from slurmhet.runtime.output import say
from slurmhet.runtime.progress import STOPPED_STATES, ProgressRecord, progress_path, read_record, write_progress

#: Step ids Slurm gives the batch script and the extern step; neither is an srun task.
_NON_TASK_STEP_IDS = frozenset({"batch", "extern", "4294967294", "4294967295", "4294967291", "4294967292"})
#: Signals forwarded to the child: Slurm's preemption/time-limit signals and the usual terminal ones.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
LOOPBACK = "127.0.0.1"
MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 20000
#: Exit statuses of a run that had already checkpointed and stopped: clean, or killed by Slurm's requeue.
_STOP_KILL_STATUSES = frozenset({0, 128 + signal.SIGTERM, 128 + signal.SIGKILL})
#: A profiling run (``SLURMHET_PROFILE_STEPS``): how often its progress is read, how long TERM may take.
PROFILE_POLL_S = 1.0
PROFILE_STOP_GRACE_S = 30.0
#: Tolerance on the sum of the planned shard weights (the plan prints rounded decimals).
WEIGHT_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class RankEnv:
    """Everything one rank needs to know about itself and its job's plan."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    node: str
    slurm_job_id: str
    job_id: str
    het_group: int | None
    shard_weights: tuple[float, ...]
    gpu_type: str | None
    accumulation_steps: int
    nominal_workers: int | None
    progress_dir: Path
    checkpoint_dir: Path | None

    @property
    def shard_weight(self) -> float:
        return self.shard_weights[self.rank]

    @property
    def progress_file(self) -> Path:
        return progress_path(self.progress_dir, self.job_id, self.slurm_job_id, self.rank)

    def exports(self) -> dict[str, str]:
        """The variables the child gets: torch's ``env://`` set plus slurmhet's plan for this rank."""
        out = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "SLURMHET_JOB_ID": self.job_id,
            "SLURMHET_SHARD_WEIGHT": repr(self.shard_weight),
            "SLURMHET_SHARD_WEIGHTS": ",".join(repr(w) for w in self.shard_weights),
            "SLURMHET_ACCUMULATION_STEPS": str(self.accumulation_steps),
            "SLURMHET_PROGRESS_DIR": str(self.progress_dir),
            "SLURMHET_PROGRESS_FILE": str(self.progress_file),
        }
        if self.gpu_type:
            out["SLURMHET_GPU_TYPE"] = self.gpu_type
        if self.checkpoint_dir is not None:
            out["SLURMHET_CHECKPOINT_DIR"] = str(self.checkpoint_dir)
        return out


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise InputError(f"{name} is not set", place=name, hint="run under srun, or set it")
        return default
    try:
        return int(raw.strip())
    except ValueError as exc:
        raise InputError(f"{name}={raw!r} is not a whole number", place=name, hint=f"{name}=0") from exc


def _in_srun_step(env: Mapping[str, str]) -> bool:
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return bool(env.get("SLURM_JOB_ID")) and step is not None and step.strip() not in _NON_TASK_STEP_IDS


def _het_group_tasks(env: Mapping[str, str], het_size: int) -> list[int] | None:
    """Task count per het component, from Slurm's per-component variables or slurmhet's list."""
    if env.get("SLURMHET_HET_GROUP_TASKS"):
        counts = [int(p) for p in env["SLURMHET_HET_GROUP_TASKS"].split(",") if p.strip()]
    else:
        counts = []
        for k in range(het_size):
            raw = env.get(f"SLURM_NTASKS_HET_GROUP_{k}") or env.get(f"SLURM_STEP_NUM_TASKS_HET_GROUP_{k}")
            if raw is None:
                return None
            counts.append(int(raw))
    if len(counts) != het_size or any(c <= 0 for c in counts):
        raise InputError(f"need {het_size} positive per-component task counts, got {counts}",
                         place="SLURMHET_HET_GROUP_TASKS", hint="e.g. SLURMHET_HET_GROUP_TASKS=2,1")
    return counts


def _first_host(text: str, name: str) -> str:
    hosts = expand_hostlist(text)
    if not hosts:
        raise InputError(f"{name} is empty", place=name, hint="run inside a Slurm allocation")
    return hosts[0]


def _node_addrs(env: Mapping[str, str]) -> dict[str, str]:
    """``SLURMHET_NODE_ADDRS=nodea=127.0.0.1,...`` for sites (like the dev cluster) whose node names do not resolve."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in env.get("SLURMHET_NODE_ADDRS", "").split(",") if p.strip()):
        node, sep, addr = part.partition("=")
        if not sep or not node.strip() or not addr.strip():
            raise InputError(f"bad entry {part!r} in SLURMHET_NODE_ADDRS", place="SLURMHET_NODE_ADDRS",
                             hint="nodea=10.0.0.1,nodeb=10.0.0.2")
        out[node.strip()] = addr.strip()
    return out


def _parse_weights(env: Mapping[str, str], world_size: int) -> tuple[float, ...]:
    raw = env.get("SLURMHET_SHARD_WEIGHTS", "").strip()
    if not raw:
        return tuple(1.0 / world_size for _ in range(world_size))
    try:
        weights = [float(p) for p in raw.split(",")]
    except ValueError as exc:
        raise InputError(f"SLURMHET_SHARD_WEIGHTS={raw!r} is not a list of numbers", place="SLURMHET_SHARD_WEIGHTS",
                         hint="e.g. 0.5,0.3,0.2") from exc
    if len(weights) != world_size:
        raise InputError(f"SLURMHET_SHARD_WEIGHTS has {len(weights)} weights but the job has {world_size} ranks",
                         place="SLURMHET_SHARD_WEIGHTS", hint="one weight per rank, in global rank order")
    if any(not math.isfinite(w) or w < 0 for w in weights) or abs(sum(weights) - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise InputError(f"SLURMHET_SHARD_WEIGHTS={raw!r} must be non-negative and sum to 1",
                         place="SLURMHET_SHARD_WEIGHTS", hint="e.g. 0.5,0.3,0.2")
    total = sum(weights)
    return tuple(w / total for w in weights)


def accumulation_steps(weight: float, nominal_workers: int | None) -> int:
    """Micro-batches this rank runs per step under relaxed scale-fixed sync (Hare 2.2.3).

    The job was sized for ``nominal_workers`` tasks, each with a micro-batch of
    global_batch / nominal_workers. A rank that carries ``weight`` of the global
    batch therefore does the work of ``weight * nominal_workers`` nominal tasks,
    run one after another; the global batch (and convergence) stay as planned.
    """
    if not nominal_workers:
        return 1
    # The tolerance absorbs the plan's rounded weights (0.667 x 3 is 2 micro-batches, not 3).
    return max(1, math.ceil(weight * nominal_workers * (1 - WEIGHT_SUM_TOLERANCE)))


def derive_rank_env(env: Mapping[str, str]) -> RankEnv:
    """Pure: Slurm (or local) environment -> this task's rank, rendezvous and plan."""
    het_size = _int(env, "SLURM_HET_SIZE", 0)
    het_group: int | None = None
    if _in_srun_step(env):
        local_rank = _int(env, "SLURM_LOCALID", 0)
        procid = _int(env, "SLURM_PROCID")
        if het_size > 1:
            counts = _het_group_tasks(env, het_size)
            if env.get("SLURMHET_HET_GROUP"):
                het_group = _int(env, "SLURMHET_HET_GROUP")
                if counts is None or not 0 <= het_group < het_size:
                    raise InputError("a per-component het step needs every component's task count",
                                     place="SLURMHET_HET_GROUP", hint="set SLURMHET_HET_GROUP_TASKS=2,1")
                rank, world_size = sum(counts[:het_group]) + procid, sum(counts)
            else:
                rank, world_size = procid, _int(env, "SLURM_NTASKS")
                if counts is not None and sum(counts) == world_size:
                    het_group = next(g for g in range(het_size) if rank < sum(counts[: g + 1]))
            master_addr = _first_host(env.get("SLURM_JOB_NODELIST_HET_GROUP_0", ""), "SLURM_JOB_NODELIST_HET_GROUP_0")
        else:
            rank = procid
            world_size = _int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1))
            nodelist_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                                 if env.get(v)), "SLURM_JOB_NODELIST")
            hosts = expand_hostlist(env.get(nodelist_var, ""))
            if not hosts:
                raise InputError(f"{nodelist_var} is empty", place=nodelist_var, hint="run inside a Slurm allocation")
            # All ranks on one node: loopback always works, even where node names do not resolve.
            master_addr = hosts[0] if len(hosts) > 1 or hosts[0] in _node_addrs(env) else LOOPBACK
    else:
        rank, world_size = _int(env, "RANK", 0), _int(env, "WORLD_SIZE", 1)
        local_rank = _int(env, "LOCAL_RANK", 0)
        master_addr = env.get("MASTER_ADDR") or LOOPBACK
    master_addr = _node_addrs(env).get(master_addr, master_addr)
    if not 0 <= rank < world_size:
        raise InputError(f"rank {rank} is outside a world of {world_size}", place="SLURM_PROCID",
                         hint="check the step's task counts")

    slurm_job_id = env.get("SLURM_JOB_ID", "") or "local"
    if env.get("MASTER_PORT"):
        master_port = _int(env, "MASTER_PORT")
    elif slurm_job_id.isdigit():
        master_port = MASTER_PORT_BASE + int(slurm_job_id) % MASTER_PORT_SPAN
    else:
        master_port = 29500

    weights = _parse_weights(env, world_size)
    rank_types = [t.strip().lower() for t in env.get("SLURMHET_RANK_GPU_TYPES", "").split(",") if t.strip()]
    if rank_types and len(rank_types) != world_size:
        raise InputError(f"SLURMHET_RANK_GPU_TYPES has {len(rank_types)} entries but the job has {world_size} ranks",
                         place="SLURMHET_RANK_GPU_TYPES", hint="one GPU type per rank, in global rank order")
    gpu_type = rank_types[rank] if rank_types else node_gpu_type(env)
    nominal = _int(env, "SLURMHET_NOMINAL_WORKERS", 0) or None
    if nominal is not None and nominal < 1:
        raise InputError("SLURMHET_NOMINAL_WORKERS must be >= 1", place="SLURMHET_NOMINAL_WORKERS", hint="e.g. 4")

    if env.get("SLURMHET_PROGRESS_DIR"):
        progress_dir = Path(env["SLURMHET_PROGRESS_DIR"])
    elif env.get("SLURMHET_STATE_DIR"):
        progress_dir = Path(env["SLURMHET_STATE_DIR"]) / "progress"
    else:
        progress_dir = Path(env.get("TMPDIR") or tempfile.gettempdir()) / "slurmhet-progress"

    return RankEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        master_addr=master_addr,
        master_port=master_port,
        node=env.get("SLURMD_NODENAME") or socket.gethostname(),
        slurm_job_id=slurm_job_id,
        job_id=env.get("SLURMHET_JOB_ID") or slurm_job_id,
        het_group=het_group,
        shard_weights=weights,
        gpu_type=gpu_type,
        accumulation_steps=accumulation_steps(weights[rank], nominal),
        nominal_workers=nominal,
        progress_dir=progress_dir,
        checkpoint_dir=Path(env["SLURMHET_CHECKPOINT_DIR"]) if env.get("SLURMHET_CHECKPOINT_DIR") else None,
    )


def _exit_status(returncode: int) -> int:
    """Popen's -N for "killed by signal N" becomes the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _initial_record(rank_env: RankEnv, emulated: bool) -> ProgressRecord:
    """A requeued run keeps its previous numbers until the child reports, so progress never goes backwards;
    not its ``started_at``: this run's start-up has not ended yet."""
    previous = read_record(rank_env.progress_file)
    if previous is not None:
        return replace(previous, state="starting", exit_code=None, updated_at=time.time(),
                       gpu_type=rank_env.gpu_type, node=rank_env.node, started_at=None)
    return ProgressRecord(
        job_id=rank_env.job_id, slurm_job_id=rank_env.slurm_job_id, rank=rank_env.rank, gpu_type=rank_env.gpu_type,
        node=rank_env.node, steps_done=0, samples_done=0, samples_per_second=0.0, epoch=0,
        updated_at=time.time(), emulated=emulated, state="starting",
    )


def thread_env(env: Mapping[str, str]) -> dict[str, str]:
    """``OMP_NUM_THREADS`` = the task's CPUs (``SLURM_CPUS_PER_TASK``, Slurm's default 1) unless the user set it.

    As torchrun does: without it every rank starts one OpenMP thread per core of the
    node, and ranks sharing a node spin against each other between steps (on the dev
    cluster a paced rank burnt 5x the CPU with 2 threads instead of 1).
    """
    if env.get("OMP_NUM_THREADS"):
        return {}
    cpus = env.get("SLURM_CPUS_PER_TASK", "").strip()
    return {"OMP_NUM_THREADS": cpus if cpus.isdigit() and int(cpus) > 0 else "1"}


def profiled_enough(record: ProgressRecord | None, steps: int) -> bool:
    """A profiling run has measured once its command reported ``steps`` steps of this run at a real rate."""
    return record is not None and record.samples_per_second > 0 and record.steps_done - record.start_steps >= steps


def _stop_when_profiled(child: subprocess.Popen[bytes], progress_file: Path, steps: int) -> bool:
    """Wait for ``child``; once its progress shows ``steps`` measured steps, stop it (TERM, then KILL after
    PROFILE_STOP_GRACE_S) and return True. False when it ended by itself first."""
    while True:
        try:
            child.wait(timeout=PROFILE_POLL_S)
            return False
        except subprocess.TimeoutExpired:
            pass
        if profiled_enough(read_record(progress_file), steps):
            child.terminate()
            try:
                child.wait(timeout=PROFILE_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            return True


def launch(argv: list[str], env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` as this task's rank; forward signals; keep the progress file; return the exit status."""
    base_env = dict(os.environ if env is None else env)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise InputError("no command to run", place="slurmhet run", hint="slurmhet run -- python train.py")
    rank_env = derive_rank_env(base_env)
    # The launch time lets checkpoint.classify_stop tell a time limit from a preemption.
    child_env = {**base_env, **thread_env(base_env), **rank_env.exports(), "SLURMHET_LAUNCH_TIME": repr(time.time())}
    write_progress(rank_env.progress_file, _initial_record(rank_env, emulation_enabled(base_env)))

    try:
        child = subprocess.Popen(argv, env=child_env)
    except OSError as exc:
        raise InputError(f"cannot start {argv[0]!r}: {exc.strerror or exc}", place="slurmhet run",
                         hint="check the command and PATH") from exc

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    profile_steps = _int(base_env, "SLURMHET_PROFILE_STEPS", 0)
    try:
        profiled = profile_steps > 0 and _stop_when_profiled(child, rank_env.progress_file, profile_steps)
        status = 0 if profiled else _exit_status(child.wait())
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

    last = read_record(rank_env.progress_file) or _initial_record(rank_env, emulation_enabled(base_env))
    stopped_on_purpose = last.state in STOPPED_STATES and status in _STOP_KILL_STATUSES
    if profiled:
        say(f"slurmhet run: profiled {last.steps_done - last.start_steps} steps at {last.samples_per_second:.1f} "
            "samples/s; stopped the command")
        state, code = "done", 0
    elif stopped_on_purpose:
        # The run checkpointed and stopped (and may have asked for a requeue); Slurm's kill that follows
        # (143) is not a failure.
        state, code = last.state, 0
    else:
        state = last.state if last.state in (*STOPPED_STATES, "done") and status == 0 else (
            "done" if status == 0 else "failed")
        code = status
    write_progress(rank_env.progress_file, replace(last, state=state, exit_code=code, updated_at=time.time()))
    if status != 0:
        say(f"slurmhet run: rank {rank_env.rank} command exited with status {status}")
    return status
