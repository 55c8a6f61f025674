"""A hand-sized rate table for simulator and time-policy tests."""

from __future__ import annotations

from slurmhet.sim.contention import ContentionModel
from slurmhet.sim.rates import RateModel


class TinyRates:
    """Worker-steps/s per (job type, GPU type), the same at every scale."""

    def __init__(self, table: dict[str, dict[str, float]]) -> None:
        self.table = table

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float:
        return self.table[job_type].get(gpu_type, 0.0) * scale

    def job_types(self) -> set[str]:
        return set(self.table)


def tiny(table: dict[str, dict[str, float]]) -> RateModel:
    """Rates from ``table``, no contention and no gradient traffic, so schedules can be computed by hand."""
    return RateModel(TinyRates(table), ContentionModel(1.0, xi2=0.0), {t: 0.0 for t in table})


class PairRates(TinyRates):
    """TinyRates plus a measured pair: ``x`` and ``y`` at 0.8 steps/s each when sharing a V100."""

    def colocated(self, job_type: str, partner: str, gpu_type: str) -> tuple[float, float] | None:
        return (0.8, 0.8) if {job_type, partner} == {"x", "y"} and gpu_type == "v100" else None
