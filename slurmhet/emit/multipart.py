"""Submit the Slurm parts of one slurmhet job so that, from the user's view, it is all or nothing.

A job may need several sbatch calls (array chunks, then a consolidation that
depends on them). If part k is refused, parts 0..k-1 are cancelled, so no Slurm
job runs for a slurmhet job the store calls SUBMIT_FAILED. What cannot be
cancelled (slurmctld went away mid-way) or may exist without an id (sbatch timed
out after slurmctld accepted the job) is reported, not forgotten: every part
carries ``--comment=slurmhet:<id>``, so the next sync/replan finds and settles it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from slurmhet.emit.requests import (ArrayRequest, BatchRequest, ConsolidationRequest, HetJobRequest, Materialized,
                                    PackRequest, SweepArrayRequest, option_value)
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.parsers import SlurmOutputError
from slurmhet.slurm.runner import SlurmCommandError

Request = BatchRequest | HetJobRequest | ArrayRequest | ConsolidationRequest | PackRequest | SweepArrayRequest
ROLES: dict[type, str] = {BatchRequest: "batch", HetJobRequest: "het", ArrayRequest: "array",
                          ConsolidationRequest: "consolidation", PackRequest: "pack", SweepArrayRequest: "sweep"}


@dataclass(frozen=True)
class Part:
    """One sbatch call; ``after`` lists earlier parts (by position) whose Slurm ids it depends on."""

    request: Request
    after: tuple[int, ...] = ()

    @property
    def role(self) -> str:
        return ROLES[type(self.request)]

    def resolved(self, ids: Sequence[str]) -> Request:
        """The request with its dependency ids filled in (only consolidations depend on earlier parts)."""
        if not self.after:
            return self.request
        if not isinstance(self.request, ConsolidationRequest):
            raise TypeError(f"a {self.role} part cannot depend on earlier parts")
        return replace(self.request, after=tuple(ids[i] for i in self.after))


@dataclass(frozen=True)
class SubmittedPart:
    role: str
    slurm_job_id: str
    request: Request
    argv: tuple[str, ...]

    def store_rows(self, job_id: int | None = None) -> list[dict[str, Any]]:
        """Column values for ``SlurmJob`` rows: one per het component, per array task, else one.

        A sweep array's tasks are different slurmhet jobs: ``job_id`` gets only its own task's row.
        """
        base: dict[str, Any] = {"slurm_job_id": self.slurm_job_id, "role": self.role, "argv": list(self.argv),
                                "state": "PENDING"}
        r = self.request
        if isinstance(r, SweepArrayRequest):
            tasks = [r.task_of(job_id)] if job_id is not None else range(len(r.members))
            return [{**base, "array_task": i, "gpu_type": r.shape.gpu_type, "gpu_count": r.shape.tasks}
                    for i in tasks]
        if isinstance(r, HetJobRequest):
            return [{**base, "het_offset": k, "gpu_type": c.gpu_type, "gpu_count": c.tasks,
                     "nodes": ",".join(c.nodelist)} for k, c in enumerate(r.components)]
        if isinstance(r, ArrayRequest):
            return [{**base, "round": r.round, "array_task": i, "gpu_type": r.shape.gpu_type,
                     "gpu_count": r.shape.tasks, "nodes": ",".join(r.shape.nodelist)}
                    for i in range(r.chunk.first_index, r.chunk.last_index + 1)]
        if isinstance(r, BatchRequest):
            return [{**base, "gpu_type": r.gpu_type, "gpu_count": r.gpus_per_node * r.nodes,
                     "nodes": ",".join(r.nodelist)}]
        if isinstance(r, PackRequest):
            return [{**base, "gpu_type": r.gpu_type, "gpu_count": 1, "nodes": ",".join(r.nodelist)}]
        return [{**base, "round": r.round}]


def expected_rows(parts: Sequence[Part], job_ids: Sequence[int]) -> dict[int, list[list[dict[str, Any]]]]:
    """Each job's store rows per part before sbatch names the parts, in submission order: what a dispatch's mark
    keeps, so that a cut-off dispatch's Slurm jobs are recorded as its outcome would have been
    (``sync.adopt_orphans``). Ids are not known yet: :func:`with_ids` fills them in (a consolidation's argv
    names the earlier parts in its dependency). Each part is rendered once, however many jobs share it."""
    placeholders = [_unknown(k) for k in range(len(parts))]
    shown = [SubmittedPart(part.role, "", request, tuple(request.materialize().sbatch_argv()))
             for part in parts for request in [part.resolved(placeholders)]]
    return {job_id: [[{k: v for k, v in row.items() if k != "slurm_job_id"} for row in part.store_rows(job_id)]
                     for part in shown] for job_id in job_ids}


def with_ids(rows: Sequence[dict[str, Any]], ids: Sequence[str], k: int) -> list[dict[str, Any]]:
    """Part ``k``'s :func:`expected_rows`, now that Slurm's ids of the dispatch's parts are known."""
    def filled(arg: str) -> str:
        for index, slurm_id in enumerate(ids):
            arg = arg.replace(_unknown(index), slurm_id)
        return arg
    return [{**row, "slurm_job_id": ids[k], "argv": [filled(a) for a in row.get("argv") or ()]} for row in rows]


