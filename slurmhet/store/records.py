"""Small typed queries over the models, so commands never hand-write SQL."""

from __future__ import annotations

from typing import Any, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from slurmhet.spec import JobSpec
from slurmhet.store.models import Event, Job, JobState


def create_job(session: Session, spec: JobSpec, owner: str, source: str) -> Job:
    job = Job(name=spec.name, owner=owner, spec=spec.to_dict(), source=source, state=JobState.PENDING, reason="")
    session.add(job)
    session.flush()
    add_event(session, job, "stored", f"stored from {source}")
    return job


def add_event(session: Session, job: Job | None, kind: str, message: str = "", **data: Any) -> Event:
    event = Event(job_id=job.id if job is not None else None, kind=kind, message=message, data=data)
    session.add(event)
    return event


def get_job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id, options=[selectinload(Job.slurm_jobs)])


def list_jobs(session: Session, owner: str | None = None, states: Iterable[JobState] | None = None) -> list[Job]:
    query = select(Job).options(selectinload(Job.slurm_jobs)).order_by(Job.id)
    if owner is not None:
        query = query.where(Job.owner == owner)
    if states is not None:
        query = query.where(Job.state.in_(list(states)))
    return list(session.scalars(query))
