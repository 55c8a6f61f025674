"""The throughput table a live command plans with, built in one place.

Gavel's shipped table < the site table (settings) < what the store measured
(``slurmhet profile`` and runtime EWMA) < nothing else; the specs being planned
add their own rate hints and traits as flagged priors where no cell exists. On
the live path every model is planned: a workload nobody measured gets a
flagged default prior (throughput.py), never a refusal.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from slurmhet.config import Settings
from slurmhet.spec import JobSpec
from slurmhet.store import Database
from slurmhet.store.models import ThroughputObservation
from slurmhet.throughput import ThroughputEntry, ThroughputTable, WorkloadTraits, load_tables

#: How a stored observation is labelled in plans and tables.
_PROVENANCE = {"profile": "slurmhet profile", "ewma": "runtime measurement"}


def site_table(settings: Settings) -> ThroughputTable:
    """Shipped + site table, open to default priors (no store: `plan` offline, `validate`)."""
    return replace(load_tables([settings.throughput_table] if settings.throughput_table else []), default_prior=True)


def learned_table(session: Session, base: ThroughputTable) -> ThroughputTable:
    """``base`` with every stored measurement laid over it."""
    entries = dict(base.entries)
    for obs in session.scalars(select(ThroughputObservation)):
        source = obs.source if obs.source in _PROVENANCE else "ewma"
        entries[(obs.workload, obs.gpu_type)] = ThroughputEntry(obs.samples_per_s, source, _PROVENANCE[source],
                                                                obs.samples)
    return replace(base, entries=entries)


def live_table(settings: Settings, db: Database) -> ThroughputTable:
    """What live commands plan with: :func:`site_table` with the store's measurements laid over it."""
    with db.snapshot() as session:
        return learned_table(session, site_table(settings))


def with_specs(table: ThroughputTable, specs: Iterable[JobSpec]) -> ThroughputTable:
    """The specs' ``samples_per_s_hint`` and precision/intensity, for catalog priors."""
    return table.with_hints(
        (s.workload.key, dict(s.workload.samples_per_s_hint),
         WorkloadTraits(s.workload.precision, s.workload.arithmetic_intensity), f"spec {s.name!r}")
        for s in specs)
