"""Persistent state: jobs, their Slurm parts, and an event log (SQLite default, PostgreSQL for sites)."""

from slurmhet.store.db import Database
from slurmhet.store.models import Event, Job, JobState, SlurmJob
from slurmhet.store.records import add_event, create_job, get_job, list_jobs

__all__ = ["Database", "Event", "Job", "JobState", "SlurmJob", "add_event", "create_job", "get_job", "list_jobs"]
