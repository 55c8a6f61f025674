"""``after:`` handed to Slurm: which predecessors a dependant may chain to, how a dependant waiting on its
afterok is planned (not at all), and how a doomed one is cancelled in Slurm too (store rules, no Slurm)."""

from __future__ import annotations

from pathlib import Path

from slurmhet.spec import load_text
from slurmhet.store import Database, Job, JobState, SlurmJob, create_job
from slurmhet.submission import (IN_SLURM_AFTER, cancel_doomed, candidate_of, dependency_verdicts, final_slurm_jobs,
                                 with_verdicts)

SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml")[0]


def _job(session: object, state: JobState, *parts: SlurmJob, after: tuple[int, ...] = ()) -> Job:
    job = create_job(session, SPEC, "alice", "f.yaml")  # type: ignore[arg-type]
    job.state = state
    job.slurm_jobs += list(parts)
    if after:
        job.spec = {**job.spec, "after": list(after)}
    return job


def test_only_a_running_batch_job_or_sweep_task_is_a_final_slurm_job(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        batch = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="501", role="batch", state="RUNNING"),
                     SlurmJob(slurm_job_id="400", role="superseded", state="CANCELLED"))
        sweep = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="600", role="sweep", array_task=2,
                                                         state="RUNNING"))
        pending = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="700", role="batch", state="PENDING"))
        het = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="800", role="het", het_offset=0, state="RUNNING"),
                   SlurmJob(slurm_job_id="800", role="het", het_offset=1, state="RUNNING"))
        forked = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="900", role="array", array_task=0,
                                                          state="RUNNING"),
                      SlurmJob(slurm_job_id="901", role="consolidation", state="PENDING"))
        session.flush()
        assert [final_slurm_jobs(j) for j in (batch, sweep, pending, het, forked)] == [
            ("501",), ("600_2",), (), (), ()]
        eval_ = _job(session, JobState.PENDING, after=(batch.id, sweep.id))
        held = _job(session, JobState.PENDING, after=(batch.id, pending.id))
        session.flush()
        found = dependency_verdicts(session, [eval_, held])
        assert found.chained == {eval_.id: ("501", "600_2")}
        chained = with_verdicts(candidate_of(eval_), found)
        assert chained.after_ok == ("501", "600_2") and not chained.held  # planned now, emitted with afterok
        waits = with_verdicts(candidate_of(held), found)
        assert waits.held.startswith("waits for job") and not waits.after_ok


def test_a_dependant_waiting_on_its_afterok_holds_no_gpus_and_keeps_its_hold(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        train = _job(session, JobState.RUNNING, SlurmJob(slurm_job_id="501", role="batch", state="RUNNING"))
        session.flush()
        eval_ = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="502", role="batch", state="PENDING",
                                                           reason="Dependency"), after=(train.id,))
        eval_.plan = {"slots": [["nodeb", "t4", 1]]}
        session.flush()
        found = dependency_verdicts(session, [eval_])
        waiting = with_verdicts(candidate_of(eval_), found)
        assert waiting.current is None and waiting.held == IN_SLURM_AFTER and not waiting.after_ok
        eval_.slurm_jobs[0].reason = "Resources"  # released by Slurm: now an ordinary pending job, pinned
        assert candidate_of(eval_).current is not None and not candidate_of(eval_).held


def test_a_doomed_dependant_in_slurm_is_scancelled_before_it_is_marked(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    cancelled: list[list[str]] = []
    with db.transaction() as session:
        bad = _job(session, JobState.FAILED, SlurmJob(slurm_job_id="501", role="batch", state="FAILED"))
        session.flush()
        in_slurm = _job(session, JobState.SUBMITTED, SlurmJob(slurm_job_id="600", role="sweep", array_task=1,
                                                              state="PENDING", reason="DependencyNeverSatisfied"),
                        after=(bad.id,))
        held = _job(session, JobState.PENDING, after=(bad.id,))
        session.flush()
        found = dependency_verdicts(session, [in_slurm, held])
        actions = cancel_doomed(session, [in_slurm, held], found.doomed, cancelled.append)
        assert cancelled == [["600_1"]]  # its own array task, not the whole array
        assert in_slurm.state is held.state is JobState.CANCELLED
        assert in_slurm.slurm_jobs[0].state == "CANCELLED"
        assert in_slurm.reason == f"cancelled: job {bad.id} (a) it runs after ended FAILED"
        assert actions[0].endswith("cancelled Slurm job(s) 600_1") and "Slurm" not in actions[1]


def test_a_dependant_chained_to_a_run_that_can_no_longer_complete_is_taken_back() -> None:
    from types import SimpleNamespace

    from slurmhet.replan import dependency_lost

    def job(state: JobState, *parts: tuple[str, str, str]) -> object:
        return SimpleNamespace(state=state, slurm_jobs=[SimpleNamespace(role=r, state=s, reason=why,
                                                                        current=r not in ("superseded", "retried"))
                                                        for r, s, why in parts])

    assert dependency_lost(job(JobState.SUBMITTED, ("batch", "PENDING", "DependencyNeverSatisfied")))
    assert not dependency_lost(job(JobState.SUBMITTED, ("batch", "PENDING", "Dependency")))
    assert not dependency_lost(job(JobState.SUBMITTED, ("superseded", "CANCELLED", ""),
                                   ("batch", "RUNNING", "None")))
