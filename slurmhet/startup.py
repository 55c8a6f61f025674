"""A job's start-up cost: seconds from its Slurm start to its first progress, learned per workload.

Interpreter, imports, rendezvous and data loading happen on every start and make no
progress; a plan that leaves them out predicts every job short by that much. The
replanner measures each run once (the part's ``started_at`` from Slurm against the
earliest ``ProgressRecord.started_at`` of that Slurm job), folds it by EWMA into
``StartupObservation`` per workload, with the throughput table's alpha, and the
planner charges it to every job it starts (``PlanJob.startup_s``). A workload never
measured gets :data:`STARTUP_PRIOR_S`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from slurmhet.runtime.progress import ProgressRecord
from slurmhet.spec import JobSpec
from slurmhet.store.models import Job, SlurmJob, StartupObservation
from slurmhet.throughput import canonical_key, workload_key

#: Start-up seconds of a workload nothing has measured yet: what the realcluster probe
#: (``bench/realcluster.py run_probe``, bench/README.md "Real cluster") measured per job on
#: the idle dev cluster (2026-11-21; 10.5 s on a loaded day, 2026-11-24), as JCT beyond the
#: emulated run time. That also holds sbatch-to-start and teardown, which this cost does not.
STARTUP_PRIOR_S = 5.5


@dataclass(frozen=True)
class StartupCosts:
    """Start-up seconds per workload (canonical key): the learned EWMA, else ``prior_s``."""

    learned: Mapping[str, float] = field(default_factory=dict)
    prior_s: float = STARTUP_PRIOR_S

    def of(self, workload: str) -> tuple[float, bool]:
        """Seconds for ``workload`` and whether they are the prior."""
        seconds = self.learned.get(canonical_key(workload))
        return (self.prior_s, True) if seconds is None else (seconds, False)

    def for_spec(self, spec: JobSpec) -> tuple[float, bool]:
        """:meth:`of` the spec's workload, keyed as ``plan_job_from_spec`` keys it."""
        return self.of(workload_key(spec.workload.model, spec.workload.batch_size))


def learned_startup(session: Session, prior_s: float = STARTUP_PRIOR_S) -> StartupCosts:
    """Every stored start-up estimate, with ``prior_s`` for the workloads without one."""
    return StartupCosts({o.workload: o.seconds for o in session.scalars(select(StartupObservation))}, prior_s)


def _utc_seconds(value: datetime) -> float:
    """Epoch seconds of a store time; SQLite gives them back naive, in UTC."""
    return (value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value).timestamp()


def fold_startup(session: Session, jobs: Sequence[Job], records: Sequence[ProgressRecord],
                 workloads: Mapping[str, str], alpha: float) -> list[tuple[str, float]]:
    """EWMA each new start-up measurement into ``StartupObservation``; returns (workload, seconds) folded.

    One measurement per (job, Slurm job): the earliest ``started_at`` among its ranks' records
    minus the Slurm start of its parts (het components, array tasks: the earliest). A part is
    marked (``SlurmJob.startup_s``) once folded; a negative measurement (a record of an earlier
    run, skewed clocks) is skipped and left for a later record. ``workloads`` maps job id to
    workload as for the throughput table.
    """
    first: dict[tuple[str, str], float] = {}
    for record in records:
        if record.started_at is not None and math.isfinite(record.started_at):
            key = (record.job_id, record.slurm_job_id)
            first[key] = min(first.get(key, math.inf), record.started_at)
    folded = []
    for job in jobs:
        workload = workloads.get(str(job.id))
        parts: dict[str, list[SlurmJob]] = defaultdict(list)
        for part in job.slurm_jobs:
            if part.started_at is not None and part.startup_s is None:
                parts[part.slurm_job_id].append(part)
        for slurm_job_id, group in parts.items():
            began = first.get((str(job.id), slurm_job_id))
            if workload is None or began is None:
                continue
            seconds = began - min(_utc_seconds(p.started_at) for p in group if p.started_at is not None)
            if seconds < 0:
                continue
            key = canonical_key(workload)
            obs = session.get(StartupObservation, key)
            if obs is None:
                session.add(StartupObservation(workload=key, seconds=seconds, samples=1))
            else:
                obs.seconds, obs.samples = alpha * seconds + (1 - alpha) * obs.seconds, obs.samples + 1
            session.flush()
            for part in group:
                part.startup_s = seconds
            folded.append((key, seconds))
    return folded
