"""What a failed run means: retry once after a start-up crash, re-plan off a type that ran out of memory,
re-plan after a lost node or a preemption Slurm did not requeue, fail for good otherwise."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from slurmhet.failures import MAX_QUICK_FAILURES, FailedRun, judge, tail
from slurmhet.runtime.progress import ProgressRecord, progress_path, write_progress
from slurmhet.spec import load_text
from slurmhet.store import Database, Event, Job, JobState, SlurmJob, create_job
from slurmhet.store.models import ClusterSnapshot
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.sync import SlurmView, settle_failure, settle_stopped, sync_jobs

MEMORY = {"k80": 12.0, "t4": 16.0, "v100": 16.0, "a100": 80.0}
ALLOWED = ("k80", "t4", "v100", "a100")


def _judge(run: FailedRun, earlier: int = 0, unusable: tuple[str, ...] = ()) -> object:
    return judge(run, earlier, unusable, ALLOWED, MEMORY.get)


def test_a_start_up_crash_is_retried_once_then_fails() -> None:
    run = FailedRun("FAILED", "3:0", 12.0, ("t4",), ("Traceback ...", "ImportError: no module named x"))
    first = _judge(run)
    assert (first.action, first.quick) == ("retry", True)  # type: ignore[attr-defined]
    assert first.reason == "failed 12 s after it started (exit 3:0); retried once"  # type: ignore[attr-defined]
    last = _judge(run, earlier=MAX_QUICK_FAILURES - 1)
    assert last.action == "fail" and last.reason.startswith("failed 2 times within 5 min of starting (exit 3:0)")  # type: ignore[attr-defined]


def test_a_late_failure_is_the_jobs_own_and_not_retried() -> None:
    verdict = _judge(FailedRun("FAILED", "1:0", 3600.0, ("v100",)))
    assert (verdict.action, verdict.reason, verdict.quick) == ("fail", "failed (exit 1:0)", False)  # type: ignore[attr-defined]


def test_gpu_oom_makes_that_type_and_every_smaller_one_unusable() -> None:
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",)
    verdict = _judge(FailedRun("FAILED", "1:0", 40.0, ("t4",), oom))
    # t4 has 16 GB: k80 (12) and v100 (16) cannot hold it either; only a100 is left.
    assert verdict.action == "retry" and verdict.unusable == ("k80", "t4", "v100")  # type: ignore[attr-defined]
    assert verdict.reason == "GPU out of memory on t4 (16 GB); re-planned on a100"  # type: ignore[attr-defined]
    assert not verdict.quick  # type: ignore[attr-defined]  # not a crash loop: it may run elsewhere
    last = _judge(FailedRun("FAILED", "1:0", 40.0, ("a100",), oom), unusable=("k80", "t4", "v100"))
    assert last.action == "fail" and "no allowed type has more memory" in last.reason  # type: ignore[attr-defined]


def test_oom_on_a_type_of_unknown_memory_rules_out_that_type_alone() -> None:
    verdict = judge(FailedRun("FAILED", "1:0", 5.0, ("mystery",), ("CUDA error: out of memory",)), 0, (),
                    ("mystery", "k80"), MEMORY.get)
    assert verdict.action == "retry" and verdict.unusable == ("mystery",)


def test_a_lost_node_is_retried_whatever_came_before() -> None:
    verdict = _judge(FailedRun("NODE_FAIL", "0:0", 5.0, ("v100",)), earlier=5)
    assert verdict.action == "retry" and "its node failed under it" in verdict.reason  # type: ignore[attr-defined]


def test_a_preemption_that_ended_the_run_is_re_planned_however_long_it_ran() -> None:
    """PreemptMode=CANCEL (or a self-requeue Slurm refused) leaves PREEMPTED: the job is not at fault, early or
    late, and neither its start-up failures before nor the GPU type matter."""
    for ran in (5.0, 7200.0):
        verdict = _judge(FailedRun("PREEMPTED", "0:0", ran, ("v100",)), earlier=MAX_QUICK_FAILURES - 1)
        assert (verdict.action, verdict.quick) == ("retry", False)  # type: ignore[attr-defined]
        assert "preempted it and Slurm did not requeue it" in verdict.reason  # type: ignore[attr-defined]
    late = _judge(FailedRun("FAILED", "0:0", 7200.0, ("v100",)))
    assert late.action == "fail"  # type: ignore[attr-defined]  # the same run, FAILED, is the job's own


def test_tail_keeps_the_last_non_empty_lines() -> None:
    assert tail("a\n\nb\nc\n", 2) == ("b", "c") and tail("") == ()


# --------------------------------------------------------------------------- in the store, as sync applies it

T0 = datetime(2026, 11, 26, 9, tzinfo=timezone.utc)
SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml")[0]


def _run(job: object, slurm_id: str, gpu_type: str, log_dir: Path, stderr: str, seconds: float = 8,
         state: str = "FAILED", raw: str = "FAILED") -> None:
    (log_dir / f"slurmhet-1-{slurm_id}.err").write_text(stderr)
    job.slurm_jobs.append(SlurmJob(  # type: ignore[attr-defined]
        slurm_job_id=slurm_id, role="batch", state=state, reason=raw, exit_code="1:0", gpu_type=gpu_type,
        gpu_count=1, started_at=T0, ended_at=T0 + timedelta(seconds=seconds),
        argv=["sbatch", f"--output={log_dir}/slurmhet-1-%j.out", f"--error={log_dir}/slurmhet-1-%j.err"]))


def test_a_start_up_crash_is_retried_once_then_failed_with_its_stderr(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")
        job.state = JobState.RUNNING
        _run(job, "501", "t4", tmp_path, "".join(f"line {i}\n" for i in range(30)) + "ImportError: no x\n")
        assert settle_failure(session, job, tmp_path)
        assert job.state is JobState.PENDING and job.reason == "failed 8 s after it started (exit 1:0); retried once"
        assert [p.role for p in job.slurm_jobs] == ["retried"]  # its run is kept (logs) but speaks no more
        job.state = JobState.RUNNING
        _run(job, "502", "t4", tmp_path, "ImportError: no x\n")
        assert settle_failure(session, job, tmp_path)
        assert job.state is JobState.FAILED and job.reason.startswith("failed 2 times within 5 min")
        (last,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "failed").all()
        assert last.data["stderr_tail"] == ["ImportError: no x"] and last.data["exit_code"] == "1:0"
        (first,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "retried").all()
        assert len(first.data["stderr_tail"]) == 20 and first.data["stderr_tail"][-1] == "ImportError: no x"


def test_gpu_oom_narrows_the_jobs_types_to_those_with_more_memory(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        session.add(ClusterSnapshot(nodes={"nodea": {"gpus": {"v100": 4}}, "nodeb": {"gpus": {"t4": 4}},
                                           "nodec": {"gpus": {"k80": 2}}}))
        job = create_job(session, SPEC, "alice", "f.yaml")  # any type: the cluster's types are the choice
        job.state = JobState.RUNNING
        _run(job, "601", "k80", tmp_path, "torch.OutOfMemoryError: CUDA out of memory.\n", seconds=30)
        assert settle_failure(session, job, tmp_path)
        assert job.state is JobState.PENDING and job.reason == "GPU out of memory on k80 (12 GB); re-planned on t4, v100"
        assert job.spec["gpus"]["types"] == ["t4", "v100"]


def test_a_run_a_preemption_ended_is_re_planned_and_counted_as_a_restart(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")
        job.state = JobState.RUNNING
        _run(job, "651", "k80", tmp_path, "", seconds=3600, raw="PREEMPTED")
        assert settle_failure(session, job, tmp_path)
        assert job.state is JobState.PENDING and job.reason.startswith("a higher-priority job preempted it")
        assert [p.role for p in job.slurm_jobs] == ["retried"]
        (event,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "retried").all()
        assert (event.data["slurm_state"], event.data["quick"]) == ("PREEMPTED", False)


def test_forked_rounds_and_adopted_parts_are_left_to_fail_as_before(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        for role in ("consolidation", "adopted"):
            job = create_job(session, SPEC, "alice", "f.yaml")
            job.slurm_jobs.append(SlurmJob(slurm_job_id="701", role=role, state="FAILED"))
            assert not settle_failure(session, job, tmp_path)


def _progress(directory: Path, job_id: int, slurm_id: str, steps: int, state: str, exit_code: int | None,
              at: float = 1.0) -> None:
    write_progress(progress_path(directory, str(job_id), slurm_id, 0), ProgressRecord(
        job_id=str(job_id), slurm_job_id=slurm_id, rank=0, gpu_type="t4", node="nodeb", steps_done=steps,
        samples_done=steps * 2, samples_per_second=4.0, epoch=0, updated_at=at, emulated=True, state=state,
        exit_code=exit_code))


def test_a_run_that_fails_after_the_command_finished_every_step_completes_the_job(tmp_path: Path) -> None:
    """Slurm 24.11 may requeue a preempted job once more after it completed; that run failing loses no work."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    progress = tmp_path / "progress"
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")  # work: 3 steps
        job.state = JobState.RUNNING
        _progress(progress, job.id, "800", 3, "done", 0)  # the run before: all 3 steps, exit 0
        _run(job, "801", "t4", tmp_path, "", seconds=5)
        assert settle_failure(session, job, progress)
        assert job.state is JobState.COMPLETED and job.reason == ""
        assert job.ended_at == T0 + timedelta(seconds=5)
        assert [p.role for p in job.slurm_jobs] == ["batch"]  # not retired: nothing is resubmitted
        (event,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "state").all()
        assert "Slurm job 801 ended FAILED after the command had finished all 3 steps" in event.message
        for steps, state, code in ((2, "done", 0), (3, "failed", 1), (3, "running", None)):
            other = create_job(session, SPEC, "alice", "f.yaml")  # not finished: a quick failure, retried
            other.state = JobState.RUNNING
            _progress(progress, other.id, "802", steps, state, code)
            _run(other, "803", "t4", tmp_path, "", seconds=5)
            assert settle_failure(session, other, progress)
            assert other.state is JobState.PENDING, (steps, state, code)


