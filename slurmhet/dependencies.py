"""``after:`` between jobs: who waits for whom, and what a predecessor's end means for its dependants.

A dependant is held in slurmhet while a predecessor is not yet running: planning it then
would fix its GPU type, size and partition to a guess about a cluster hours away. Once
every predecessor still to complete runs as its final Slurm job (a batch job or a sweep
variant's array task, which only a requeue under the same id can follow), the dependant is
planned on the cluster as it is and handed to Slurm with ``--dependency=afterok`` on
those jobs, so Slurm starts it the moment they complete instead of at the next replan.
Predecessors whose Slurm jobs may still change (pending ones, which replan may move;
forked rounds; packs; het jobs) keep it held. A predecessor that ends FAILED or CANCELLED
cancels it, with that reason, in the store and in Slurm. The functions here are pure;
submission and replan call them.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

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


class Verdicts(NamedTuple):
    """What ``after:`` says about each dependant now."""

    #: Jobs with a predecessor still to complete, with the reason to show.
    held: dict[int, str]
    #: Jobs one of whose predecessors ended without completing (or is gone from the store), with the reason.
    doomed: dict[int, str]
    #: Held jobs that may go to Slurm now: the Slurm ids to pass as ``--dependency=afterok``.
    chained: dict[int, tuple[str, ...]]


def verdicts(after: Mapping[int, Sequence[int]], states: Mapping[int, tuple[str, JobState]],
             final_slurm: Mapping[int, tuple[str, ...]] | None = None) -> Verdicts:
    """Each dependant's verdict; ``final_slurm``: predecessors running as their final Slurm jobs, with those ids."""
    held, doomed, chained = {}, {}, {}
    for job_id, preds in after.items():
        waiting: list[str] = []
        slurm: list[str] = []
        for pred in preds:
            name, state = states.get(pred, ("?", JobState.CANCELLED))
            if state.final and state is not JobState.COMPLETED:
                doomed[job_id] = f"cancelled: job {pred} ({name}) it runs after ended {state.value}"
                break
            if state is not JobState.COMPLETED:
                waiting.append(f"job {pred} ({name}, {state.value})")
                slurm += (final_slurm or {}).get(pred, ()) or [""]  # "": not in Slurm as its final job
        else:
            if waiting:
                held[job_id] = "waits for " + ", ".join(waiting) + " to complete (after:)"
                if all(slurm):
                    chained[job_id] = tuple(dict.fromkeys(slurm))
    return Verdicts(held, doomed, chained)


def preview_hold(spec: JobSpec) -> str:
    """For a plan that runs nothing (`plan`, `submit --dry-run`): a job with ``after:`` is held until its
    predecessors complete, which none of them has yet in a preview."""
    if not spec.after:
        return ""
    return "waits for " + ", ".join(str(a) for a in spec.after) + " to complete (after:)"
