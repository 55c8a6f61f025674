"""A forked round's consolidation that a fault cut off (its node failed, it was preempted, and Slurm did not requeue
it) runs again on the copies' checkpoints, instead of failing the whole job (store rules, the rendered request and
the dispatcher with a fake sbatch; the real cluster's case is in tests/cluster/test_node_failure_cluster.py)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from sqlalchemy import select

from slurmhet.cluster import Inventory, Node
from slurmhet.config import Settings
from slurmhet.emit.requests import Common, ConsolidationRequest
from slurmhet.replan import CONSOLIDATION_RUNS, MAX_SUBMIT_ATTEMPTS, job_tracker, lost_rounds
from slurmhet.slurm.parsers import AccountingRecord, QueueRecord, parse_sacct_parsable
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import load_text
from slurmhet.store import Database, Job, JobState, SlurmJob, add_event, create_job, get_job
from slurmhet.store.models import Event
from slurmhet.submission import Dispatcher
from slurmhet.sync import SlurmView, adopt_lost_rerun, forked_round, lost_consolidation, sync_jobs

SPEC = load_text("name: forked\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 30}\n"
                 "sync: local-sgd\ncheckpoint_dir: /ckpt/forked\n", "f.yaml")[0]
PROFILE = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True)
T1 = datetime(2026, 12, 7, 5, tzinfo=timezone.utc)


def _forked(session: object, consolidation: str, reason: str = "") -> Job:
    """A job in round 1: two copies over, its consolidation (Slurm job 12) ended ``consolidation``."""
    job = create_job(session, SPEC, "alice", "f.yaml")  # type: ignore[arg-type]
    job.state = JobState.RUNNING
    job.plan = {"slots": [["nodea", "v100", 1], ["nodeb", "t4", 1]],
                "forked": {"round": 1, "copies": [["nodea", "v100", 1], ["nodeb", "t4", 1]]}}
    job.slurm_jobs += [
        SlurmJob(slurm_job_id="11", role="array", round=1, array_task=0, state="COMPLETED"),
        SlurmJob(slurm_job_id="11", role="array", round=1, array_task=1, state="COMPLETED"),
        SlurmJob(slurm_job_id="12", role="consolidation", round=1, state=consolidation, reason=reason, ended_at=T1,
                 argv=["sbatch", "--parsable", "--partition=gpu-v100,gpu-t4", "--dependency=afterany:11"]),
    ]
    return job


def _sacct(job_id: str, state: str, exit_code: str) -> AccountingRecord:
    (record,) = parse_sacct_parsable(f"{job_id}|{job_id}|forked|{state}|{exit_code}|2026-12-07T04:59:00|"
                                     "2026-12-07T05:00:00|2026-12-07T05:00:09|00:00:09|billing=1|nodeb|"
                                     "slurmhet:1|alice|gpu")
    return record


def test_a_consolidation_cut_off_by_a_fault_keeps_its_job_open_and_one_that_failed_fails_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        for state, exit_code, lost in (("NODE_FAIL", "0:0", True), ("PREEMPTED", "0:15", True),
                                       ("BOOT_FAIL", "0:0", True), ("FAILED", "1:0", False)):
            job = _forked(session, "RUNNING")
            session.flush()
            sync_jobs(session, [job], SlurmView(accounting=(_sacct("12", state, exit_code),)), tmp_path)
            assert (lost_consolidation(job) is not None) is lost, state
            # Cut off: left open for the Job Tracker, which runs it again; its own failure (no copy left a
            # checkpoint, say) still fails the job.
            assert job.state is (JobState.RUNNING if lost else JobState.FAILED), state


def test_the_tracker_runs_it_again_then_fails_the_job_after_its_last_run(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = _forked(session, "FAILED", "NODE_FAIL")
        done = _forked(session, "COMPLETED")
        session.flush()
        # The Job Tracker does not take a lost round as consolidated (no next round on an unaveraged model).
        events, actions = job_tracker(session, [job], {str(job.id): 20}, False, None)
        assert (events, actions) == ([], [])
        assert lost_rounds(session, [job, done], dry_run=True) == (
            [], [f"job {job.id} (forked): round 1's consolidation, Slurm job 12, ended NODE_FAIL (run 1)"],
            [f"would run round 1's consolidation of job {job.id} again"])
        again, _, actions = lost_rounds(session, [job, done], dry_run=False)
        assert (again, actions) == ([job.id], [])
        for _ in range(CONSOLIDATION_RUNS - 1):  # each run again recorded, each cut off once more
            add_event(session, job, "consolidated_again", "x", round=1)
        add_event(session, job, "consolidated_again", "x", round=0)  # an earlier round's runs do not count
        again, events, actions = lost_rounds(session, [job], dry_run=False)
        assert again == [] and job.state is JobState.FAILED and job.ended_at == T1
        assert events[0].endswith(f"(run {CONSOLIDATION_RUNS})") and actions[0].startswith(f"failed job {job.id}")
        assert "/ckpt/forked" in job.reason


class FakeSbatch:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.submitted: list[tuple[tuple[str, ...], str]] = []

    def submit(self, options: Sequence[str], script: str) -> str:
        from slurmhet.slurm.runner import SlurmCommandError

        if self.refuse:
            raise SlurmCommandError(["sbatch"], 1, "", "sbatch: error: Invalid partition name specified")
        self.submitted.append((tuple(options), script))
        return "40"

    def cancel(self, job_ids: Sequence[str]) -> None:
        raise AssertionError("nothing to cancel")


def test_the_dispatcher_runs_the_same_consolidation_again_with_nothing_to_wait_for(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job_id = _forked(session, "FAILED", "NODE_FAIL").id
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    inventory = Inventory((Node("nodea", {"v100": 1}), Node("nodeb", {"t4": 1})))
    sbatch = FakeSbatch()
    dispatcher = Dispatcher(db, sbatch, PROFILE, settings, None)  # type: ignore[arg-type]
    action = dispatcher.consolidate_again(job_id, inventory)
    assert action == (f"job {job_id} (forked): round 1's consolidation, Slurm job 12, ended NODE_FAIL; run again as "
                      "Slurm job 40 on the copies' checkpoints")
    [(options, script)] = sbatch.submitted
    assert not [o for o in options if o.startswith("--dependency")]  # the copies are over
    assert "--partition=gpu-v100,gpu-t4" in options and f"--comment=slurmhet:{job_id}@{db.instance}" in options
    assert 'for task in 0 1; do' in script and "consolidate --skip-bad" in script and "# Again: a fault" in script
    with db.snapshot() as session:
        job = get_job(session, job_id)
        assert job is not None
        assert [(p.slurm_job_id, p.role, p.round) for p in job.slurm_jobs][2:] == [("12", "retried", 1),
                                                                                  ("40", "consolidation", 1)]
        assert lost_consolidation(job) is None and job.state is JobState.RUNNING
        (event,) = session.scalars(select(Event).where(Event.kind == "consolidated_again")).all()
        assert event.data["round"] == 1 and event.data["lost"] == "12"
    # Refused: nothing retired, the refusal is an event, and the next replan tries again.
    with db.transaction() as session:
        job_id = _forked(session, "FAILED", "PREEMPTED").id
    refusing = Dispatcher(db, FakeSbatch(refuse=True), PROFILE, settings, None)  # type: ignore[arg-type]
    action = refusing.consolidate_again(job_id, inventory)
    assert action.startswith(f"job {job_id}: round 1's consolidation not submitted again (")
    with db.snapshot() as session:
        job = get_job(session, job_id)
        assert job is not None and lost_consolidation(job) is not None
        assert job.reason == ("round 1's consolidation could not be run again: sbatch: error: Invalid partition "
                              "name specified")
    # Accepted at the next replan: the reason goes, as the job runs its round's consolidation again.
    action = Dispatcher(db, FakeSbatch(), PROFILE, settings, None).consolidate_again(job_id, inventory)  # type: ignore
    assert action.endswith("run again as Slurm job 40 on the copies' checkpoints")
    with db.snapshot() as session:
        job = get_job(session, job_id)
        assert job is not None and job.reason == "" and lost_consolidation(job) is None


def test_a_run_again_that_sbatch_keeps_refusing_fails_the_job_after_max_submit_attempts(tmp_path: Path) -> None:
    """Each replan tries the refused run again, as it would a job's refused dispatch, up to MAX_SUBMIT_ATTEMPTS;
    then the job is FAILED with sbatch's last words instead of being submitted for ever. A refusal sbatch may have
    taken without answering does not count (the next replan looks for it by its tag), and a run that went through
    starts the count again."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job_id = _forked(session, "FAILED", "NODE_FAIL").id
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    inventory = Inventory((Node("nodea", {"v100": 1}), Node("nodeb", {"t4": 1})))
    refusing = Dispatcher(db, FakeSbatch(refuse=True), PROFILE, settings, None)  # type: ignore[arg-type]

    def replan() -> tuple[list[int], list[str]]:
        """One replan's lost_rounds, then its run again of what it returned."""
        with db.transaction() as session:
            job = get_job(session, job_id)
            assert job is not None
            again, _, actions = lost_rounds(session, [job], dry_run=False)
        for i in again:
            refusing.consolidate_again(i, inventory)
        return again, actions

    with db.transaction() as session:  # counted since the round's last run: an earlier lost run went through
        job = get_job(session, job_id)
        assert job is not None
        add_event(session, job, "submit_failed", "round 1's consolidation again: an older refusal", round=1)
        add_event(session, job, "consolidated_again", "x", round=1)
        add_event(session, job, "submit_failed", "round 1's consolidation again: no answer", round=1,
                  maybe_submitted=True)  # found by its tag or not: not a refusal
    for _ in range(MAX_SUBMIT_ATTEMPTS):
        assert replan() == ([job_id], [])
    again, actions = replan()
    assert again == [] and len(actions) == 1, actions
    with db.snapshot() as session:
        job = get_job(session, job_id)
        assert job is not None and job.state is JobState.FAILED and job.ended_at == T1
        assert job.reason == (f"round 1's consolidation, Slurm job 12, ended NODE_FAIL: its run again was refused "
                              f"{MAX_SUBMIT_ATTEMPTS} times (MAX_SUBMIT_ATTEMPTS), last: round 1's consolidation "
                              "again: sbatch: error: Invalid partition name specified; the copies' checkpoints and "
                              "the last average are kept in /ckpt/forked"), job.reason
        assert actions == [f"failed job {job_id} (forked): {job.reason}"]
        refusals = session.scalars(select(Event).where(Event.kind == "submit_failed")).all()
        assert len(refusals) == MAX_SUBMIT_ATTEMPTS + 2


