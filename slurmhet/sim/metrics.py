"""Metrics the papers judge schedulers by, computed from a ``PolicyRun``.

- avg JCT and total weighted JCT (Hare's objective), both from arrival to finish;
- makespan = TTD (Hadar): first arrival to last finish;
- utilization = GRU (Hadar): allocated GPU-seconds over (GPUs x makespan); with
  single-GPU nodes it equals HadarE's CRU;
- avg queueing delay: arrival to first allocation;
- Jain's index (seed 001, eq. 33) over each job's slowdown JCT / isolated run time,
  the isolated time being the job on its fastest type at its requested size;
- plan_seconds: mean wall-clock seconds per policy decision (plus the max).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from slurmhet.sim.bounds import InstanceBounds
from slurmhet.sim.engine import PolicyRun

METRIC_KEYS = ("avg_jct", "weighted_jct", "makespan", "utilization", "avg_queue", "jain", "plan_seconds")


@dataclass(frozen=True)
class PolicyMetrics:
    avg_jct: float
    weighted_jct: float
    makespan: float
    utilization: float
    avg_queue: float
    jain: float
    plan_seconds: float
    plan_seconds_max: float
    decisions: int
    restarts: int
    jobs: int

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(self).items()}


def jain_index(values: list[float]) -> float:
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def summarize(run: PolicyRun) -> PolicyMetrics:
    records = run.records
    if not records:
        return PolicyMetrics(0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, len(run.plan_seconds), 0, 0)
    jcts = [r.finish - r.arrival for r in records]
    start = min(r.arrival for r in records)
    makespan = max(r.finish for r in records) - start
    busy = sum((end - begin) * gpus for begin, end, gpus in run.busy)
    slowdowns = [jct / r.isolated_s for jct, r in zip(jcts, records) if r.isolated_s > 0]
    return PolicyMetrics(
        avg_jct=sum(jcts) / len(jcts),
        weighted_jct=sum(r.weight * j for r, j in zip(records, jcts)),
        makespan=makespan,
        utilization=busy / (run.total_gpus * makespan) if makespan > 0 else 0.0,
        avg_queue=sum(r.first_start - r.arrival for r in records) / len(records),
        jain=jain_index(slowdowns),
        plan_seconds=sum(run.plan_seconds) / max(1, len(run.plan_seconds)),
        plan_seconds_max=max(run.plan_seconds, default=0.0),
        decisions=len(run.plan_seconds),
        restarts=sum(r.restarts for r in records),
        jobs=len(records),
    )


@dataclass
class SimReport:
    """All policies' metrics of one simulation, plus the raw runs for plots."""

    metrics: dict[str, PolicyMetrics]
    runs: dict[str, PolicyRun] = field(default_factory=dict, repr=False)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Lower bounds valid for every policy of the run (``sim.bounds``), when asked for.
    bound: InstanceBounds | None = None

    def to_json(self, jobs: bool = False) -> dict[str, Any]:
        """Metrics per policy (plus ``ratio_to_bound`` with a bound, and per-job records with ``jobs``)."""
        policies: dict[str, Any] = {}
        for name, m in self.metrics.items():
            row: dict[str, Any] = m.to_json()
            if self.bound is not None:
                row["ratio_to_bound"] = self.bound.ratios(m.avg_jct, m.makespan, m.weighted_jct)
            if jobs and name in self.runs:
                row["jobs"] = [r.to_json() for r in sorted(self.runs[name].records, key=lambda r: r.job_id)]
            policies[name] = row
        out: dict[str, Any] = {"policies": policies}
        if self.bound is not None:
            out["bound"] = self.bound.to_json()
        if self.meta:
            out["meta"] = self.meta
        return out

    def ratios(self, baseline: str = "slurmhet") -> dict[str, dict[str, float | None]]:
        """Each policy's metrics divided by ``baseline``'s (>1 means worse for time metrics); None where
        the baseline's is 0 (e.g. no queueing), which JSON prints as null (NaN is not JSON)."""
        base = self.metrics.get(baseline)
        if base is None:
            return {}
        out = {}
        for name, m in self.metrics.items():
            out[name] = {k: round(getattr(m, k) / getattr(base, k), 4) if getattr(base, k) else None
                         for k in ("avg_jct", "weighted_jct", "makespan", "utilization", "avg_queue")}
        return out
