"""Runs Slurm requeued under their own id (preempted, a node failed): squeue's restart count is read, a requeue
becomes an event and a restart in status and report, the requeue hold is released, and the move rule may judge
the job (store rules and pure functions, no Slurm)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import select

from slurmhet.replan import (CANCELLING, REQUEUE_HOLD, displaced, owed_cancels, requeue_held, requeued, stranded_copies,
                             waiting_in_slurm, with_progress)
from slurmhet.runtime.progress import ProgressRecord, job_steps
from slurmhet.cluster import Inventory, Node
from slurmhet.slurm.parsers import QueueRecord, parse_squeue_json
from slurmhet.spec import load_text
from slurmhet.store import Database, Job, JobState, SlurmJob, create_job
from slurmhet.store.models import Event
from slurmhet.sync import SlurmView, finished_waiting, restarts, settle_finished, sync_jobs

SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml")[0]
T0 = datetime(2026, 11, 26, 5, tzinfo=timezone.utc)


def _job(session: object, state: JobState, *parts: SlurmJob, started: bool = True) -> Job:
    job = create_job(session, SPEC, "alice", "f.yaml")  # type: ignore[arg-type]
    job.state, job.started_at = state, T0 if started else None
    job.plan = {"slots": [["nodec", "k80", 1]]}
    job.slurm_jobs += list(parts)
    return job


def _queued(state: str, reason: str, restarts: int, job_id: str = "70") -> QueueRecord:
    return QueueRecord(job_id, None, None, None, None, "j", state, reason, "", "alice", "", restarts=restarts)


def test_squeue_json_restart_count_is_read() -> None:
    text = json.dumps({"jobs": [{"job_id": 70, "job_state": ["PENDING"], "state_reason": "BeginTime",
                                 "restart_cnt": 2, "name": "j", "user_name": "alice"},
                                {"job_id": 71, "job_state": "RUNNING", "name": "k", "user_name": "bob"}]})
    assert [(r.job_id, r.reason, r.restarts) for r in parse_squeue_json(text)] == [("70", "BeginTime", 2), ("71", "", 0)]


def test_a_requeue_is_an_event_and_a_restart_once(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="70", role="batch", state="RUNNING",
                                                       nodes="nodec", started_at=T0))
        session.flush()
        assert restarts(job) == 0
        view = SlurmView(queue=(_queued("PENDING", REQUEUE_HOLD, 1),))
        sync_jobs(session, [job], view, tmp_path)
        sync_jobs(session, [job], view, tmp_path)  # seen again: the same requeue, not a second one
        assert job.state is JobState.SUBMITTED and restarts(job) == 1 and requeued(job)
        (event,) = session.scalars(select(Event).where(Event.kind == "requeued")).all()
        assert event.message.startswith("Slurm requeued 70 after it ran on nodec (restart 1")
        assert requeue_held(job) == ("70",)  # held by Slurm: replan releases it
        sync_jobs(session, [job], SlurmView(queue=(_queued("RUNNING", "None", 1),)), tmp_path)
        assert job.state is JobState.RUNNING and requeue_held(job) == () and restarts(job) == 1


def test_restarts_count_requeues_and_retried_runs_not_moves_or_het_components(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = _job(session, JobState.RUNNING,
                   SlurmJob(slurm_job_id="60", role="superseded", state="CANCELLED"),  # moved before it started
                   SlurmJob(slurm_job_id="61", role="retried", state="FAILED", restarts=1),  # preempted, then failed
                   SlurmJob(slurm_job_id="62", role="het", het_offset=0, state="RUNNING", restarts=2),
                   SlurmJob(slurm_job_id="62", role="het", het_offset=1, state="RUNNING", restarts=2))
        session.flush()
        assert restarts(job) == 1 + 1 + 2


def test_a_requeued_job_may_be_moved_and_one_on_a_dead_node_is_displaced(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    inventory = Inventory((Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2}, state="DRAINED")))
    with db.transaction() as session:
        again = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="70", role="batch", state="PENDING",
                                                           reason=REQUEUE_HOLD, started_at=T0, restarts=1))
        running = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="71", role="batch", state="RUNNING",
                                                           started_at=T0))
        fresh = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="72", role="batch", state="PENDING",
                                                           reason="Resources"), started=False)
        session.flush()
        wait = waiting_in_slurm(again)
        assert wait is not None and wait.requeued and wait.reason == REQUEUE_HOLD and wait.types == ("k80",)
        assert waiting_in_slurm(running) is None
        assert (w := waiting_in_slurm(fresh)) is not None and not w.requeued
        assert displaced(again, inventory) == ("nodec",) and displaced(running, inventory) == ()
        pack = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="73", role="pack", state="PENDING",
                                                          reason=REQUEUE_HOLD, started_at=T0, restarts=1))
        assert waiting_in_slurm(pack) is None and requeue_held(pack) == ("73",)  # not moved, still released


def test_a_forked_copy_pending_on_a_dead_node_is_stranded_the_others_are_not(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    inventory = Inventory((Node("nodea", {"v100": 4}), Node("nodec", {"k80": 2}, state="DOWN+DRAIN")))
    with db.transaction() as session:
        job = _job(session, JobState.RUNNING,
                   SlurmJob(slurm_job_id="80", role="array", array_task=0, round=1, nodes="nodea", state="RUNNING"),
                   SlurmJob(slurm_job_id="81", role="array", array_task=1, round=1, nodes="nodec", state="PENDING",
                            reason=REQUEUE_HOLD, restarts=1, started_at=T0),
                   SlurmJob(slurm_job_id="82", role="consolidation", round=1, state="PENDING", reason="Dependency"))
        session.flush()
        assert [(p.slurm_job_id, nodes) for p, nodes in stranded_copies(job, inventory)] == [("81", ("nodec",))]
        job.slurm_jobs[1].nodes = ""  # not pinned: Slurm may start it on any node of its type
        assert stranded_copies(job, inventory) == []


class _Cancels:
    """The one Slurm call displacement makes, recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def cancel(self, job_ids: list[str]) -> None:
        self.calls.append(list(job_ids))


