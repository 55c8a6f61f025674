"""Where a slurmhet job's output is, Slurm part by Slurm part, and reading it as it grows.

Every emitted script writes its stdout to ``<log_dir>/slurmhet-<id>-<slurm id>.out`` and its
stderr beside it in ``.err`` (arrays: ``<array id>_<task>``; a co-location pack's files carry its
first member's id, and each member's own copies of its output add ``.member-<job id>``; submitit's
entrypoint jobs write ``<slurm id>_<task>_log.out``/``.err`` under the log dir; parts submitted
before slurmhet split the streams have one merged ``.out``).
A requeued run appends to its Slurm job's file; a job moved or resubmitted by
``replan``, a consolidation, a next forked round are new Slurm jobs, so new
files. :func:`log_parts` orders them as they were submitted; it is pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from slurmhet.emit.requests import member_log, option_value


@dataclass(frozen=True)
class PartInfo:
    """What the store knows of one Slurm part (one row per het component or array task)."""

    slurm_job_id: str
    role: str
    submitted_at: datetime
    state: str = ""
    gpu_type: str | None = None
    gpu_count: int = 0
    nodes: str = ""
    array_task: int | None = None
    het_offset: int | None = None
    round: int = 0


@dataclass(frozen=True)
class LogPart:
    """One output file and the header that names its part."""

    slurm_id: str  # "123", or "123_4" for an array task
    path: Path
    header: str
    #: Its stderr file (None: the part has none, its stderr went to ``path``).
    stderr: Path | None = None


_SCRIPT = re.compile(r"^slurmhet-\d+-(?P<sid>\d+)(?:_(?P<task>\d+))?\.(?P<ext>out|err)$")
_MEMBER = re.compile(r"^slurmhet-\d+-(?P<sid>\d+)\.member-(?P<job>\d+)\.(?P<ext>out|err)$")
_SUBMITIT = re.compile(r"^(?P<sid>\d+)_(?P<task>\d+)_log\.(?P<ext>out|err)$")


def _describe(rows: Sequence[PartInfo]) -> str:
    first = rows[0]
    role = first.role + (f", round {first.round}" if first.role in ("array", "consolidation") else "")
    shapes = " + ".join(f"{r.gpu_count}x{r.gpu_type}" + (f" on {r.nodes}" if r.nodes else "")
                        for r in sorted(rows, key=lambda r: r.het_offset or 0) if r.gpu_type)
    state = ",".join(sorted({r.state for r in rows if r.state}))
    return f"{role}" + (f"; {shapes}" if shapes else "") + (f"; {state}" if state else "")


def log_parts(parts: Sequence[PartInfo], files: Iterable[Path], job_id: int | None = None) -> list[LogPart]:
    """The job's output files in submission order, each with a header naming its Slurm part.

    ``files`` is what the log directory holds (any names; others' files are ignored). A part that has
    written nothing yet has no file and is not listed. A pack's part, for job ``job_id``, is that member's
    own files where run-pack wrote them (packs from before it did have only the pack's, shared).
    """
    found: dict[tuple[str, int | None], dict[str, Path]] = {}
    own: dict[str, dict[str, Path]] = {}
    for path in files:
        member = _MEMBER.match(path.name)
        if member is not None:
            if job_id is not None and int(member.group("job")) == job_id:
                own.setdefault(member.group("sid"), {}).setdefault(member.group("ext"), path)
            continue
        script = _SCRIPT.match(path.name)
        match = script or _SUBMITIT.match(path.name)
        if match is None:
            continue
        task = match.group("task") if script else None  # submitit's task index is not an array task
        streams = found.setdefault((match.group("sid"), int(task) if task is not None else None), {})
        streams.setdefault(match.group("ext"), path)
    groups: dict[str, list[PartInfo]] = {}
    for part in parts:
        if part.role != "superseded":
            groups.setdefault(part.slurm_job_id, []).append(part)
    ordered = sorted(groups.items(), key=lambda kv: (min(p.submitted_at for p in kv[1]), _numeric(kv[0])))
    out = []
    for sid, rows in ordered:
        tasks = sorted({r.array_task for r in rows if r.array_task is not None})
        if tasks:
            for task in tasks:
                if (sid, task) in found:
                    mine = [r for r in rows if r.array_task == task]
                    out.append(_part(f"{sid}_{task}", found[(sid, task)], f"Slurm job {sid}_{task} ({_describe(mine)})"))
        elif sid in own or (sid, None) in found:
            streams = {**found.get((sid, None), {}), **own.get(sid, {})}  # its own stream where it has one
            out.append(_part(sid, streams, f"Slurm job {sid} ({_describe(rows)})"))
    return out


def _part(slurm_id: str, streams: dict[str, Path], header: str) -> LogPart:
    err = streams.get("err")
    return LogPart(slurm_id, streams.get("out") or err.with_suffix(".out"), header, err)  # type: ignore[union-attr]


def stderr_file(argv: Sequence[str], slurm_job_id: str, array_task: int | None = None) -> Path | None:
    """Where a part's stderr went: its sbatch ``--error`` pattern with Slurm's ``%j``/``%A``/``%a`` filled in
    (None: a part submitted without one, whose stderr is in its ``.out``)."""
    pattern = option_value(argv, "error")
    if pattern is None:
        return None
    task = "" if array_task is None else str(array_task)
    return Path(pattern.replace("%A", slurm_job_id).replace("%a", task).replace("%j", slurm_job_id))


def own_stderr(path: Path, job_id: int) -> Path:
    """A pack member's own stderr where run-pack wrote one, else ``path`` (the part's, shared by a pack)."""
    mine = Path(member_log(str(path), job_id))
    return mine if mine.exists() else path


def _numeric(slurm_id: str) -> int:
    return int(slurm_id) if slurm_id.isdigit() else 0


def numbered(parts: Sequence[LogPart]) -> list[tuple[int, LogPart]]:
    """1-based positions, as ``--part K`` counts them."""
    return list(enumerate(parts, start=1))


class Tail:
    """Reads each file from where the last read stopped (``--follow``)."""

    def __init__(self) -> None:
        self.offsets: dict[Path, int] = {}

    def seen(self, path: Path) -> bool:
        return path in self.offsets

    def read_new(self, path: Path) -> bytes:
        start = self.offsets.get(path, 0)
        try:
            with path.open("rb") as handle:
                handle.seek(start)
                data = handle.read()
        except FileNotFoundError:
            data = b""
        self.offsets[path] = start + len(data)
        return data
