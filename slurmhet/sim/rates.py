"""The simulator's job model: worker-steps per second of a job under a placement.

Units follow Gavel: a job of scale ``k`` does ``T(g, k)`` worker-steps/s on ``k``
GPUs of type ``g`` (one server), so one iteration (one task per worker) takes
``tau_g = k / T(g, k)`` seconds. A gang of ``m`` GPUs runs the job's ``k`` tasks:
- ``barrier``: with ``m >= k`` the ``k`` fastest GPUs run one task each and the
  slowest gates the iteration; with ``m < k`` (Hare's relaxed scale-fixed sync)
  tasks run sequentially, list-scheduled on the earliest-free GPU;
- ``proportional``: the global batch is sharded in proportion to speed, so
  the iteration takes ``k / sum_g n_g / tau_g``.
A gang spread over servers adds ring-all-reduce time under contention
(``contention.py``). Forked copies (HadarE) progress at the sum of their rates.
Two single-GPU jobs co-located on one GPU (seed 002) run at Gavel's measured
pair throughputs (the ``[own, partner]`` cells beside ``null``); a source
without a measurement for the pair cannot price it, and the engine refuses it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Mapping, Protocol

from slurmhet.errors import InputError
from slurmhet.policies.base import Gang, Placement
from slurmhet.sim.contention import ContentionModel, gang_servers

MEASURED_SCALES = (1, 2, 4, 8)
DEFAULT_MODEL_GB = 0.1


class ThroughputSource(Protocol):
    """Whole-job worker-steps/s of ``job_type`` at ``scale`` GPUs of ``gpu_type`` (0 = infeasible)."""

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float: ...

    def job_types(self) -> set[str]: ...


class GavelThroughputs:
    """Gavel's simulation_throughputs.json: isolated ("null") throughputs per worker type and scale,
    plus the measured co-located pairs at scale 1 (steps/s of each of the two jobs sharing one GPU)."""

    def __init__(self, table: Mapping[tuple[str, str, int, bool], float],
                 pairs: Mapping[tuple[str, str, str], tuple[float, float]] | None = None) -> None:
        self._table = dict(table)
        self._pairs = dict(pairs or {})

    @classmethod
    def from_json(cls, path: Path | str) -> "GavelThroughputs":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read throughput table: {exc}", place=str(path), hint="Gavel JSON") from exc
        table: dict[tuple[str, str, int, bool], float] = {}
        pairs: dict[tuple[str, str, str], tuple[float, float]] = {}
        for worker, entries in data.items():
            gpu_type, _, suffix = worker.partition("_")
            for key, value in entries.items():
                job_type, scale = ast.literal_eval(key)
                table[(job_type, gpu_type, int(scale), suffix != "unconsolidated")] = float(value.get("null", 0.0))
                if suffix or int(scale) != 1:
                    continue
                for partner, both in value.items():
                    if partner != "null" and isinstance(both, list) and len(both) == 2:
                        other, other_scale = ast.literal_eval(partner)
                        if int(other_scale) == 1:
                            pairs[(job_type, other, gpu_type)] = (float(both[0]), float(both[1]))
        return cls(table, pairs)

    def throughput(self, job_type: str, gpu_type: str, scale: int, consolidated: bool = True) -> float:
        return self._table.get((job_type, gpu_type, scale, consolidated), 0.0)

    def colocated(self, job_type: str, partner: str, gpu_type: str) -> tuple[float, float] | None:
        """Measured (own, partner) steps/s when both share one GPU; None if unmeasured or infeasible (0)."""
        pair = self._pairs.get((job_type, partner, gpu_type))
        return pair if pair and pair[0] > 0 and pair[1] > 0 else None

    def job_types(self) -> set[str]:
        return {k[0] for k in self._table}


class RateModel:
    """Iteration time and rate of gangs; the one job model every policy is measured with."""

    def __init__(self, source: ThroughputSource, contention: ContentionModel | None = None,
                 model_gb: Mapping[str, float] | None = None) -> None:
        self.source = source
        self.contention = contention or ContentionModel()
        self._model_gb = dict(model_gb or {})
        self._tau: dict[tuple[str, int, str], float] = {}

    def task_seconds(self, job_type: str, gpus: int, gpu_type: str) -> float:
        """tau_g: one iteration's task time on ``gpu_type`` (inf where the type cannot run the job)."""
        key = (job_type, gpus, gpu_type)
        if key not in self._tau:
            scale = max([s for s in MEASURED_SCALES if s <= gpus] or [1])
            rate = self.source.throughput(job_type, gpu_type, scale)
            if rate <= 0 and scale > 1:  # e.g. out of memory at this scale: fall back to smaller measurements
                rate = max((self.source.throughput(job_type, gpu_type, s) * scale / s for s in MEASURED_SCALES
                            if s < scale), default=0.0)
            self._tau[key] = scale / rate if rate > 0 else float("inf")
        return self._tau[key]

    def type_rate(self, job_type: str, gpus: int, gpu_type: str) -> float:
        """Worker-steps/s on ``gpus`` GPUs of one type in one server."""
        tau = self.task_seconds(job_type, gpus, gpu_type)
        return gpus / tau if tau != float("inf") else 0.0

    def model_gb(self, job_type: str) -> float:
        """Gradient size; derived from Gavel's consolidated vs unconsolidated 8-GPU V100 gap when absent."""
        if job_type not in self._model_gb:
            cons = self.source.throughput(job_type, "v100", 8, True)
            uncons = self.source.throughput(job_type, "v100", 8, False)
            gap = (8 / uncons - 8 / cons) if cons > 0 and uncons > 0 else 0.0
            bandwidth = self.contention.inter_gbps
            derived = gap * bandwidth / (2 * 7 / 8) if gap > 0 else DEFAULT_MODEL_GB
            self._model_gb[job_type] = max(derived, 0.01)
        return self._model_gb[job_type]

    def iteration_seconds(self, job_type: str, gpus: int, gang: Gang, sharding: str = "barrier",
                          contenders: int = 1) -> float:
        taus = [self.task_seconds(job_type, gpus, t) for _, t, c in gang for _ in range(c)]
        taus = [t for t in taus if t != float("inf")]
        if not taus or len(taus) < sum(c for _, _, c in gang):
            return float("inf")
        if sharding == "proportional":
            compute = gpus / sum(1.0 / t for t in taus)
        elif len(taus) >= gpus:
            compute = sorted(taus)[gpus - 1]
        else:
            free_at = [(0.0, t) for t in taus]
            compute = 0.0
            for _ in range(gpus):  # list scheduling: each task on the GPU that finishes it first
                best = min(free_at, key=lambda f: f[0] + f[1])
                free_at.remove(best)
                done = best[0] + best[1]
                compute = max(compute, done)
                free_at.append((done, best[1]))
        workers = min(len(taus), gpus)
        comm = self.contention.comm_seconds(workers, len(gang_servers(gang)), self.model_gb(job_type), contenders)
        return compute + comm

    def gang_rate(self, job_type: str, gpus: int, gang: Gang, sharding: str = "barrier", contenders: int = 1) -> float:
        seconds = self.iteration_seconds(job_type, gpus, gang, sharding, contenders)
        return gpus / seconds if seconds != float("inf") else 0.0

    def colocated_rates(self, job_types: tuple[str, ...], gpu_type: str) -> tuple[float, ...] | None:
        """Worker-steps/s of each single-GPU job when ``job_types`` share one GPU of ``gpu_type``.

        Only measured pairs are known (the source's ``colocated``); None otherwise.
        """
        measured = getattr(self.source, "colocated", None)
        if len(job_types) != 2 or measured is None:
            return None
        return measured(job_types[0], job_types[1], gpu_type)

    def rate(self, job_type: str, gpus: int, placement: Placement, sharding: str = "barrier") -> float:
        """Uncontended rate of a placement (policies' estimate; the engine adds contention)."""
        return sum(self.gang_rate(job_type, gpus, gang, sharding) for gang in placement)
