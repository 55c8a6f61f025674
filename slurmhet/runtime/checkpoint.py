"""Checkpoints (atomic save, weights-only load, validation) and stop-on-signal with requeue.

Format: a dict that ``torch.load(..., weights_only=True)`` accepts, with
``format``, ``model`` (state dict), ``optimizer`` (state dict or None),
``steps`` (the job's cumulative global steps), ``start_steps`` (where this run
or round started) and ``meta`` (plain values). The position is in global steps
(the sampler derives epoch and samples from it), so a checkpoint resumes on
any number of ranks.

Signals. Emitted scripts ask Slurm for ``--signal=B:USR2@N`` (not when the
time limit is N + 60 s or less: the signal could come as the job starts, and
SIGTERM at the limit is then the warning); the launcher forwards it (and
SIGTERM) to the training process. When all ranks have stopped, rank 0
checkpoints atomically and then asks Slurm what it is doing to the job
(``scontrol show job``, parsed by ``slurm.parsers.parse_scontrol_job_stopping``):

- Slurm already requeued the job (its Restarts passed the run's
  SLURM_RESTART_COUNT: ``scontrol requeue``, a PreemptMode=REQUEUE preemption
  past its grace or with none, a pack's other member): the job leaves it at
  that, run once more by Slurm alone, and stops as ``preempted``.
- A preemption (PreemptTime set): ``preempted``. Within GraceTime the job is
  still RUNNING and requeues itself, since 22.05 ends a preempted job that
  exits within its grace without requeueing it. Under PreemptMode=CANCEL past
  its grace, or with none, it is COMPLETING and not requeued: the job requeues
  itself (Slurm accepts that while the job completes, measured on 22.05, 24.11
  and 26.05), or Slurm ends it PREEMPTED and ``failures`` re-plans it.
- Slurm is ending the run otherwise (COMPLETING: ``scancel``): ``cancelled``.
  The job never requeues itself then: a cancelled job stays cancelled.
- Otherwise (only signalled), as in submitit, the time left decides: when
  fewer than ``N + 90`` seconds remain (Slurm may signal up to 60 s early) it
  is a ``timeout``, otherwise a ``preempted`` (asked to vacate). The time left
  comes from ``SLURM_JOB_END_TIME``, else from ``SLURMHET_TIME_LIMIT_S`` and
  the launcher's start time; with neither, SIGUSR2 means timeout and SIGTERM
  preemption. The same rule applies when Slurm cannot be asked.

A preempted job requeues itself, a timed-out one requeues up to
``SLURMHET_MAX_TIMEOUT_REQUEUES`` (default 3) times and otherwise ends cleanly,
leaving the checkpoint and a ``timeout`` progress state. Either run exits 0, so
Slurm calls it COMPLETED; ``sync.settle_stopped`` reads that state and records the
job FAILED at its step (timeout) or re-plans it (a refused requeue).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from slurmhet.errors import InputError, SystemFailure
from slurmhet.runtime.output import say
from slurmhet.runtime.progress import atomic_write
from slurmhet.slurm.parsers import StoppingJob, parse_scontrol_job_stopping

if TYPE_CHECKING:
    import torch

FORMAT = "slurmhet-checkpoint/1"
CHECKPOINT_NAME = "checkpoint.pt"
CONSOLIDATED_NAME = "consolidated.pt"
DEFAULT_SIGNAL_LEAD_S = 120
EARLY_SIGNAL_SLACK_S = 90
DEFAULT_MAX_TIMEOUT_REQUEUES = 3
#: Seconds to wait for ``scontrol show job`` when a run stops.
STOP_QUERY_TIMEOUT_S = 10


@dataclass
class TrainingCheckpoint:
    """What a run needs to continue: model and optimizer state plus its position in global steps."""

    model: dict[str, "torch.Tensor"]
    optimizer: dict[str, Any] | None = None
    steps: int = 0
    start_steps: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "model": self.model, "optimizer": self.optimizer, "steps": self.steps,
                "start_steps": self.start_steps, "meta": self.meta}


def previous_path(path: Path) -> Path:
    """Where the checkpoint before ``path``'s latest is kept: ``checkpoint.prev.pt`` beside ``checkpoint.pt``."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def save_checkpoint(path: str | Path, checkpoint: TrainingCheckpoint) -> Path:
    """Write via a temporary file in the target directory, fsync, then rename: never a torn file. The
    checkpoint it replaces is kept as :func:`previous_path`, so the last two survive a bad write or disk."""
    import torch

    path = Path(path)
    atomic_write(path, lambda handle: torch.save(checkpoint.to_dict(), handle), keep=previous_path(path))
    return path


