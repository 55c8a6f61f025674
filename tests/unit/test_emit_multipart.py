"""MultiPartSubmitter: all parts or none, and nothing it cannot undo is forgotten."""

from __future__ import annotations

from typing import Sequence

from slurmhet.emit.multipart import MultiPartSubmitter, Part
from slurmhet.emit.requests import ArrayChunk, ArrayRequest, Common, ConsolidationRequest, GpuShape, Launch
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.runner import SlurmCommandError

LAUNCH = Launch(("true",), ("slurmhet", "run", "--"))
COMMON = Common(job_id=5, name="forked", log_dir="/logs")


class FakeClient:
    """Accepts sbatch calls until ``refuse_at``; then refuses, times out, or answers after accepting."""

    def __init__(self, refuse_at: int | None = None, timeout: bool = False, cancel_fails: bool = False,
                 accepted_anyway: bool = False, queue_fails: bool = False) -> None:
        self.refuse_at, self.timeout, self.cancel_fails = refuse_at, timeout, cancel_fails
        self.accepted_anyway, self.queue_fails = accepted_anyway, queue_fails
        self.submitted: list[tuple[str, tuple[str, ...]]] = []
        self.cancelled: list[str] = []
        self.hidden: list[QueueRecord] = []

    def submit(self, options: Sequence[str], script: str) -> str:
        job_id = str(100 + len(self.submitted) + len(self.hidden))
        if len(self.submitted) == self.refuse_at:
            if self.timeout:
                if self.accepted_anyway:  # slurmctld took it, the answer never came
                    comment = next(o for o in options if o.startswith("--comment=")).split("=", 1)[1]
                    self.hidden.append(QueueRecord(job_id, None, None, None, None, "x", "PENDING", "", comment, "u", ""))
                raise SlurmCommandError(["sbatch"], None, "", "", note="timed out after 30 s")
            raise SlurmCommandError(["sbatch"], 1, "", "sbatch: error: Invalid account or account/partition combination")
        self.submitted.append((job_id, tuple(options)))
        return job_id

    def cancel(self, job_ids: Sequence[str]) -> None:
        if self.cancel_fails:
            raise SlurmCommandError(["scancel"], 1, "", "scancel: error: Unable to contact slurm controller")
        self.cancelled += job_ids

    def queue(self, job_ids: Sequence[str] | None = None) -> list[QueueRecord]:
        if self.queue_fails:
            raise SlurmCommandError(["squeue"], None, "", "", note="timed out after 30 s")
        return [QueueRecord(i, None, None, None, None, "x", "PENDING", "", "slurmhet:5", "u", "") for i, _ in
                self.submitted] + self.hidden


def _parts() -> list[Part]:
    array = ArrayRequest(COMMON, LAUNCH, GpuShape("k80", 1), ArrayChunk(0, 5000))
    chunks = [Part(c) for c in array.chunks(1001)]
    return chunks + [Part(ConsolidationRequest(COMMON, ("slurmhet",), "/ckpt", tuple(range(5000))),
                          after=tuple(range(len(chunks))))]


def test_all_parts_submitted_in_order_with_dependency_filled() -> None:
    client = FakeClient()
    outcome = MultiPartSubmitter(client).submit(_parts())  # type: ignore[arg-type]
    assert outcome.ok and [p.role for p in outcome.submitted] == ["array"] * 5 + ["consolidation"]
    assert "--dependency=afterany:100:101:102:103:104" in client.submitted[-1][1]
    assert outcome.live == outcome.submitted and client.cancelled == []


def test_refused_part_cancels_the_earlier_ones_and_keeps_slurms_message() -> None:
    client = FakeClient(refuse_at=3)
    outcome = MultiPartSubmitter(client).submit(_parts())  # type: ignore[arg-type]
    assert not outcome.ok and outcome.refused_at == 3 and "Invalid account" in outcome.message
    assert client.cancelled == ["100", "101", "102"] and outcome.cancelled == ("100", "101", "102")
    assert outcome.live == () and not outcome.maybe_submitted


def test_cancel_failure_is_reported_for_the_store() -> None:
    outcome = MultiPartSubmitter(FakeClient(refuse_at=2, cancel_fails=True)).submit(_parts())  # type: ignore[arg-type]
    assert outcome.cancel_failed == ("100", "101") and [p.slurm_job_id for p in outcome.live] == ["100", "101"]


def test_timeout_that_hid_an_accepted_job_is_found_by_comment_and_cancelled() -> None:
    client = FakeClient(refuse_at=1, timeout=True, accepted_anyway=True)
    outcome = MultiPartSubmitter(client).submit(_parts())  # type: ignore[arg-type]
    assert not outcome.ok and "timed out" in outcome.message
    assert client.cancelled == ["100", "101"] and not outcome.maybe_submitted


def test_timeout_with_slurmctld_gone_says_a_part_may_exist() -> None:
    client = FakeClient(refuse_at=0, timeout=True, queue_fails=True)
    outcome = MultiPartSubmitter(client).submit(_parts())  # type: ignore[arg-type]
    assert not outcome.ok and outcome.maybe_submitted and outcome.submitted == () and client.cancelled == []


def test_a_timed_out_sbatch_cancels_what_it_submitted_not_the_jobs_parts_on_record() -> None:
    """The search by tag after a timeout found every queued job of the same slurmhet job: a replan run by a round's
    consolidation, its sbatch of the next round timing out, cancelled that consolidation (the dev cluster's job
    ended CANCELLED). Parts the store holds for the job are its own work, not the lost answer's."""
    client = FakeClient(refuse_at=1, timeout=True, accepted_anyway=True)
    running = QueueRecord("90", None, None, None, None, "x", "RUNNING", "", "slurmhet:5", "u", "nodea")
    client.hidden.append(running)  # an earlier round's consolidation, on record, running this very replan
    outcome = MultiPartSubmitter(client, on_record=["90"]).submit(_parts())  # type: ignore[arg-type]
    assert not outcome.ok and not outcome.maybe_submitted
    assert client.cancelled == ["101", "102"] and "90" not in outcome.cancelled  # its first part, the hidden one
    unaware = FakeClient(refuse_at=1, timeout=True, accepted_anyway=True)
    unaware.hidden.append(running)
    MultiPartSubmitter(unaware).submit(_parts())  # type: ignore[arg-type]
    assert "90" in unaware.cancelled  # what happened before the store's parts were passed in
