"""``after:`` between jobs: who waits for whom, and what a predecessor's end means for its dependants.

slurmhet holds a dependant itself instead of handing Slurm ``--dependency=afterok``: the
dependant is planned (GPU type, size, nodes, partition) when its predecessors have
completed, on the cluster as it is then, not pinned hours before to a guess. Until then it
waits in the store with the reason; a predecessor that ends FAILED or CANCELLED cancels
it, with that reason. The functions here are pure; submission and replan call them.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from slurmhet.errors import InputError
from slurmhet.spec import JobSpec
from slurmhet.store import JobState


def resolve(new: Sequence[tuple[int, JobSpec]], stored: Callable[[int], tuple[str, str] | None],
            owner: str) -> dict[int, tuple[int, ...]]:
    """Each new job's predecessors as stored ids: names and groups of its file map to the ids just given,
    an id must be one of ``owner``'s stored jobs (``stored(id)`` -> (owner, name) or None)."""
    by_name = {spec.name: job_id for job_id, spec in new}
    by_group: dict[str, list[int]] = {}
    for job_id, spec in new:
        if spec.group:
            by_group.setdefault(spec.group, []).append(job_id)
    out = {}
    for job_id, spec in new:
        ids: list[int] = []
        for item in spec.after:
            if isinstance(item, int):
                found = stored(item)
                if found is None or found[0] != owner:
                    raise InputError(f"job {spec.name!r}: after {item}: no stored job {item} of yours",
                                     place=spec.place("after"), hint="`slurmhet status` lists your jobs and their ids")
                ids.append(item)
            else:
                ids += [by_name[item]] if item in by_name else by_group[item]
        if ids:
            out[job_id] = tuple(dict.fromkeys(ids))
    return out


def verdicts(after: Mapping[int, Sequence[int]], states: Mapping[int, tuple[str, JobState]]
             ) -> tuple[dict[int, str], dict[int, str]]:
    """(held, doomed): jobs whose predecessors have not all completed, and jobs one of whose predecessors
    ended without completing (or is gone from the store), each with the reason to show."""
    held, doomed = {}, {}
    for job_id, preds in after.items():
        waiting = []
        for pred in preds:
            name, state = states.get(pred, ("?", JobState.CANCELLED))
            if state.final and state is not JobState.COMPLETED:
                doomed[job_id] = f"cancelled: job {pred} ({name}) it runs after ended {state.value}"
                break
            if state is not JobState.COMPLETED:
                waiting.append(f"job {pred} ({name}, {state.value})")
        else:
            if waiting:
                held[job_id] = "waits for " + ", ".join(waiting) + " to complete (after:)"
    return held, doomed


def preview_hold(spec: JobSpec) -> str:
    """For a plan that runs nothing (`plan`, `submit --dry-run`): a job with ``after:`` is held until its
    predecessors complete, which none of them has yet in a preview."""
    if not spec.after:
        return ""
    return "waits for " + ", ".join(str(a) for a in spec.after) + " to complete (after:)"