def test_a_consolidation_run_again_waits_for_nothing_and_a_first_one_must_wait() -> None:
    common = Common(job_id=7, name="forked", log_dir="/logs")
    again = ConsolidationRequest(common, ("slurmhet",), "/ckpt", (0, 1), round=2, again=True).materialize()
    assert not [a for a in again.argv if a.startswith("--dependency")] and "# Again: a fault" in again.script
    first = ConsolidationRequest(common, ("slurmhet",), "/ckpt", (0, 1), after=("11",), round=2).materialize()
    assert "--dependency=afterany:11" in first.argv and "Again" not in first.script


class TimingOutSbatch(FakeSbatch):
    """sbatch gave no answer and squeue failed too: the rerun may be in Slurm, under an id nobody was told."""

    def submit(self, options: Sequence[str], script: str) -> str:
        from slurmhet.slurm.runner import SlurmCommandError

        self.submitted.append((tuple(options), script))
        raise SlurmCommandError(["sbatch"], None, "", "timed out after 30 s")

    def queue(self) -> list[QueueRecord]:
        from slurmhet.slurm.runner import SlurmCommandError

        raise SlurmCommandError(["squeue"], None, "", "timed out after 30 s")


def _queued(job_id: str, tag: str, user: str = "alice", array: str | None = None) -> QueueRecord:
    return QueueRecord(job_id, None, None, array, 0 if array else None, "forked", "RUNNING", "", tag, user, "nodeb")