def test_an_mps_pack_requeued_onto_a_drained_node_is_cancelled_once_and_each_member_replanned(tmp_path: Path) -> None:
    from slurmhet.replan import ReplanResult, Replanner

    db = Database(f"sqlite:///{tmp_path}/s.db")
    inventory = Inventory((Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2}, state="DRAINED")))
    client = _Cancels()
    replanner = Replanner(db, client, None, None, None, "alice")  # type: ignore[arg-type]
    result = ReplanResult()
    with db.transaction() as session:
        members = [_job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="90", role="pack", state="PENDING",
                                                              reason=REQUEUE_HOLD, nodes="nodec", started_at=T0,
                                                              restarts=1)) for _ in range(2)]
        session.flush()
        owed = replanner._displace(session, members, inventory, [], False, result)
        assert owed == ["90"] and client.calls == []  # one Slurm job for both members; cancelled after the commit
        assert [m.state for m in members] == [JobState.PENDING, JobState.PENDING]
        assert all((p.role, p.state) == ("superseded", CANCELLING) for m in members for p in m.slurm_jobs)
        assert [e for e in result.events if e.startswith("node nodec failed under job")] == [
            f"node nodec failed under job {m.id} (a); Slurm requeued it there: re-planned now, resumes from its "
            "checkpoint" for m in members]
        assert restarts(members[0]) == 1


