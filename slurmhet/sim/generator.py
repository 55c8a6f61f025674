"""Seeded synthetic traces in the style of Gavel's generator (scheduler/utils.py).

Durations: 60 * 10^U(1.5, 3) s for 80% of jobs, 60 * 10^U(3, 4) s for 20%.
GPU counts: 1/2/4/8 with probabilities 70/10/15/5%. Job types uniformly among
those Gavel measured at that scale (Recommendation, A3C and CycleGAN are single-GPU only).
"""

from __future__ import annotations

import random
from typing import Sequence

from slurmhet.errors import InputError
from slurmhet.sim.traces import TraceJob

_MULTI_GPU_TYPES = tuple(
    [f"ResNet-18 (batch size {b})" for b in (16, 32, 64, 128, 256)]
    + [f"ResNet-50 (batch size {b})" for b in (16, 32, 64, 128)]
    + [f"Transformer (batch size {b})" for b in (16, 32, 64, 128, 256)]
    + [f"LM (batch size {b})" for b in (5, 10, 20, 40, 80)]
)
_SINGLE_GPU_TYPES = tuple([f"Recommendation (batch size {b})" for b in (512, 1024, 2048, 4096, 8192)]
                          + ["A3C", "CycleGAN"])
SCALES = (1, 2, 4, 8)
SCALE_PROBS = (0.70, 0.10, 0.15, 0.05)
ARRIVALS = ("poisson", "zero")


def gavel_job_types(scale: int) -> Sequence[str]:
    """The Gavel job types with a measured throughput at ``scale`` GPUs."""
    return _MULTI_GPU_TYPES + _SINGLE_GPU_TYPES if scale == 1 else _MULTI_GPU_TYPES


def generate_trace(n: int, seed: int, arrivals: str = "poisson", *, mean_interarrival_s: float = 600.0,
                   job_types: Sequence[str] | None = None) -> list[TraceJob]:
    """``n`` jobs with durations (steps are resolved later against the table, at V100 speed).

    ``arrivals`` is ``poisson`` (exponential gaps of mean ``mean_interarrival_s``) or ``zero``.
    ``job_types`` restricts the job types (single-GPU-only types then still get 1 GPU).
    """
    if n <= 0:
        raise InputError("--generate needs a positive job count", place="--generate", hint="e.g. 100")
    if arrivals not in ARRIVALS:
        raise InputError(f"unknown arrival process {arrivals!r}", place="arrivals", hint=f"one of {ARRIVALS}")
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    now = 0.0
    for job_id in range(n):
        if arrivals == "poisson" and job_id > 0:
            now += rng.expovariate(1.0 / mean_interarrival_s)
        low, high = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        duration = 60.0 * 10 ** rng.uniform(low, high)
        scale = rng.choices(SCALES, weights=SCALE_PROBS)[0]
        candidates = [t for t in (job_types or gavel_job_types(scale)) if scale == 1 or t in _MULTI_GPU_TYPES]
        if not candidates:
            scale, candidates = 1, list(job_types or gavel_job_types(1))
        jobs.append(TraceJob(job_id, rng.choice(candidates), scale, now, None, duration))
    return jobs