# --------------------------------------------------------------------------- a run that stopped on purpose, short


CKPT_SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 60}\n"
                      "checkpoint_dir: /ckpt/a\n", "f.yaml")[0]


def _completed(job: object, slurm_id: str) -> None:
    job.slurm_jobs.append(SlurmJob(  # type: ignore[attr-defined]
        slurm_job_id=slurm_id, role="batch", state="RUNNING", gpu_type="k80", gpu_count=1, started_at=T0,
        restarts=0))


def _done_in_slurm(slurm_id: str) -> SlurmView:
    """squeue's word for a run whose command exited 0: COMPLETED, 150 s after it started."""
    return SlurmView(queue=(QueueRecord(slurm_id, None, None, None, None, "j", "COMPLETED", "None", "",
                                        "alice", "nodec", start=T0, end=T0 + timedelta(seconds=150), exit_code="0:0"),))


def _stopped_and_synced(session: object, progress: Path, slurm_id: str, steps: int, stopped: str) -> Job:
    """A running job whose run stopped at ``steps`` of 60 (``stopped``) and exited 0, synced once."""
    job = create_job(session, CKPT_SPEC, "alice", "f.yaml")  # type: ignore[arg-type]
    job.state = JobState.RUNNING
    _completed(job, slurm_id)
    _progress(progress, job.id, slurm_id, steps, stopped, 0)
    assert sync_jobs(session, [job], _done_in_slurm(slurm_id), progress) == 1  # type: ignore[arg-type]
    return job