def test_a_forked_round_is_judged_by_its_consolidation_not_by_a_copy_cut_off(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        def round_with(consolidation: str) -> Job:
            return _job(session, JobState.RUNNING,
                        SlurmJob(slurm_job_id="80", role="array", array_task=0, state="COMPLETED"),
                        SlurmJob(slurm_job_id="80", role="array", array_task=1, state="CANCELLED", restarts=1),
                        SlurmJob(slurm_job_id="80", role="array", array_task=2, state="FAILED", reason="NODE_FAIL"),
                        SlurmJob(slurm_job_id="81", role="consolidation", state=consolidation))
        averaged, failed, waiting = round_with("COMPLETED"), round_with("FAILED"), round_with("PENDING")
        session.flush()
        sync_jobs(session, [averaged, failed, waiting], SlurmView(), tmp_path)
        # Consolidated without the two copies: the Job Tracker (replan) decides on the next round.
        assert averaged.state is JobState.RUNNING
        assert failed.state is JobState.FAILED  # no copy left a checkpoint
        assert waiting.state is JobState.SUBMITTED


def test_a_type_whose_only_node_is_drained_is_a_wait_not_a_bad_spec() -> None:
    from slurmhet.spec import check_against_cluster
    from slurmhet.submission import Candidate, unplaceable

    spec = load_text("name: t\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n"
                     "gpus: {min: 1, max: 1, types: [t4]}\n", "t.yaml")[0]
    inventory = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4}, state="DOWN+DRAIN")))
    check_against_cluster(spec, inventory)  # nodeb is out for repair: the spec is still right
    waits = unplaceable([Candidate(job_id=1, spec=spec, submitted_at=0.0)], inventory)
    assert waits == {1: "waits: its GPU types (t4) have 0 usable GPU(s) now and it needs 1"}


def test_a_hold_is_kept_while_the_job_that_preempted_it_waits_for_its_nodes() -> None:
    from slurmhet.replan import outranked
    from slurmhet.slurm.limits import PartitionRecord

    def partition(name: str, nodes: tuple[str, ...], tier: int) -> PartitionRecord:
        return PartitionRecord(name, nodes, "UP", False, None, None, (), None, None, (), tier, False)

    partitions = [partition("k80", ("nodec",), 1), partition("t4", ("nodeb",), 1),
                  partition("urgent", ("nodea", "nodeb", "nodec"), 10)]

    def queued(job_id: str, partition_name: str, state: str) -> QueueRecord:
        return QueueRecord(job_id, None, None, None, None, "j", state, "", "", "u", "", partition=partition_name)

    mine = queued("70", "k80", "PENDING")
    assert outranked(["70"], [mine, queued("80", "urgent", "PENDING")], partitions)  # the preemptor waits
    assert not outranked(["70"], [mine, queued("80", "urgent", "RUNNING")], partitions)  # it started: release
    assert not outranked(["70"], [mine, queued("81", "t4", "PENDING")], partitions)  # same tier: Slurm's order


def test_a_replan_killed_between_its_store_write_and_scancel_is_finished_by_the_next(tmp_path: Path) -> None:
    """The store says superseded (CANCELLING) first; squeue still lists the Slurm job: the next run owes its
    scancel and does it before submitting anything; once Slurm no longer lists it live, the part reads CANCELLED."""
    from slurmhet.replan import ReplanResult, Replanner

    db = Database(f"sqlite:///{tmp_path}/s.db")
    inventory = Inventory((Node("nodeb", {"t4": 4}),))
    with db.transaction() as session:
        moved = _job(session, JobState.PENDING, SlurmJob(slurm_job_id="95", role="superseded", state=CANCELLING),
                     started=False)
        session.flush()
        still_there = [_queued("PENDING", "Resources", 0, job_id="95")]
        assert owed_cancels([moved], still_there) == ["95"]
        replanner = Replanner(db, _Cancels(), None, None, None, "alice")  # type: ignore[arg-type]
        assert replanner._displace(session, [moved], inventory, still_there, False, ReplanResult()) == ["95"]
        assert moved.slurm_jobs[0].state == CANCELLING
        gone = [_queued("CANCELLED", "", 0, job_id="95")]
        assert replanner._displace(session, [moved], inventory, gone, False, ReplanResult()) == []
        assert moved.slurm_jobs[0].state == "CANCELLED" and moved.state is JobState.PENDING  # never the user's cancel