def _count(data: Mapping[str, Any], key: str, path: Path) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"'{key}' must be a whole number >= 0, got {value!r}", place=f"{path}:{key}",
                         hint="the file is not a slurmhet checkpoint; pass --weights for plain state dicts")
    return value


def check_state_dict(state: Any, path: Path, what: str = "model") -> dict[str, "torch.Tensor"]:
    """A state dict is a mapping of names to finite tensors; anything else is named and refused."""
    import torch

    if not isinstance(state, dict) or not state:
        raise InputError(f"'{what}' is not a non-empty state dict", place=f"{path}:{what}",
                         hint="save model.state_dict() (for DDP: model.module.state_dict())")
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InputError(f"entry {key!r} is not a tensor", place=f"{path}:{what}.{key}",
                             hint="a state dict maps parameter names to tensors")
        if value.is_floating_point() or value.is_complex():
            if not bool(torch.isfinite(value).all()):
                raise InputError(f"tensor {key!r} holds NaN or infinite values", place=f"{path}:{what}.{key}",
                                 hint="the copy diverged or the file is corrupt; leave it out or retrain it")
    return state


def load_checkpoint(path: str | Path) -> TrainingCheckpoint:
    """Load with ``weights_only=True`` (no code runs from the file) and validate it.

    A bare state dict (tensors only) is accepted as a model with zero steps, so
    copies saved by plain torch scripts can be consolidated with explicit weights.
    """
    import torch

    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise InputError("checkpoint not found", place=str(path), hint="check the path") from exc
    except Exception as exc:  # a corrupt file raises whatever its bytes lead torch.load into (struct, zip, pickle)
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot load checkpoint: {cause}", place=str(path),
                         hint="the file is truncated, corrupt, or holds objects other than tensors and plain values")
    if isinstance(data, dict) and "format" in data:
        if data["format"] != FORMAT:
            raise InputError(f"unknown checkpoint format {data['format']!r}", place=f"{path}:format",
                             hint=f"expected {FORMAT}")
        optimizer = data.get("optimizer")
        if optimizer is not None and not isinstance(optimizer, dict):
            raise InputError("'optimizer' is not a state dict", place=f"{path}:optimizer", hint="optimizer.state_dict()")
        meta = data.get("meta") or {}
        if not isinstance(meta, dict):
            raise InputError("'meta' is not a mapping", place=f"{path}:meta", hint="meta holds plain values")
        steps, start = _count(data, "steps", path), _count(data, "start_steps", path)
        if start > steps:
            raise InputError(f"start_steps {start} exceeds steps {steps}", place=f"{path}:start_steps",
                             hint="the file is corrupt")
        return TrainingCheckpoint(model=check_state_dict(data.get("model"), path), optimizer=optimizer, steps=steps,
                                  start_steps=start, meta=meta)
    return TrainingCheckpoint(model=check_state_dict(data, path, what="state_dict"))


def load_latest_good(path: Path, warn: Callable[[str], None] = say) -> tuple[Path, TrainingCheckpoint] | None:
    """The newest of ``path`` and its previous checkpoint that loads; a bad one is skipped with a warning.

    None when neither exists. Both unreadable is an error (exit 2): training from scratch over
    them would silently throw the job's work away.
    """
    failures = []
    for candidate in (path, previous_path(path)):
        if not candidate.is_file():
            continue
        try:
            return candidate, load_checkpoint(candidate)
        except InputError as exc:
            failures.append(exc)
            warn(f"slurmhet: skipping checkpoint {candidate}: {exc.cause}; trying the one before it")
    if failures:
        raise InputError(f"no checkpoint in {path.parent} loads ({len(failures)} tried)", place=str(path),
                         hint=f"{failures[0].cause}; move the files away to start from scratch")
    return None


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    checkpoint: TrainingCheckpoint
    #: Where this run's work starts counting: the round start for a requeued forked copy, else the
    #: checkpoint's step count. Progress aggregation (``progress.job_steps``) relies on it.
    start_steps: int


