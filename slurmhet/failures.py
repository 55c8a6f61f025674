"""What a failed run means for its job: retry, re-plan off a GPU type that ran out of memory, or fail (pure).

A job that fails in its first minutes (a bad command, an import error, a missing
file) fails again the same way, so slurmhet retries such a crash once, then leaves
the job FAILED with the exit code and the tail of its stderr instead of resubmitting
it forever. Running out of GPU memory is a fact about the GPU type, not the job:
that type and every allowed type with no more memory become unusable for this job,
which is re-planned on the others (a type with more memory), and fails only when
none is left. A lost node (NODE_FAIL) is no fault of the job, nor is a preemption
that ended it for good (PREEMPTED: PreemptMode=CANCEL, or a requeue the job could not
make): either is re-planned and resumes from its checkpoint. A run that fails later,
for its own reason, stays FAILED.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

#: A run that fails within this many seconds of its start failed at start-up.
QUICK_FAILURE_S = 300.0
#: Quick failures a job may have; the last one leaves it FAILED.
MAX_QUICK_FAILURES = 2
#: Lines of stderr kept with a failure and shown by ``status ID``.
STDERR_TAIL_LINES = 20
#: What CUDA, PyTorch and ROCm print when a device runs out of memory.
GPU_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|HIP out of memory"
                     r"|hipErrorOutOfMemory|CUBLAS_STATUS_ALLOC_FAILED")


@dataclass(frozen=True)
class FailedRun:
    """One failed run of a job, as Slurm and its stderr tell it."""

    slurm_state: str  # sacct's state of the failed part: FAILED, NODE_FAIL, OUT_OF_MEMORY, ...
    exit_code: str
    ran_s: float | None  # None: it never started (or the start is unknown)
    gpu_types: tuple[str, ...]  # the types it ran on
    stderr_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """``retry``: back to the queue (re-planned; resumes from its checkpoint); ``fail``: FAILED for good."""

    action: str
    reason: str
    #: Types this job may no longer use (all of them, the earlier ones included).
    unusable: tuple[str, ...] = ()
    quick: bool = False


def judge(run: FailedRun, earlier_quick: int, unusable: Sequence[str], allowed: Sequence[str],
          memory_gb: Callable[[str], float | None]) -> Verdict:
    """The verdict on ``run``; ``earlier_quick``: the job's quick failures before it; ``allowed``: the types
    its spec allows (or the cluster has); ``memory_gb``: a type's memory per GPU (None: unknown)."""
    exit_text = f"exit {run.exit_code}" if run.exit_code else run.slurm_state
    states = set(run.slurm_state.split(","))
    if "NODE_FAIL" in states:
        return Verdict("retry", f"its node failed under it ({exit_text}); re-planned, resumes from its checkpoint",
                       tuple(unusable))
    if "PREEMPTED" in states:
        return Verdict("retry", "a higher-priority job preempted it and Slurm did not requeue it (PREEMPTED); "
                                "re-planned, resumes from its checkpoint", tuple(unusable))
    if any(GPU_OOM.search(line) for line in run.stderr_tail) and run.gpu_types:
        known = [m for m in (memory_gb(t) for t in run.gpu_types) if m is not None]
        ceiling = max(known) if len(known) == len(run.gpu_types) else None
        gone = set(unusable) | set(run.gpu_types)
        if ceiling is not None:  # no more memory than what ran out: as unusable as the type that did
            gone |= {t for t in allowed if (m := memory_gb(t)) is not None and m <= ceiling}
        left = [t for t in allowed if t not in gone]
        ran_out = "/".join(run.gpu_types) + (f" ({ceiling:g} GB)" if ceiling is not None else "")
        if left:
            return Verdict("retry", f"GPU out of memory on {ran_out}; re-planned on {', '.join(left)}",
                           tuple(sorted(gone)))
        return Verdict("fail", f"GPU out of memory on {ran_out} and no allowed type has more memory "
                               f"({exit_text})", tuple(sorted(gone)))
    quick = run.ran_s is not None and run.ran_s < QUICK_FAILURE_S
    if not quick:
        return Verdict("fail", f"failed ({exit_text})", tuple(unusable))
    count = earlier_quick + 1
    if count < MAX_QUICK_FAILURES:
        return Verdict("retry", f"failed {run.ran_s:.0f} s after it started ({exit_text}); retried once",
                       tuple(unusable), quick=True)
    return Verdict("fail", f"failed {count} times within {QUICK_FAILURE_S / 60:.0f} min of starting "
                           f"({exit_text}); not retried: see `slurmhet status ID` for its stderr",
                   tuple(unusable), quick=True)


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` non-empty lines of ``text``."""
    return tuple(line for line in text.splitlines() if line.strip())[-lines:]
