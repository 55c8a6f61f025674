"""``slurmhet consolidate``: weight-average forked copies of a job between rounds (HadarE V-B).

HadarE forks a local-SGD job into copies on idle nodes; at the end of a round
the Job Tracker sums the copies' completed steps (aggregation) and
weight-averages their model parameters (consolidation). Rules here:

* Weights default to the steps each copy completed in this round (``steps -
  start_steps``): a copy that trained more counts more. ``--weights`` overrides
  them; either way they are normalised to sum to 1.
* Floating-point tensors are averaged in float64 and cast back. Integer and
  bool tensors (counters such as BatchNorm's ``num_batches_tracked``) cannot be
  averaged meaningfully and are taken from the copy with the most steps.
* Optimizer state is *kept from the copy with the most steps* (ties: the first
  given), not averaged: momentum and Adam moments of diverged copies do not
  describe any trajectory, and step counters would stop being integers. The
  averaged model with that copy's optimizer is what the next round continues.
* Aggregated steps = the round's start + the sum of the copies' increments. The
  copies must share their start (the same consolidated checkpoint).
* Inputs load weights-only and must agree on keys, shapes and dtypes and hold
  finite values; the output is written atomically (temporary file + rename).
* In a job (``--skip-bad``, what the consolidation script runs), a copy that does
  not load or holds non-finite values, and a stale copy left by an earlier round
  (its copy failed this round, or its node did), is left out with a warning; the
  weights of the rest renormalise. One good copy is enough; none is an error.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from slurmhet.errors import InputError
from slurmhet.runtime.checkpoint import TrainingCheckpoint, load_checkpoint, save_checkpoint
from slurmhet.runtime.output import say
from slurmhet.runtime.progress import ProgressRecord, progress_path, write_progress

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ConsolidationResult:
    out: Path
    inputs: tuple[Path, ...]
    weights: tuple[float, ...]
    round_steps: tuple[int, ...]
    start_steps: int
    steps: int
    optimizer_from: Path | None

    def summary(self) -> str:
        parts = ", ".join(f"{p.name} x{w:.4g} ({s} steps)" for p, w, s in zip(self.inputs, self.weights, self.round_steps))
        source = f"; optimizer state from {self.optimizer_from.name}" if self.optimizer_from else ""
        return f"consolidated {len(self.inputs)} copies into {self.out}: {parts}; job at step {self.steps}{source}"


def _normalised(weights: Sequence[float], paths: Sequence[Path], given: bool) -> tuple[float, ...]:
    place = "--weights" if given else "steps"
    if len(weights) != len(paths):
        raise InputError(f"{len(weights)} weights for {len(paths)} checkpoints", place=place,
                         hint="give one weight per checkpoint, in the same order")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise InputError(f"weights {list(weights)} must be finite and >= 0", place=place, hint="e.g. --weights 3 1")
    total = sum(weights)
    if total <= 0:
        hint = "give --weights" if not given else "at least one weight must be > 0"
        raise InputError("the weights sum to zero" + ("" if given else " (no copy completed a step this round)"),
                         place=place, hint=hint)
    return tuple(w / total for w in weights)


def _check_compatible(reference: Mapping[str, "torch.Tensor"], ref_path: Path,
                      other: Mapping[str, "torch.Tensor"], path: Path) -> None:
    missing = [k for k in reference if k not in other]
    if missing:
        raise InputError(f"key {missing[0]!r} is missing (it is in {ref_path.name})", place=f"{path}:model.{missing[0]}",
                         hint="all copies must be the same model")
    extra = [k for k in other if k not in reference]
    if extra:
        raise InputError(f"unexpected key {extra[0]!r} (not in {ref_path.name})", place=f"{path}:model.{extra[0]}",
                         hint="all copies must be the same model")
    for key, tensor in reference.items():
        if other[key].shape != tensor.shape:
            raise InputError(f"shape {tuple(other[key].shape)} of {key!r} differs from {tuple(tensor.shape)} in "
                             f"{ref_path.name}", place=f"{path}:model.{key}", hint="all copies must be the same model")
        if other[key].dtype != tensor.dtype:
            raise InputError(f"dtype {other[key].dtype} of {key!r} differs from {tensor.dtype} in {ref_path.name}",
                             place=f"{path}:model.{key}", hint="save all copies with the same precision")


def average_state_dicts(states: Sequence[Mapping[str, "torch.Tensor"]], weights: Sequence[float],
                        keep_from: int) -> dict[str, "torch.Tensor"]:
    """sum_i w_i * state_i for floating tensors (accumulated in double precision); other tensors from
    ``states[keep_from]``."""
    import torch

    out: dict[str, "torch.Tensor"] = {}
    for key, first in states[0].items():
        if first.is_floating_point() or first.is_complex():
            wide = torch.complex128 if first.is_complex() else torch.float64
            acc = torch.zeros(first.shape, dtype=wide)
            for state, weight in zip(states, weights):
                acc += weight * state[key].to(wide)
            out[key] = acc.to(first.dtype)
        else:
            out[key] = states[keep_from][key].clone()
    return out


def _good_copies(paths: Sequence[Path], warn: Callable[[str], None]) -> tuple[list[Path], list[TrainingCheckpoint]]:
    """The copies that load, of the latest round among them; the others are named in a warning."""
    kept: list[tuple[Path, TrainingCheckpoint]] = []
    for path in paths:
        try:
            kept.append((path, load_checkpoint(path)))
        except InputError as exc:
            warn(f"slurmhet consolidate: leaving out {path}: {exc.cause}")
    if not kept:
        raise InputError(f"none of the {len(paths)} copies loads", place=str(paths[0]),
                         hint="the round's copies all failed; the job resumes from the last consolidated checkpoint")
    latest = max(c.start_steps for _, c in kept)
    for path, c in kept:
        if c.start_steps != latest:
            warn(f"slurmhet consolidate: leaving out {path}: it started at step {c.start_steps}, an earlier round "
                 f"than the others ({latest})")
    good = [(p, c) for p, c in kept if c.start_steps == latest]
    return [p for p, _ in good], [c for _, c in good]


def consolidate(out: str | Path, ckpts: Sequence[str | Path], weights: Sequence[float] | None = None, *,
                progress_dir: str | Path | None = None, job_id: str | None = None,
                slurm_job_id: str = "consolidate", skip_bad: bool = False,
                warn: Callable[[str], None] = say
                ) -> ConsolidationResult:
    """Weight-average the copies' models into ``out``.

    With ``progress_dir`` and ``job_id`` the aggregated step count is also written
    as a progress record (rank 0 of ``slurm_job_id``; samples are not known here).
    ``skip_bad``: leave out copies that do not load or are stale (see the module notes).
    """
    paths = tuple(Path(p) for p in ckpts)
    if not paths:
        raise InputError("no checkpoints given", place="slurmhet consolidate", hint="slurmhet consolidate --out OUT A.pt B.pt")
    seen: set[Path] = set()
    for p in paths:
        if p.resolve() in seen:
            raise InputError("checkpoint given twice", place=str(p), hint="list each copy once")
        seen.add(p.resolve())
    if skip_bad and weights is not None:
        raise InputError("--skip-bad leaves copies out, so it cannot take one weight per copy", place="--weights",
                         hint="let the copies' steps weigh them")
    if skip_bad:
        good, loaded = _good_copies(paths, warn)
        paths = tuple(good)
    else:
        loaded = [load_checkpoint(p) for p in paths]
    for p, c in zip(paths[1:], loaded[1:]):
        _check_compatible(loaded[0].model, paths[0], c.model, p)
    starts = {c.start_steps for c in loaded}
    if len(starts) > 1:
        detail = ", ".join(f"{p.name}: {c.start_steps}" for p, c in zip(paths, loaded))
        raise InputError(f"the copies started from different steps ({detail})", place=str(paths[0]),
                         hint="consolidate only the copies of one round")
    start = starts.pop()
    increments = tuple(c.steps - c.start_steps for c in loaded)
    norm = _normalised(list(weights) if weights is not None else [float(s) for s in increments], paths,
                       given=weights is not None)
    keep_from = max(range(len(loaded)), key=lambda i: (increments[i], -i))
    model = average_state_dicts([c.model for c in loaded], norm, keep_from)
    total = start + sum(increments)
    meta = {"consolidated_from": [str(p) for p in paths], "weights": list(norm), "round_steps": list(increments)}
    optimizer = loaded[keep_from].optimizer
    result_path = save_checkpoint(Path(out), TrainingCheckpoint(model=model, optimizer=optimizer, steps=total,
                                                                start_steps=total, meta=meta))
    if progress_dir is not None and job_id:
        record = ProgressRecord(job_id=job_id, slurm_job_id=slurm_job_id, rank=0, gpu_type=None, node="",
                                steps_done=total, samples_done=0, samples_per_second=0.0, epoch=0,
                                updated_at=time.time(), emulated=False, state="done", start_steps=total, exit_code=0,
                                saved_steps=total)
        write_progress(progress_path(Path(progress_dir), job_id, slurm_job_id, 0), record)
    return ConsolidationResult(out=result_path, inputs=paths, weights=norm, round_steps=increments, start_steps=start,
                               steps=total, optimizer_from=paths[keep_from] if optimizer is not None else None)