def choose_resume(checkpoint_dir: str | Path, env: Mapping[str, str]) -> ResumePoint | None:
    """Which checkpoint a (re)started run continues from, and where its own work starts.

    The run's own checkpoint wins while it belongs to the current round, i.e. it
    started at or after the last consolidation (a requeued copy continues its own
    work); otherwise the consolidated model is the newer state. A forked copy
    resuming its own checkpoint stays in its round (its increments add to the
    other copies'); every other resume starts a new stretch at the checkpoint.
    """
    directory = Path(checkpoint_dir)
    own_name = own_checkpoint_name(env)
    own, consolidated = load_latest_good(directory / own_name), load_latest_good(directory / CONSOLIDATED_NAME)
    if own is not None and (consolidated is None or own[1].start_steps >= consolidated[1].steps):
        is_copy = own_name != CHECKPOINT_NAME
        return ResumePoint(own[0], own[1], own[1].start_steps if is_copy else own[1].steps)
    if consolidated is not None:
        return ResumePoint(consolidated[0], consolidated[1], consolidated[1].steps)
    return None


def own_checkpoint_name(env: Mapping[str, str]) -> str:
    """Gang jobs share ``checkpoint.pt``; forked copies write ``copy-<task>.pt``.

    A copy's task number is ``SLURMHET_ARRAY_INDEX``, which only a forked round's array script sets (the
    consolidation's task numbers, also past a chunked array's index restart); a sweep variant that runs
    as an array task is a job of its own and keeps ``checkpoint.pt``.
    """
    task = env.get("SLURMHET_ARRAY_INDEX")
    return f"copy-{task}.pt" if task else CHECKPOINT_NAME


# --------------------------------------------------------------------------- stop on signal


