"""Progress files: what each rank has done, for the replanner and the report.

One JSON file per (slurmhet job, Slurm job, rank), written atomically (temporary
file + rename) so a reader never sees half a record. ``steps_done`` is the job's
cumulative step count as this run sees it; ``start_steps`` is where the run
started (the checkpoint it resumed from), and ``saved_steps`` the step of the
last checkpoint the run saved, where the next run resumes after a fault. Forked
copies of one round share ``start_steps``, which is how ``job_steps`` aggregates
their work (HadarE V-B).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping

#: States of a run that checkpointed and stopped on a signal (runtime/checkpoint.stop_reason says which).
STOPPED_STATES = ("preempted", "timeout", "cancelled")
#: Run states a record can carry.
STATES = ("starting", "running", "done", "failed", *STOPPED_STATES)


@dataclass(frozen=True)
class ProgressRecord:
    """One rank's view of its job's progress.

    ``steps_done``/``samples_done``/``epoch`` are the job's (global batches);
    ``samples_per_second`` is what *this rank's GPU* delivered on its own share
    (measured; paced when ``emulated``), i.e. the per-type throughput sample the
    replanner's table wants. ``started_at`` is when this run's reporter began (wall
    clock): the end of its start-up (interpreter, imports, rendezvous, data loading),
    which the replanner measures from the Slurm job's start. ``saved_steps`` is the
    job's step count in the last checkpoint this run saved (``start_steps`` until it
    saves one: it resumed from there); None where this rank does not save, or the
    command does not say (then the steps reached stand in for it).
    """

    job_id: str
    slurm_job_id: str
    rank: int
    gpu_type: str | None
    node: str
    steps_done: int
    samples_done: int
    samples_per_second: float
    epoch: int
    updated_at: float
    emulated: bool
    state: str = "running"
    start_steps: int = 0
    exit_code: int | None = None
    started_at: float | None = None
    saved_steps: int | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "ProgressRecord":
        """Build a record from parsed JSON; raises ValueError/TypeError on a malformed one."""
        known = {f.name for f in fields(cls)}
        record = cls(**{k: v for k, v in data.items() if k in known})
        if not isinstance(record.rank, int) or not isinstance(record.steps_done, int):
            raise TypeError("rank and steps_done must be integers")
        if record.saved_steps is not None and (not isinstance(record.saved_steps, int) or record.saved_steps < 0):
            raise TypeError("saved_steps must be a non-negative integer or null")
        if record.state not in STATES:
            raise ValueError(f"unknown state {record.state!r}")
        return record


def progress_path(directory: Path, job_id: str, slurm_job_id: str, rank: int) -> Path:
    return Path(directory) / f"{job_id}.{slurm_job_id}.{rank}.json"


def atomic_write(path: Path, write: Callable[[BinaryIO], object], keep: Path | None = None) -> None:
    """Write through ``write`` into a temporary file beside ``path``, fsync, then ``os.replace``: never a torn file.

    ``keep``: where the file being replaced goes first (the previous checkpoint), once the new one is on disk.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if keep is not None and path.exists():
            os.replace(path, keep)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def write_progress(path: Path, record: ProgressRecord) -> None:
    atomic_write_text(path, record.to_json() + "\n")