def test_a_run_out_of_timeout_requeues_is_failed_with_its_step_not_completed(tmp_path: Path) -> None:
    """It checkpointed at Slurm's time-limit warning and exited 0, so Slurm says COMPLETED: 40 of 60 steps."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = _stopped_and_synced(session, tmp_path / "progress", "901", 40, "timeout")
        assert job.state is JobState.FAILED
        assert job.reason == ("stopped at its time limit at step 40 of 60 with no timeout requeue left "
                              "(SLURMHET_MAX_TIMEOUT_REQUEUES); its checkpoint in /ckpt/a is kept: submit the spec "
                              "again with a longer time_limit to resume from it")
        (event,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "failed").all()
        assert event.data == {"slurm_job_ids": ["901"], "slurm_state": "COMPLETED", "exit_code": "0:0", "ran_s": 150.0,
                              "steps": 40, "total_steps": 60, "stopped": "timeout"}
        assert [p.role for p in job.slurm_jobs] == ["batch"]  # nothing is resubmitted


def test_a_preempted_run_slurm_did_not_requeue_is_re_planned_and_resumes(tmp_path: Path) -> None:
    """Its ``scontrol requeue`` failed (or the site forbids requeues): the work left is not the job's fault."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = _stopped_and_synced(session, tmp_path / "progress", "902", 25, "preempted")
        assert job.state is JobState.PENDING and job.started_at is None
        assert job.reason == ("its run stopped at step 25 of 60 (preempted) and Slurm did not requeue it; "
                              "re-planned, resumes from its checkpoint")
        assert [p.role for p in job.slurm_jobs] == ["retried"]  # the replanner submits it again
        (event,) = session.query(Event).filter(Event.job_id == job.id, Event.kind == "retried").all()
        assert event.data["stopped"] == "preempted" and event.data["steps"] == 25