@dataclass
class StopRequest:
    """Set by a signal handler (which does nothing else); the training loop polls ``requested``."""

    signum: int | None = None
    received_at: float | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self, signals: tuple[int, ...] = (signal.SIGUSR2, signal.SIGTERM)) -> None:
        for s in signals:
            signal.signal(s, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is None:  # the first signal decides; SIGTERM after USR2 is Slurm's follow-up
            self.signum, self.received_at = signum, time.time()


def _float(env: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(env[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def classify_stop(signum: int | None, env: Mapping[str, str], now: float) -> str:
    """``"timeout"`` or ``"preempted"`` from the signal and the time left alone (the module docstring's rule).

    ``signum`` is None on a rank that stops because a peer was signalled.
    """
    end = _float(env, "SLURM_JOB_END_TIME")
    if end is None:
        limit = _float(env, "SLURMHET_TIME_LIMIT_S")
        start = _float(env, "SLURM_JOB_START_TIME") or _float(env, "SLURMHET_LAUNCH_TIME")
        end = start + limit if limit is not None and start is not None else None
    if end is None:
        return "timeout" if signum == signal.SIGUSR2 else "preempted"
    lead = _float(env, "SLURMHET_SIGNAL_LEAD_S") or DEFAULT_SIGNAL_LEAD_S
    return "timeout" if end - now <= lead + EARLY_SIGNAL_SLACK_S else "preempted"


def stop_reason(signum: int | None, env: Mapping[str, str], now: float, slurm: StoppingJob | None) -> str:
    """``"cancelled"``, ``"preempted"`` or ``"timeout"``: what Slurm says it is doing first, then the signal.

    ``slurm`` is None when Slurm could not be asked; the signal and the time left then decide alone.
    """
    if slurm is not None and slurm.preempted:
        return "preempted"
    if slurm is not None and slurm.ending:
        return "cancelled"
    return classify_stop(signum, env, now)


def run_restarts(env: Mapping[str, str]) -> int:
    """How many times Slurm had requeued the job when this run started."""
    return int(env.get("SLURM_RESTART_COUNT", "0") or 0)


def should_requeue(reason: str, env: Mapping[str, str]) -> bool:
    """Preemption is never the job's fault: requeue. A timeout requeues a bounded number of times.

    A run Slurm is ending (``cancelled``) never requeues itself: its owner cancelled it, or Slurm requeues it.
    A profiling run (``SLURMHET_PROFILE_STEPS``) never requeues: its launcher stops it with SIGTERM once it
    has measured, and a run stopped early has measured what it could.
    """
    if env.get("SLURMHET_PROFILE_STEPS") or reason == "cancelled":
        return False
    if reason == "preempted":
        return True
    limit = int(env.get("SLURMHET_MAX_TIMEOUT_REQUEUES", DEFAULT_MAX_TIMEOUT_REQUEUES))
    return run_restarts(env) < limit


def requeue_target(env: Mapping[str, str]) -> str:
    """The id ``scontrol requeue`` needs: the array element, or the (het leader's) job id."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    if not env.get("SLURM_JOB_ID"):
        raise SystemFailure("cannot requeue: SLURM_JOB_ID is not set (not running under Slurm)")
    return env["SLURM_JOB_ID"]


def ask_slurm(env: Mapping[str, str]) -> StoppingJob:
    """``scontrol show job`` of this job, through the one Slurm runner: is Slurm ending or preempting it?

    A short timeout: the run is within KillWait (or GraceTime) of its SIGKILL, and the checkpoint is written.
    """
    from slurmhet.slurm.runner import SubprocessRunner

    result = SubprocessRunner(timeout=STOP_QUERY_TIMEOUT_S).run(
        ["scontrol", "show", "job", "--oneliner", requeue_target(env)])
    return parse_scontrol_job_stopping(result.stdout)


def requeue_job(env: Mapping[str, str]) -> None:
    """``scontrol requeue`` this job, through the one Slurm runner (its error carries command and output)."""
    from slurmhet.slurm.runner import SubprocessRunner

    SubprocessRunner(timeout=60).run(["scontrol", "requeue", requeue_target(env)])


@contextmanager
def outliving_sigterm() -> Iterator[None]:
    """Commands started within ignore SIGTERM (an ignored signal stays ignored across exec).

    The stop's ``scontrol`` calls run between Slurm's SIGTERM and KillWait's SIGKILL, and Slurm may send
    SIGTERM again meanwhile (measured on 24.11 with no grace: ``scontrol show job`` exited -15). Only SIGKILL
    should end them. Signal dispositions belong to the main thread; elsewhere this changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class StopOutcome:
    reason: str
    requeued: bool
    detail: str = ""


def handle_stop(stop: StopRequest, *, rank: int, save: Callable[[], object], env: Mapping[str, str],
                requeue: Callable[[Mapping[str, str]], None] = requeue_job,
                slurm: Callable[[Mapping[str, str]], StoppingJob] = ask_slurm,
                now: Callable[[], float] = time.time) -> StopOutcome:
    """After all ranks agreed to stop: rank 0 checkpoints, asks Slurm why, then requeues or lets the job end.

    The checkpoint comes first: a cancelled run has only KillWait left. Ranks other than 0 do not ask
    Slurm (one query per job, not per rank) and report the signal's reason. A failed query or requeue is
    reported, not raised: the checkpoint is safe and the progress state lets the replanner resubmit.
    """
    at = stop.received_at or now()
    if rank != 0:
        return StopOutcome(classify_stop(stop.signum, env, at), False, "rank 0 checkpoints and requeues")
    save()
    if env.get("SLURMHET_PROFILE_STEPS"):
        return StopOutcome(classify_stop(stop.signum, env, at), False, "a profiling run is not requeued")
    unknown = ""
    try:
        with outliving_sigterm():
            view: StoppingJob | None = slurm(env)
    except SystemFailure as exc:
        view, unknown = None, f" (Slurm's view unknown: {exc}; the signal decided)"
    if view is not None and view.requeued_since(run_restarts(env)):
        # The run comes back (a PreemptMode=REQUEUE preemption, a pack's other member, an admin's requeue): it was
        # asked to vacate, not cancelled, though Slurm shows COMPLETING with no PreemptTime.
        return StopOutcome("preempted", False, f"Slurm requeued this run itself (Restarts={view.restarts}): "
                                               "not requeued by the job")
    reason = stop_reason(stop.signum, env, at, view)
    if not should_requeue(reason, env):
        why = f"Slurm is ending this run ({'+'.join(sorted(set(view.states)))}): not requeued by the job" \
            if view is not None and reason == "cancelled" else "timeout requeue limit reached; ending cleanly" + unknown
        return StopOutcome(reason, False, why)
    try:
        with outliving_sigterm():
            requeue(env)
    except SystemFailure as exc:
        return StopOutcome(reason, False, f"requeue failed: {exc}" + unknown)
    return StopOutcome(reason, True, "requeued" + unknown)