class _Refusing:
    """A runner whose every command fails with ``stderr``."""

    def __init__(self, stderr: str) -> None:
        self.stderr, self.calls = stderr, []  # type: ignore[var-annotated]

    def run(self, argv: list[str], stdin: str | None = None, timeout: float | None = None) -> None:
        from slurmhet.slurm.runner import SlurmCommandError

        self.calls.append(argv)
        raise SlurmCommandError(argv, 1, "", self.stderr)


def test_cancelling_or_releasing_a_job_that_already_ended_is_no_failure_anything_else_is() -> None:
    import pytest

    from slurmhet.slurm.client import SlurmCli
    from slurmhet.slurm.runner import SlurmCommandError

    for said in ("scancel: error: Kill job error on job id 9_2: Job/step already completing or completed\n",
                 "9_[2]: Job has already finished\n", "scancel: error: Invalid job id specified\n"):
        SlurmCli(_Refusing(said)).cancel(["9_2"])  # type: ignore[arg-type]
        SlurmCli(_Refusing(said)).release_requeue_hold(["9_2"])  # type: ignore[arg-type]
    with pytest.raises(SlurmCommandError):
        SlurmCli(_Refusing("scancel: error: Unable to contact slurm controller\n")).cancel(["9"])  # type: ignore[arg-type]
    # a held job Slurm started between squeue and the release got what the release asked for; no cancel says so
    started = "Job is no longer pending execution for job 144\n"
    SlurmCli(_Refusing(started)).release_requeue_hold(["144"])  # type: ignore[arg-type]
    with pytest.raises(SlurmCommandError):
        SlurmCli(_Refusing(started)).cancel(["144"])  # type: ignore[arg-type]
    refusing = _Refusing(started)
    SlurmCli(refusing).release_requeue_hold(["144", "145", "144"])  # type: ignore[arg-type]
    assert [argv[2] for argv in refusing.calls] == ["JobId=144", "JobId=145"]


class _Releases:
    """The calls releasing requeue holds makes, recorded."""

    def __init__(self) -> None:
        self.released: list[list[str]] = []

    def partitions(self) -> list[object]:
        return []

    def release_requeue_hold(self, job_ids: list[str]) -> None:
        self.released.append(list(job_ids))


def test_a_requeued_mps_pack_is_released_once_for_all_its_members(tmp_path: Path) -> None:
    """A pack's members share one Slurm job. Releasing it per member sent a second scontrol update after the
    first had let it start, which Slurm refused ("no longer pending execution") and failed the replan."""
    from slurmhet.replan import ReplanResult, Replanner

    db = Database(f"sqlite:///{tmp_path}/s.db")
    client = _Releases()
    replanner = Replanner(db, client, None, None, None, "alice")  # type: ignore[arg-type]
    result = ReplanResult()
    with db.transaction() as session:
        members = [_job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="144", role="pack", state="PENDING",
                                                              reason=REQUEUE_HOLD, started_at=T0, restarts=1))
                   for _ in range(2)]
        other = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="150", role="batch", state="PENDING",
                                                           reason=REQUEUE_HOLD, started_at=T0, restarts=1))
        session.flush()
        replanner._release_holds([*members, other], [], [], False, result)
        assert client.released == [["144", "150"]]
        assert [a.split(":")[0] for a in result.actions] == [
            f"release Slurm's requeue hold on 144 of job {members[0].id}",
            f"release Slurm's requeue hold on 144 of job {members[1].id}",
            f"release Slurm's requeue hold on 150 of job {other.id}"]
        replanner._release_holds([*members, other], [], [], True, ReplanResult())
        assert client.released == [["144", "150"]]  # a dry run releases nothing


