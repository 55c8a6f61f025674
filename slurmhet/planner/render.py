"""Pure formatters for ``slurmhet plan``: table rows for people, a JSON-able dict for machines."""

from __future__ import annotations

from typing import Any

from slurmhet.planner.model import JobPlan, Plan

HEADER = ("job", "order", "gpus", "nodes", "shard weights", "start (s)", "JCT (s)", "co-location", "note")


def _gpus(jp: JobPlan) -> str:
    if jp.allocation is None:
        return "-"
    return ", ".join(f"{t}x{c}" for t, c in sorted(jp.allocation.by_type().items()))


def _nodes(jp: JobPlan) -> str:
    if jp.allocation is None:
        return "-"
    return ", ".join(f"{n}:{t}x{c}" for n, t, c in jp.allocation.slots)


def _note(jp: JobPlan) -> str:
    parts = []
    if jp.wait_reason:
        parts.append(jp.wait_reason)
    if jp.priors:
        parts.append("throughput prior on " + ", ".join(jp.priors))
    return "; ".join(parts)


def plan_rows(plan: Plan) -> list[tuple[str, ...]]:
    """One row per job in start order, matching :data:`HEADER`."""
    rows = []
    for jp in sorted(plan.jobs, key=lambda j: (j.order, j.job_id)):
        group = f"{jp.colocation_group} (MPS)" if jp.colocation_group else "-"
        weights = " ".join(f"{w:.3f}" for w in jp.shard_weights) or "-"
        rows.append((jp.job_id, str(jp.order), _gpus(jp), _nodes(jp), weights, f"{jp.start_s - plan.now:.0f}",
                     f"{jp.jct_s:.0f}", group, _note(jp)))
    return rows


def plan_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain JSON types (``slurmhet plan --json``)."""
    jobs = []
    for jp in sorted(plan.jobs, key=lambda j: (j.order, j.job_id)):
        jobs.append({
            "job": jp.job_id,
            "order": jp.order,
            "gpus_by_type": jp.allocation.by_type() if jp.allocation else None,
            "placement": [{"node": n, "gpu_type": t, "count": c} for n, t, c in jp.allocation.slots]
            if jp.allocation else None,
            "shard_weights": list(jp.shard_weights),
            "epoch_seconds": jp.epoch_seconds,
            "run_seconds": jp.run_seconds,
            "start_s": jp.start_s,
            "finish_s": jp.finish_s,
            "predicted_jct_s": jp.jct_s,
            "colocation_group": jp.colocation_group,
            "needs_mps": jp.needs_mps,
            "wait_reason": jp.wait_reason,
            "throughput_priors": list(jp.priors),
        })
    return {"policy": plan.policy, "now": plan.now, "avg_jct_s": plan.avg_jct, "weighted_jct_s": plan.weighted_jct,
            "jobs": jobs}