def test_a_rerun_sbatch_may_have_accepted_is_found_by_its_tag_and_not_run_a_third_time(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job_id = _forked(session, "FAILED", "NODE_FAIL").id
        other_id = _forked(session, "FAILED", "NODE_FAIL").id  # its rerun was refused outright: nothing to find
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    inventory = Inventory((Node("nodea", {"v100": 1}), Node("nodeb", {"t4": 1})))
    sbatch = TimingOutSbatch()
    action = Dispatcher(db, sbatch, PROFILE, settings, None).consolidate_again(job_id, inventory)  # type: ignore
    assert action.startswith(f"job {job_id}: round 1's consolidation not submitted again (")
    Dispatcher(db, FakeSbatch(refuse=True), PROFILE, settings, None).consolidate_again(other_id, inventory)  # type: ignore
    [(options, _)] = sbatch.submitted
    tag = f"slurmhet:{job_id}@{db.instance}"
    assert f"--comment={tag}" in options
    queue = [_queued("41", tag, user="bob"),  # another user's job with the same tag is not ours
             _queued("43", f"slurmhet:{job_id},{other_id}@{db.instance}"),  # a sweep's tag names several jobs
             _queued("44", tag, array="44"),  # an array is a round's copies, not its consolidation
             _queued("12", tag),  # the lost run itself, still listed by squeue: already on record
             _queued("45", f"slurmhet:{other_id}@{db.instance}"),
             _queued("42", tag)]
    with db.transaction() as session:
        jobs = [get_job(session, job_id), get_job(session, other_id)]
        actions = adopt_lost_rerun(session, jobs, queue, db.instance, "alice")  # type: ignore[arg-type]
        job = jobs[0]
        assert job is not None
        assert actions == [f"adopted Slurm job 42 for job {job_id}: round 1's consolidation, Slurm job 12, ended "
                           "NODE_FAIL; its run again, Slurm job 42, found by its comment tag"]
        assert job.reason == ""  # it said the rerun could not be submitted
        assert [(p.slurm_job_id, p.role, p.round, p.state) for p in job.slurm_jobs][2:] == [
            ("12", "retried", 1, "FAILED"), ("42", "consolidation", 1, "RUNNING")]
        part = forked_round(job)
        assert part is not None and part.slurm_job_id == "42" and lost_consolidation(job) is None
        assert "--partition=gpu-v100,gpu-t4" in part.argv and not [a for a in part.argv if "--dependency" in a]
        # Not run again: this replan runs inside that rerun (its ``then`` step), so the round is consolidated.
        assert lost_rounds(session, jobs, dry_run=False)[0] == [other_id]  # type: ignore[arg-type]
        events, actions = job_tracker(session, [job], {str(job_id): 20}, False, "42")
        assert actions == [f"plan round 2 of job {job_id}: 10 steps left"] and job.state is JobState.PENDING
        # The adopted run counts as a run of round 1's consolidation, toward CONSOLIDATION_RUNS.
        runs = session.scalars(select(Event).where(Event.job_id == job_id, Event.kind == "consolidated_again"))
        assert [(e.data["round"], e.data["adopted"]) for e in runs] == [(1, True)]
    with db.transaction() as session:  # a second look finds nothing more to adopt
        jobs = [get_job(session, job_id), get_job(session, other_id)]
        assert adopt_lost_rerun(session, jobs, queue, db.instance, "alice") == []  # type: ignore[arg-type]