def _record(job: Job, steps: int, state: str, code: int | None, at: float = 1000.0) -> ProgressRecord:
    return ProgressRecord(job_id=str(job.id), slurm_job_id="70", rank=0, gpu_type="k80", node="nodec",
                          steps_done=steps, samples_done=steps * 2, samples_per_second=4.0, epoch=0, updated_at=at,
                          emulated=True, state=state, exit_code=code)


def test_a_job_waiting_for_a_run_is_planned_from_its_last_checkpoint_and_a_running_one_from_its_step(
        tmp_path: Path) -> None:
    """A node failed after step 2 of 3 with the checkpoint at step 1: the next run resumes at 1 and trains 2 more
    steps, which the plan must count (it counted 1). A command with no checkpoint starts over: all 3. A job whose
    run goes on is planned from the step it reached, as before; Slurm requeueing it makes it wait for a run."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        waiting = _job(session, JobState.PENDING, SlurmJob(slurm_job_id="70", role="superseded", state="NODE_FAIL"))
        requeued = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="71", role="batch", state="PENDING"))
        running = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="72", role="batch", state="RUNNING"))
        scratch = _job(session, JobState.PENDING, SlurmJob(slurm_job_id="73", role="superseded", state="NODE_FAIL"))
        session.flush()
        records = [replace(_record(job, 2, "running", None), slurm_job_id=str(70 + i), saved_steps=1)
                   for i, job in enumerate((waiting, requeued, running))]
        records.append(replace(_record(scratch, 2, "running", None), slurm_job_id="73", saved_steps=0))
        steps, saved = job_steps(records), job_steps(records, saved=True)
        planned = {job.id: with_progress(job, steps, saved) for job in (waiting, requeued, running, scratch)}
        assert {i: c.samples_done if c else None for i, c in planned.items()} == {
            waiting.id: 2.0, requeued.id: 2.0, running.id: 4.0, scratch.id: 0.0}  # 2 samples a step


def test_a_job_re_planned_after_its_run_reached_every_step_runs_again_unless_it_said_it_finished(
        tmp_path: Path) -> None:
    """A node failed as a het job's run reached its last step (found on 24.11 under load): the ranks were killed
    at step 3 of 3 (exit 143) and Slurm requeued the run, which replan re-planned. The planner took the job as
    done and the sync had no run to close, so it stayed PENDING for good. Now a job waiting for a run is planned
    with its last step left (it resumes from its checkpoint), and one whose command said it finished (``done``,
    exit 0) is COMPLETED at that time; a job whose run still lives is left for the sync, as before."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        killed = _job(session, JobState.PENDING, SlurmJob(slurm_job_id="70", role="superseded", state="CANCELLED"))
        said = _job(session, JobState.PENDING, SlurmJob(slurm_job_id="71", role="superseded", state="CANCELLED"))
        live = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="72", role="batch", state="RUNNING"))
        session.flush()
        records = [_record(killed, 3, "failed", 143), _record(said, 3, "done", 0, at=1500.0),
                   _record(said, 2, "running", None), _record(live, 3, "running", None)]
        steps, saved = job_steps(records), job_steps(records, saved=True)
        again = with_progress(killed, steps, saved)
        assert again is not None and again.samples_done == 4.0  # 2 of 3 steps of 2 samples: one step left
        assert with_progress(live, steps, saved) is None  # its run ends on its own; the sync closes it
        assert [(j.id, total, at) for j, total, at in finished_waiting([killed, said, live], records)] == [
            (said.id, 3, 1500.0)]
        settle_finished(session, said, 3, 1500.0)
        assert said.state is JobState.COMPLETED and said.ended_at == datetime.fromtimestamp(1500.0, timezone.utc)
        (event,) = session.scalars(select(Event).where(Event.job_id == said.id, Event.kind == "state")).all()
        assert event.message == "PENDING -> COMPLETED: its command had finished all 3 steps (progress: done); " \
                                "nothing left to run"