def read_record(path: Path) -> ProgressRecord | None:
    """One record, or None when the file is missing or not a progress record."""
    try:
        return ProgressRecord.from_mapping(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def read_progress(directory: str | Path, job_id: str | None = None) -> list[ProgressRecord]:
    """All readable records in ``directory`` (sorted by job, Slurm job, rank); only ``job_id``'s when given.

    Foreign or malformed files are skipped with a note on stderr rather than
    failing: the replanner must keep planning when one job wrote garbage.
    """
    base = Path(directory)
    if not base.is_dir():
        return []
    records = []
    for path in sorted(base.glob("*.json" if job_id is None else f"{job_id}.*.json")):
        record = read_record(path)
        if record is None:
            print(f"slurmhet: skipping unreadable progress file {path}", file=sys.stderr)
            continue
        records.append(record)
    return sorted(records, key=lambda r: (r.job_id, r.slurm_job_id, r.rank))


def is_consolidation(record: ProgressRecord) -> bool:
    """The record ``slurmhet consolidate`` writes for a round: the job's step count in the averaged model."""
    return record.gpu_type is None and not record.node and record.state == "done" \
        and record.start_steps == record.steps_done


def job_steps(records: Iterable[ProgressRecord], *, saved: bool = False) -> dict[str, int]:
    """Cumulative steps per slurmhet job: the steps its runs reached, or with ``saved`` the steps its checkpoints
    hold, where a run started after a fault resumes.

    A run (one Slurm job) counts once, at its furthest rank; with ``saved``, at the furthest checkpoint a rank
    says it saved (its steps reached where no rank says: a command that does not report its saves). Runs that
    started from the same point are forked copies of one round; their increments add up on top of that start.
    The job's progress is the best such total, counting only runs from its latest consolidation on: the averaged
    model holds what the round's copies saved, not the steps a copy made after its last checkpoint before its
    node died (those are lost, and trained again).
    """
    runs: dict[tuple[str, str], ProgressRecord] = {}
    said: dict[tuple[str, str], int] = {}
    for r in records:
        key = (r.job_id, r.slurm_job_id)
        if key not in runs or r.steps_done > runs[key].steps_done:
            runs[key] = r
        if r.saved_steps is not None:
            said[key] = max(said.get(key, 0), min(r.saved_steps, r.steps_done))
    consolidated: dict[str, int] = {}
    for r in runs.values():
        if is_consolidation(r):
            consolidated[r.job_id] = max(consolidated.get(r.job_id, 0), r.steps_done)
    totals: dict[tuple[str, int], int] = {}
    for key, r in runs.items():
        if r.start_steps < consolidated.get(r.job_id, 0):
            continue  # a round already averaged into the consolidation
        steps = said.get(key, r.steps_done) if saved else r.steps_done
        start = (r.job_id, r.start_steps)
        totals[start] = totals.get(start, r.start_steps) + max(0, steps - r.start_steps)
    best: dict[str, int] = {}
    for (job_id, _), total in totals.items():
        best[job_id] = max(best.get(job_id, 0), total)
    return best


def finished_steps(records: Iterable[ProgressRecord]) -> dict[str, int]:
    """Per slurmhet job, the most steps a rank reached and then exited 0 with (state ``done``).

    Evidence that the job's command finished its work, whatever Slurm says of a later run: Slurm 24.11
    and 26.05 may requeue a preempted job once more after it completed, and that run can end FAILED.
    """
    finished: dict[str, int] = {}
    for r in records:
        if r.state == "done" and r.exit_code == 0:
            finished[r.job_id] = max(finished.get(r.job_id, 0), r.steps_done)
    return finished


def stopped_short(records: Iterable[ProgressRecord], total_steps: int) -> ProgressRecord | None:
    """The latest run's rank-0 record when that run checkpointed and stopped on a signal before step
    ``total_steps`` and no run finished the work; else None.

    Such a run exits 0 (its stop was on purpose), so Slurm calls it COMPLETED: this is the work it left.
    """
    runs = [r for r in records if r.rank == 0 and not is_consolidation(r)]
    if not runs or any(r.state == "done" and r.exit_code == 0 and r.steps_done >= total_steps for r in runs):
        return None
    last = max(runs, key=lambda r: r.updated_at)
    return last if last.state in STOPPED_STATES and last.steps_done < total_steps else None


class ProgressReporter:
    """Keeps one rank's record current; writes at most every ``interval_s`` unless forced.

    The rate is measured over the wall time since the reporter was created, so
    it reflects what the GPU (or its emulation) really delivered in this run; that
    moment is the record's ``started_at``, so start-up and work add up to the run.
    """

    def __init__(self, path: Path, base: ProgressRecord, interval_s: float = 2.0) -> None:
        self.path = Path(path)
        self.record = replace(base, started_at=time.time())
        self.interval_s = interval_s
        self._run_start = time.monotonic()
        self._last_write = float("-inf")

    def update(self, *, steps_done: int, samples_done: int, epoch: int, rank_samples: int, state: str = "running",
               force: bool = False) -> None:
        """``rank_samples``: samples this rank itself processed since the run started (for its rate)."""
        elapsed = time.monotonic() - self._run_start
        # A run that did no work yet measured nothing: keep the previous run's rate rather than report 0.
        rate = round(rank_samples / elapsed, 3) if rank_samples > 0 and elapsed > 0 else self.record.samples_per_second
        self.record = replace(self.record, steps_done=steps_done, samples_done=samples_done, epoch=epoch,
                              samples_per_second=rate, updated_at=time.time(), state=state)
        now = time.monotonic()
        if force or state != "running" or now - self._last_write >= self.interval_s:
            write_progress(self.path, self.record)
            self._last_write = now

    def saved(self, steps: int) -> None:
        """Say the run saved a checkpoint at ``steps``, at once: it is where a run after a fault resumes."""
        self.record = replace(self.record, saved_steps=steps, updated_at=time.time())
        write_progress(self.path, self.record)
        self._last_write = time.monotonic()

    def finish(self, state: str, exit_code: int | None = None) -> None:
        self.record = replace(self.record, state=state, exit_code=exit_code, updated_at=time.time())
        write_progress(self.path, self.record)