def test_a_completed_run_is_left_completed_unless_its_last_run_stopped_short(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    progress = tmp_path / "progress"
    with db.transaction() as session:
        cases = (
            ((("903", 60, "done", 0, 1.0),), "COMPLETED"),  # the normal end
            ((("904", 30, "timeout", 0, 1.0), ("905", 60, "done", 0, 2.0)), "COMPLETED"),  # resumed, finished
            ((("906", 60, "done", 0, 1.0), ("907", 60, "preempted", 0, 2.0)), "COMPLETED"),  # a late requeue
            ((), "COMPLETED"),  # a command that reports no progress: Slurm's word stands
        )
        for runs, want in cases:
            job = create_job(session, CKPT_SPEC, "alice", "f.yaml")
            job.state = JobState.RUNNING
            for slurm_id, steps, state, code, at in runs:
                _progress(progress, job.id, slurm_id, steps, state, code, at)
            last = runs[-1][0] if runs else "908"
            _completed(job, last)
            sync_jobs(session, [job], _done_in_slurm(last), progress)
            assert job.state.value == want, runs
        member = create_job(session, CKPT_SPEC, "alice", "f.yaml")  # a pack's member is judged on its own run
        member.slurm_jobs.append(SlurmJob(slurm_job_id="909", role="pack", state="COMPLETED"))
        _progress(progress, member.id, "909", 10, "timeout", 0)
        assert settle_stopped(session, member, progress)
        assert member.state is JobState.FAILED and member.reason.startswith("stopped at its time limit at step 10")


# --------------------------------------------------------------------------- a pack: one Slurm job, several jobs


def _pack_member(session: object, progress: Path, reason: str, record: tuple[int, str, int | None, float] | None
                 ) -> Job:
    """A running member of pack 710, which ran an hour and ended FAILED (``reason``: sacct's word) with the
    first failing member's status, 3; ``record``: its own launcher's last (steps, state, exit, seconds in)."""
    job = create_job(session, CKPT_SPEC, "alice", "f.yaml")  # type: ignore[arg-type]
    job.state = JobState.RUNNING
    job.slurm_jobs.append(SlurmJob(slurm_job_id="710", role="pack", state="FAILED", reason=reason, exit_code="3:0",
                                   gpu_type="t4", gpu_count=1, started_at=T0, ended_at=T0 + timedelta(hours=1)))
    if record is not None:
        steps, state, code, seconds = record
        _progress(progress, job.id, "710", steps, state, code, at=(T0 + timedelta(seconds=seconds)).timestamp())
    return job


def test_each_member_of_a_failed_pack_is_judged_on_its_own_run(tmp_path: Path) -> None:
    """run-pack waits for every member and exits with the first failing one's status, so Slurm's FAILED, exit
    and hour-long run are the pack's: a member that finished is COMPLETED, one that crashed 12 s in is a
    start-up crash with its own exit, one that checkpointed on a signal is re-planned, one that failed late
    fails with its own exit. Before, every member took the pack's FAILED, finished work included."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    progress = tmp_path / "progress"
    with db.transaction() as session:
        done = _pack_member(session, progress, "FAILED", (60, "done", 0, 3000))
        crashed = _pack_member(session, progress, "FAILED", (0, "failed", 3, 12))
        stopped = _pack_member(session, progress, "FAILED", (25, "preempted", 0, 1800))
        late = _pack_member(session, progress, "FAILED", (40, "failed", 1, 2400))
        for job in (done, crashed, stopped, late):
            assert settle_failure(session, job, progress)
        assert done.state is JobState.COMPLETED and [p.role for p in done.slurm_jobs] == ["pack"]
        assert crashed.state is JobState.PENDING
        assert crashed.reason == "failed 12 s after it started (exit 3:0); retried once"
        assert stopped.state is JobState.PENDING and stopped.reason.startswith("its run stopped at step 25 of 60 "
                                                                              "(preempted)")
        assert late.state is JobState.FAILED and late.reason == "failed (exit 1:0)"
        (event,) = session.query(Event).filter(Event.job_id == late.id, Event.kind == "failed").all()
        assert (event.data["exit_code"], event.data["ran_s"]) == ("1:0", 2400.0)


def test_a_pack_member_is_judged_on_its_own_stderr_not_its_partners(tmp_path: Path) -> None:
    """The pack's stderr holds every member's lines: one member's CUDA out-of-memory beside another's own
    error made both look out of memory. run-pack copies each member's stderr to its own file too, and a
    member is judged on that: the one that ran out of memory is re-planned off its type, the other fails
    with its own lines. A pack from before (no own file) is still judged on the pack's."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    progress, logs = tmp_path / "progress", tmp_path / "logs"
    logs.mkdir()
    with db.transaction() as session:
        session.add(ClusterSnapshot(nodes={"nodec": {"gpus": {"k80": 2}}, "nodea": {"gpus": {"v100": 4}}}))
        oom, own, old = (create_job(session, CKPT_SPEC, "alice", "f.yaml") for _ in range(3))
        own_lines = {oom.id: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
                     own.id: "ValueError: bad label 7\n"}
        (logs / f"slurmhet-{oom.id}-720.err").write_text("".join(own_lines.values()))  # the pack's, shared
        for job_id, text in own_lines.items():
            (logs / f"slurmhet-{oom.id}-720.member-{job_id}.err").write_text(text)
        (logs / f"slurmhet-{old.id}-730.err").write_text("".join(own_lines.values()))  # an older pack's only
        for job, sid, first in ((oom, "720", oom.id), (own, "720", oom.id), (old, "730", old.id)):
            job.state = JobState.RUNNING
            job.slurm_jobs.append(SlurmJob(
                slurm_job_id=sid, role="pack", state="FAILED", reason="FAILED", exit_code="1:0", gpu_type="k80",
                gpu_count=1, started_at=T0, ended_at=T0 + timedelta(hours=1),
                argv=["sbatch", f"--output={logs}/slurmhet-{first}-%j.out", f"--error={logs}/slurmhet-{first}-%j.err"]))
            _progress(progress, job.id, sid, 40, "failed", 1, at=(T0 + timedelta(seconds=2400)).timestamp())
            assert settle_failure(session, job, progress)
        assert oom.state is JobState.PENDING and oom.reason == "GPU out of memory on k80 (12 GB); re-planned on v100"
        assert own.state is JobState.FAILED and own.reason == "failed (exit 1:0)"
        (event,) = session.query(Event).filter(Event.job_id == own.id, Event.kind == "failed").all()
        assert event.data["stderr_tail"] == ["ValueError: bad label 7"]
        assert event.data["stderr"] == str(logs / f"slurmhet-{oom.id}-720.member-{own.id}.err")
        assert old.state is JobState.PENDING and old.reason.startswith("GPU out of memory on k80")


def test_every_member_of_a_pack_that_lost_its_node_or_was_preempted_is_re_planned(tmp_path: Path) -> None:
    """NODE_FAIL or PREEMPTED ends every member's run through no fault of its own, however long it ran; a
    member with no record of this run (not started: the pack was signalled) too."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    progress = tmp_path / "progress"
    with db.transaction() as session:
        for reason in ("NODE_FAIL", "PREEMPTED"):
            for record in ((30, "running", None, 3500), None):
                job = _pack_member(session, progress, reason, record)
                assert settle_failure(session, job, progress)
                assert job.state is JobState.PENDING and "resumes from its checkpoint" in job.reason, (reason, record)
                assert [p.role for p in job.slurm_jobs] == ["retried"]
