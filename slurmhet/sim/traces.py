"""Trace loaders: Gavel's ``.trace`` files and a simple CSV, validated at the edge.

Every bad row raises ``InputError`` with ``file:line`` so that a user can fix the
trace; a trace that loads is guaranteed to be finite, positive and ordered in time.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Collection, Iterable

from slurmhet.errors import InputError

GAVEL_FIELDS = (
    "job_type", "command", "working_dir", "num_steps_arg", "needs_data_dir",
    "total_steps", "scale_factor", "priority_weight", "SLO", "arrival_time",
)


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. ``total_steps`` is None until resolved from ``duration_s``."""

    job_id: int
    job_type: str
    gpus: int
    arrival: float
    total_steps: float | None = None
    duration_s: float | None = None
    weight: float = 1.0
    slo_s: float | None = None
    #: Where the job was read (``file:line``), so an error about it points there; "" for a generated job.
    source: str = field(default="", compare=False)

    @property
    def place(self) -> str:
        return self.source or f"job {self.job_id}"


def _number(text: str, name: str, place: str, *, integer: bool = False, minimum: float | None = None,
            strict: bool = False) -> float:
    """Parse one numeric field; NaN, inf, non-numbers and out-of-range values are refused."""
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{name} {text!r} is not a number", place=place, hint=f"write a number for {name}") from None
    if not math.isfinite(value):
        raise InputError(f"{name} is {text!r}", place=place, hint=f"{name} must be a finite number")
    if integer and value != int(value):
        raise InputError(f"{name} {text!r} is not an integer", place=place, hint=f"{name} must be a whole number")
    if minimum is not None and (value < minimum or (strict and value == minimum)):
        rel = ">" if strict else ">="
        raise InputError(f"{name} {text!r} is out of range", place=place, hint=f"{name} must be {rel} {minimum:g}")
    return value


def _check_type(job_type: str, known: Collection[str] | None, place: str) -> None:
    if known is not None and job_type not in known:
        close = sorted(k for k in known if k.split(" ")[0] == job_type.split(" ")[0])[:3]
        raise InputError(f"unknown job type {job_type!r}", place=place,
                         hint=f"one of the throughput table's types, e.g. {close or sorted(known)[:3]}")


def _check_order(jobs: list[TraceJob], arrival: float, place: str) -> None:
    if jobs and arrival < jobs[-1].arrival:
        raise InputError(f"arrival time {arrival:g} is earlier than the previous row's {jobs[-1].arrival:g}",
                         place=place, hint="sort the trace by arrival time")


def load_gavel_trace(path: Path | str, known_types: Collection[str] | None = None) -> list[TraceJob]:
    """Read Gavel's tab-separated 10-field trace; ``known_types`` are the table's job types."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read trace: {exc}", place=str(path), hint="a Gavel .trace file") from exc
    jobs: list[TraceJob] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        place = f"{path}:{number}"
        fields = line.split("\t")
        if len(fields) != len(GAVEL_FIELDS):
            raise InputError(f"expected {len(GAVEL_FIELDS)} tab-separated fields, found {len(fields)}", place=place,
                             hint="fields: " + ", ".join(GAVEL_FIELDS))
        job_type = fields[0].strip()
        _check_type(job_type, known_types, place)
        steps = _number(fields[5], "total_steps", place, minimum=0, strict=True)
        scale = _number(fields[6], "scale_factor", place, integer=True, minimum=1)
        weight = _number(fields[7], "priority_weight", place, minimum=0, strict=True)
        slo = _number(fields[8], "SLO", place)
        arrival = _number(fields[9], "arrival_time", place, minimum=0)
        _check_order(jobs, arrival, place)
        jobs.append(TraceJob(len(jobs), job_type, int(scale), arrival, steps, None, weight, slo if slo > 0 else None,
                             source=place))
    if not jobs:
        raise InputError("trace has no jobs", place=str(path), hint="one job per line")
    return jobs


def load_csv_trace(path: Path | str, known_types: Collection[str] | None = None) -> list[TraceJob]:
    """Read a CSV with header ``submit_time,gpus,workload`` and ``steps`` or ``duration`` (seconds).

    An optional ``weight`` column sets the job weight. Steps win when both are given.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read trace: {exc}", place=str(path), hint="a CSV file") from exc
    reader = csv.DictReader(text.splitlines())
    header = {h.strip() for h in reader.fieldnames or ()}
    missing = {"submit_time", "gpus", "workload"} - header
    if missing or not header & {"steps", "duration"}:
        raise InputError(f"CSV header lacks {sorted(missing) or ['steps or duration']}", place=f"{path}:1",
                         hint="header: submit_time,gpus,workload,steps (or duration)")
    jobs: list[TraceJob] = []
    for row in reader:
        place = f"{path}:{reader.line_num}"
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        job_type = row["workload"]
        if not job_type:
            raise InputError("empty workload", place=place, hint="a job type of the throughput table")
        _check_type(job_type, known_types, place)
        arrival = _number(row["submit_time"], "submit_time", place, minimum=0)
        gpus = _number(row["gpus"], "gpus", place, integer=True, minimum=1)
        steps = _number(row["steps"], "steps", place, minimum=0, strict=True) if row.get("steps") else None
        duration = (_number(row["duration"], "duration", place, minimum=0, strict=True)
                    if steps is None and row.get("duration") else None)
        if steps is None and duration is None:
            raise InputError("row has neither steps nor duration", place=place, hint="fill one of them")
        weight = _number(row["weight"], "weight", place, minimum=0, strict=True) if row.get("weight") else 1.0
        _check_order(jobs, arrival, place)
        jobs.append(TraceJob(len(jobs), job_type, int(gpus), arrival, steps, duration, weight, source=place))
    if not jobs:
        raise InputError("trace has no jobs", place=str(path), hint="one job per row after the header")
    return jobs


def resolve_steps(jobs: Iterable[TraceJob], v100_rate: Callable[[str, int], float]) -> list[TraceJob]:
    """Turn durations into steps as Gavel does: steps = duration x the job's V100 throughput at its scale."""
    out = []
    for job in jobs:
        if job.total_steps is None:
            assert job.duration_s is not None
            rate = v100_rate(job.job_type, job.gpus)
            if rate <= 0:
                raise InputError(f"job {job.job_id} ({job.job_type}, {job.gpus} GPUs) has no V100 throughput",
                                 place=job.place, hint="give steps instead of a duration")
            job = replace(job, total_steps=job.duration_s * rate)
        out.append(job)
    return out