def _unknown(k: int) -> str:
    """Stands for part ``k``'s Slurm id until sbatch gives it."""
    return f"<part {k}>"


def shown_ids(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ids a user passes to squeue/scancel for these rows: a sweep variant is its array task ``A_i``."""
    return list(dict.fromkeys(f"{r['slurm_job_id']}_{r['array_task']}" if r["role"] == "sweep"
                              else r["slurm_job_id"] for r in rows))


@dataclass(frozen=True)
class MultiPartOutcome:
    """What happened to every part. ``ok`` means all parts are in Slurm; otherwise none should run.

    ``cancel_failed`` are parts submitted before the refusal that scancel could
    not stop; ``maybe_submitted`` is set when sbatch gave no answer (timeout),
    so a Slurm job tagged with this comment may exist. Both must be recorded.
    """

    submitted: tuple[SubmittedPart, ...]
    refused_at: int | None = None
    message: str = ""
    cancelled: tuple[str, ...] = ()
    cancel_failed: tuple[str, ...] = ()
    maybe_submitted: bool = False
    error: SlurmCommandError | SlurmOutputError | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.refused_at is None

    @property
    def live(self) -> tuple[SubmittedPart, ...]:
        """Parts that may still be in Slurm: all of them on success, the uncancelled ones on failure."""
        if self.ok:
            return self.submitted
        return tuple(p for p in self.submitted if p.slurm_job_id in self.cancel_failed)


class MultiPartSubmitter:
    """Submits parts in order through a SlurmClient; undoes earlier parts when a later one fails.

    ``on_record``: Slurm jobs the store already holds for the jobs being submitted. They carry the same comment
    tag (an earlier round, the consolidation whose replan is submitting the next round), so a search by tag
    after a timeout must leave them be: cancelling them would end work that is the job's own.
    """

    def __init__(self, client: SlurmClient, on_record: Iterable[str] = ()) -> None:
        self.client, self.on_record = client, frozenset(on_record)

    def submit(self, parts: Sequence[Part]) -> MultiPartOutcome:
        done: list[SubmittedPart] = []
        for index, part in enumerate(parts):
            request = part.resolved([p.slurm_job_id for p in done])
            rendered = request.materialize()
            try:
                slurm_id = self.client.submit(rendered.argv, rendered.script)
            except (SlurmCommandError, SlurmOutputError) as exc:
                return self._undo(done, index, exc, rendered)
            done.append(SubmittedPart(part.role, slurm_id, request, tuple(rendered.sbatch_argv())))
        return MultiPartOutcome(tuple(done))

    def _undo(self, done: list[SubmittedPart], index: int, exc: SlurmCommandError | SlurmOutputError,
              rendered: Materialized) -> MultiPartOutcome:
        # A timeout or an unreadable answer may hide an accepted job: look for it by its comment tag.
        unknown = isinstance(exc, SlurmOutputError) or exc.returncode is None
        ids = [p.slurm_job_id for p in done]
        if unknown:
            found = self._find_by_comment(option_value(rendered.argv, "comment"), known=set(ids) | self.on_record)
            unknown = found is None
            ids += found or []
        cancelled: tuple[str, ...] = ()
        failed: tuple[str, ...] = ()
        if ids:
            try:
                self.client.cancel(ids)
                cancelled = tuple(ids)
            except SlurmCommandError:
                failed = tuple(ids)
        message = exc.message if isinstance(exc, SlurmCommandError) else str(exc)
        return MultiPartOutcome(tuple(done), refused_at=index, message=message, cancelled=cancelled,
                                cancel_failed=failed, maybe_submitted=unknown, error=exc)

    def _find_by_comment(self, comment: str | None, known: set[str]) -> list[str] | None:
        """Ids of queued jobs tagged ``comment`` that we did not get from sbatch; None when squeue fails too."""
        if comment is None:
            return None
        try:
            records = self.client.queue()
        except (SlurmCommandError, SlurmOutputError):
            return None
        return sorted({r.root_id for r in records if r.comment == comment and r.root_id not in known})
