"""`slurmhet profile`: a short run of each job on each GPU type, its measured samples/s kept in the store.

A profiling run is an ordinary stored slurmhet job (one GPU of one type, no
co-location, no forking, no checkpoint directory: it must not touch the real
job's checkpoints; no group and no ``after:``, it measures and waits for nobody), so submission, sync, logs and fault handling are the
ones every job has. The launcher stops its command once the progress records
show ``steps`` steps measured (``SLURMHET_PROFILE_STEPS``); the spec's time
limit caps a run that is slower than that. The measured rate is stored as a
``profile`` observation, which every later plan of the workload reads; runtime
progress refines it by EWMA as for any measurement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

from sqlalchemy.orm import Session

from slurmhet.cluster import Inventory
from slurmhet.config import Settings
from slurmhet.errors import InputError
from slurmhet.runtime.progress import ProgressRecord, read_progress
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.profile import SiteProfile
from slurmhet.slurm.runner import SlurmRunner
from slurmhet.spec import GpuRequest, JobSpec
from slurmhet.store import Database, JobState, get_job
from slurmhet.store.models import ThroughputObservation
from slurmhet.throughput import ThroughputTable, canonical_key

#: The stored name of a profiling run: ``<job>.profile-<gpu type>``.
SUFFIX = ".profile-"
DEFAULT_STEPS = 100
DEFAULT_MINUTES = 10


@dataclass(frozen=True)
class ProfileRun:
    """One (job, GPU type) cell to measure, and the spec of the run that measures it."""

    job: str
    gpu_type: str
    spec: JobSpec


def profile_runs(specs: Sequence[JobSpec], cluster_types: Sequence[str], only: Sequence[str] = (),
                 steps: int = DEFAULT_STEPS, minutes: int = DEFAULT_MINUTES,
                 skip: Callable[[JobSpec, str], bool] = lambda spec, gpu: False) -> list[ProfileRun]:
    """One run per job per allowed type the cluster has (``only``: just these types), minus ``skip``ped cells."""
    unknown = [t for t in only if t not in cluster_types]
    if unknown:
        raise InputError(f"GPU type {unknown[0]!r} is not in the cluster", place="--types",
                         hint="the cluster has " + ", ".join(cluster_types))
    runs = []
    seen: set[tuple[str, str]] = set()
    for spec in specs:
        for gpu in spec.gpus.types or cluster_types:
            cell = (canonical_key(spec.workload.key), gpu)
            if gpu not in cluster_types or (only and gpu not in only) or cell in seen or skip(spec, gpu):
                continue
            seen.add(cell)  # two jobs of one workload share its measurement
            runs.append(ProfileRun(spec.name, gpu, replace(
                spec, name=f"{spec.name}{SUFFIX}{gpu}", gpus=GpuRequest(1, 1, (gpu,)), colocate=False,
                sync="allreduce", checkpoint_dir=None, steps=steps, epochs=None, dataset_size=None,
                time_limit_min=minutes, profile_steps=steps, group=None, after=())))  # not of the job's group;
                # a measurement waits for nobody
    return runs


def measured(records: Iterable[ProgressRecord], job_ids: Mapping[str, ProfileRun]) -> dict[str, float]:
    """Samples/s each profiling run measured (its last Slurm run's rank 0), by stored job id."""
    best: dict[str, ProgressRecord] = {}
    for record in records:
        if record.job_id in job_ids and record.rank == 0 and record.samples_per_second > 0:
            if record.job_id not in best or record.updated_at > best[record.job_id].updated_at:
                best[record.job_id] = record
    return {job_id: r.samples_per_second for job_id, r in best.items()}


def store_profiles(session: Session, rates: Mapping[str, float], runs: Mapping[str, ProfileRun]) -> None:
    """Each measured rate becomes the (workload, type) cell's stored value, labelled ``profile``."""
    for job_id, rate in rates.items():
        run = runs[job_id]
        cell = (canonical_key(run.spec.workload.key), run.gpu_type)
        obs = session.get(ThroughputObservation, cell)
        if obs is None:
            session.add(ThroughputObservation(workload=cell[0], gpu_type=cell[1], samples_per_s=rate, samples=1,
                                              source="profile"))
        else:
            obs.samples_per_s, obs.samples, obs.source = rate, 1, "profile"


def unmeasured(table: ThroughputTable) -> Callable[[JobSpec, str], bool]:
    """``skip`` for `submit --profile-first`: cells the table already holds a measurement for."""
    def known(spec: JobSpec, gpu: str) -> bool:
        entry = table.entries.get((canonical_key(spec.workload.key), gpu))
        return entry is not None and not entry.is_prior
    return known


@dataclass(frozen=True)
class ProfileRow:
    job: str
    workload: str
    gpu_type: str
    state: str
    samples_per_s: float | None
    ratio: float | None  # to the fastest measured type of the workload
    stored_job_id: int
    slurm_job_ids: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {**self.__dict__, "slurm_job_ids": list(self.slurm_job_ids)}


def rows(runs: Mapping[str, ProfileRun], rates: Mapping[str, float], states: Mapping[str, str],
         slurm_ids: Mapping[str, tuple[str, ...]]) -> list[ProfileRow]:
    """The result table: each cell's rate and its ratio to the workload's fastest measured type."""
    fastest: dict[str, float] = {}
    for job_id, rate in rates.items():
        key = canonical_key(runs[job_id].spec.workload.key)
        fastest[key] = max(fastest.get(key, 0.0), rate)
    out = []
    for job_id, run in sorted(runs.items(), key=lambda kv: (kv[1].job, kv[1].gpu_type)):
        key = canonical_key(run.spec.workload.key)
        rate = rates.get(job_id)
        out.append(ProfileRow(run.job, key, run.gpu_type, states.get(job_id, "?"), rate,
                              rate / fastest[key] if rate else None, int(job_id), slurm_ids.get(job_id, ())))
    return out


def wait_until(done: Callable[[], bool], tick: Callable[[], None], deadline_s: float, poll_s: float = 5.0,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Call ``tick`` (a replan pass) every ``poll_s`` until ``done()``; False when ``deadline_s`` passed first."""
    end = clock() + deadline_s
    while True:
        tick()
        if done():
            return True
        if clock() >= end:
            return False
        sleep(poll_s)


def run_profiles(db: Database, slurm: tuple[SlurmClient, SiteProfile, Settings, SlurmRunner],
                 specs: Sequence[tuple[JobSpec, str]], inventory: Inventory, table: ThroughputTable,
                 only: Sequence[str], steps: int, minutes: int, skip_measured: bool,
                 say: Callable[[str], None]) -> list[ProfileRow]:
    """Submit the profiling runs, drive them with replan passes until they end, store what they measured."""
    from slurmhet.replan import Replanner
    from slurmhet.submission import current_user, submit_new

    client, profile, settings, runner = slurm
    skip = unmeasured(table) if skip_measured else (lambda spec, gpu: False)
    runs = profile_runs([s for s, _ in specs], inventory.usable().gpu_types, only, steps, minutes, skip)
    if not runs:
        return []
    sources = {s.name: src for s, src in specs}
    outcomes = submit_new(db, slurm, [(r.spec, f"profile:{sources[r.job]}") for r in runs], inventory, False)
    by_id = {str(o.job_id): run for o, run in zip(outcomes, runs)}
    replanner = Replanner(db, client, profile, settings, runner, current_user())
    states: dict[str, str] = {}
    slurm_ids: dict[str, tuple[str, ...]] = {}

    def refresh() -> None:
        replanner.run()
        with db.snapshot() as session:
            for job_id in by_id:
                job = get_job(session, int(job_id))
                if job is not None:
                    states[job_id] = job.state.value
                    slurm_ids[job_id] = tuple(sorted({p.slurm_job_id for p in job.slurm_jobs}))
        say(", ".join(f"{r.job}@{r.gpu_type} {states.get(i, '?')}" for i, r in by_id.items()))

    finished = wait_until(lambda: all(JobState(states.get(i, "PENDING")).final for i in by_id), refresh,
                          deadline_s=60.0 * (2 * minutes + 5))
    if not finished:
        say("some runs are still queued; `slurmhet replan` folds their rates in when they run")
    rates = measured(read_progress(settings.progress_dir), by_id)
    with db.transaction() as session:
        store_profiles(session, rates, by_id)
    return rows(by_id, rates, states, slurm_ids)
