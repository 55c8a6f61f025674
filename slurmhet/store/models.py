"""SQLAlchemy 2 models: slurmhet jobs, the Slurm jobs each maps to, and an event log."""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect, Enum, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class UtcDateTime(TypeDecorator[datetime]):
    """A UTC instant that comes back aware on every backend.

    SQLite drops the offset and returns naive values while Slurm's times arrive aware: a part
    read back from SQLite beside one just refreshed from squeue made `min(starts)` raise.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _as_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _as_utc(value)


class Base(DeclarativeBase):
    pass


class JobState(str, enum.Enum):
    """A slurmhet job's life; SUBMIT_FAILED keeps Slurm's refusal and is retried by replan."""

    PENDING = "PENDING"  # stored, not yet (or no longer) submitted
    SUBMITTED = "SUBMITTED"  # Slurm has it, not yet started
    RUNNING = "RUNNING"
    SUBMIT_FAILED = "SUBMIT_FAILED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def final(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    owner: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[JobState] = mapped_column(Enum(JobState, native_enum=False, length=16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    predicted_jct_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)

    slurm_jobs: Mapped[list["SlurmJob"]] = relationship(back_populates="job", cascade="all, delete-orphan",
                                                        order_by="SlurmJob.id")


#: Roles of parts that no longer speak for their job: moved away before they ran, or a failed run retried.
RETIRED_ROLES = frozenset({"superseded", "retried"})


class SlurmJob(Base):
    """One Slurm-side part of a slurmhet job: a batch job, a het component, an array task or a consolidation."""

    __tablename__ = "slurm_jobs"
    __table_args__ = (UniqueConstraint("job_id", "slurm_job_id", "array_task", "het_offset", name="uq_slurm_part"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    slurm_job_id: Mapped[str] = mapped_column(String(32), index=True)
    role: Mapped[str] = mapped_column(String(16), default="batch")  # batch|het|array|consolidation|pack|sweep|adopted|superseded|retried
    round: Mapped[int] = mapped_column(Integer, default=0)
    array_task: Mapped[int | None] = mapped_column(Integer, nullable=True)
    het_offset: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    nodes: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(32), default="PENDING")
    reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[str | None] = mapped_column(String(16), nullable=True)
    alloc_tres: Mapped[str] = mapped_column(Text, default="")
    submitted_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    argv: Mapped[list[str]] = mapped_column(JSON, default=list)
    #: Seconds from this Slurm job's start to its job's first progress, once folded into StartupObservation.
    startup_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Times Slurm requeued this part under its own id (preempted, its node failed), as squeue last said.
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    job: Mapped[Job] = relationship(back_populates="slurm_jobs")

    @property
    def current(self) -> bool:
        """Whether this part is one of the job's current runs: not cancelled by a move, not a failed run retried."""
        return self.role not in RETIRED_ROLES

    @property
    def target(self) -> str:
        """What scancel and squeue take for this part alone: a sweep variant is its task of a shared array."""
        return self.element if self.role == "sweep" else self.slurm_job_id

    @property
    def element(self) -> str:
        """This part's own array element (``N_k``; a forked copy alone), or its job id when it is no array task."""
        return f"{self.slurm_job_id}_{self.array_task}" if self.array_task is not None else self.slurm_job_id


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True, index=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ThroughputObservation(Base):
    """The measured throughput of one (workload, GPU type): ``slurmhet profile``'s short runs ("profile"),
    then refined by EWMA over runtime progress ("ewma", seed 001 III-C)."""

    __tablename__ = "throughput_observations"

    workload: Mapped[str] = mapped_column(String(200), primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(32), primary_key=True)
    samples_per_s: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str] = mapped_column(String(16), default="ewma", server_default="ewma")
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)


class StartupObservation(Base):
    """The EWMA start-up cost of one workload (Slurm start to first progress), learned like its throughput."""

    __tablename__ = "startup_observations"

    workload: Mapped[str] = mapped_column(String(200), primary_key=True)
    seconds: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)


class ProgressMark(Base):
    """The last progress update already folded in, per (job, Slurm job, rank): replan counts each once."""

    __tablename__ = "progress_marks"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    updated_at: Mapped[float] = mapped_column(Float)


class ClusterSnapshot(Base):
    """The inventory the last replan saw, to detect drained/returned nodes and appearing GPU types."""

    __tablename__ = "cluster_snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    taken_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    nodes: Mapped[dict[str, Any]] = mapped_column(JSON)


class StoreMeta(Base):
    """Facts about this store itself, e.g. its instance id (the ``@tag`` in Slurm comments)."""

    __tablename__ = "store_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
