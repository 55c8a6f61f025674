"""A dispatch cut off between sbatch and its record (the command killed, the store gone) whose Slurm job ended and
left the queue before any replan looked: sacct still has it, and it is adopted, not run a second time (the
store's mark, the sacct query over each series' recorded output, the adoption and its settling)."""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any, Sequence

import pytest
from sqlalchemy import select

from slurmhet.cluster import Inventory, Node
from slurmhet.config import Settings
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import load_text
from slurmhet.store import Database, JobState, create_job, get_job, list_jobs
from slurmhet.store.models import Event
from slurmhet.emit.multipart import expected_rows
from slurmhet.replan import owed_cancels
from slurmhet.slurm.parsers import QueueRecord, parse_sdiag_dbd_backlog
from slurmhet.submission import Candidate, Dispatcher, dispatches, next_round, plan_for
from slurmhet.sync import (CANCELLING, CLOCK_SLACK, DISPATCHING, adopt_ended, adopt_orphans, ask_slurm, cut_off_since,
                           forked_round, still_cut_off, sync_jobs)
from slurmhet.throughput import ThroughputTable
from tests.unit.recorded import Recorded
from tests.unit.test_sync_profile import FakeRunner

SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 50}\n"
                 "gpus: {types: [t4]}\n", "f.yaml")[0]
TABLE = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"t4": 100.0}})
PROFILE = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True)
STATES = (JobState.PENDING, JobState.SUBMIT_FAILED, JobState.SUBMITTED, JobState.RUNNING)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """The store on SQLite and on PostgreSQL: the mark's queries run on both."""
    if request.param == "sqlite":
        return Database(f"sqlite:///{tmp_path}/s.db")
    return Database(request.getfixturevalue("pg_store"))


def _marks(db: Database) -> list[int | None]:
    with db.snapshot() as session:
        return [e.job_id for e in session.scalars(select(Event).where(Event.kind == DISPATCHING))]


class Sbatch:
    """Answers sbatch with an id, noting what the store said while it ran; ``killed``: the command dies in it."""

    def __init__(self, db: Database, killed: bool = False) -> None:
        self.db, self.killed, self.seen = db, killed, []  # type: ignore[var-annotated]

    def submit(self, options: Sequence[str], script: str) -> str:
        self.seen.append(_marks(self.db))
        if self.killed:
            raise KeyboardInterrupt  # SIGINT/SIGKILL stand-in: nothing after this line of the command runs
        return "81"


def test_a_dispatch_is_marked_before_sbatch_runs_and_the_mark_goes_with_its_record(db: Database, tmp_path: Path
                                                                                   ) -> None:
    with db.transaction() as session:
        ids = [create_job(session, SPEC, "alice", "f.yaml").id for _ in range(2)]
    inventory = Inventory((Node("nodeb", {"t4": 2}),))
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    plan = plan_for([Candidate(i, SPEC, 0.0) for i in ids], inventory, TABLE, "slurmhet", now=0.0)
    first, second = dispatches(plan, {i: SPEC for i in ids}, PROFILE, settings, inventory, db.instance, table=TABLE)
    sbatch = Sbatch(db)
    [outcome] = Dispatcher(db, sbatch, PROFILE, settings, None).submit(first, plan)  # type: ignore[arg-type]
    assert outcome.state == "SUBMITTED" and sbatch.seen == [[first.job_ids[0]]] and _marks(db) == []
    with pytest.raises(KeyboardInterrupt):
        Dispatcher(db, Sbatch(db, killed=True), PROFILE, settings, None).submit(second, plan)  # type: ignore[arg-type]
    assert _marks(db) == [second.job_ids[0]]
    with db.snapshot() as session:
        cut_at = cut_off_since(session, "alice")
        assert cut_at is not None and cut_off_since(session, "bob") is None
        job = get_job(session, second.job_ids[0])
        assert job is not None and job.state is JobState.PENDING and job.slurm_jobs == []


def _recorded(rec: Recorded, tag: str, het_for: int, cancelled_for: int) -> dict[str, str]:
    """The series' recorded sacct, its het job (two components, COMPLETED) tagged for job ``het_for`` of this store
    and a cancelled job for ``cancelled_for``."""
    sacct = rec.read("sacct_parsable2_X.txt").replace("|slurmhet:fx-het|", f"|slurmhet:{het_for}@{tag}|") \
        .replace("|slurmhet:fx-running|", f"|slurmhet:{cancelled_for}@{tag}|")
    return {"squeue --all": '{"jobs": []}', "sacct --parsable2": sacct, "sdiag": rec.read("sdiag.txt")}


def test_a_cut_off_dispatch_whose_job_ended_and_left_the_queue_is_adopted_from_sacct_and_settled(
        rec: Recorded, db: Database, tmp_path: Path) -> None:
    with db.transaction() as session:
        ran, refused, waiting = (create_job(session, SPEC, "root", "f.yaml") for _ in range(3))
        session.flush()
        ran_id, refused_id, waiting_id = ran.id, refused.id, waiting.id
    runner = FakeRunner(_recorded(rec, db.instance, ran_id, refused_id))
    # No dispatch was cut off: sacct is not asked for the user's jobs.
    answers = ask_slurm(db, SlurmCli(runner), STATES, "root")
    assert answers.ended is None and [c[0] for c in runner.calls] == ["squeue"]
    cancelled = str(rec.ids["running_then_cancelled"])
    with db.transaction() as session:  # two dispatches were cut off: one's sbatch had run, one's had not
        session.add_all(Event(job_id=i, kind=DISPATCHING, message="", data={}) for i in (ran_id, refused_id))
        # An earlier dispatch of the other was refused at its second part; its first, tagged, was cancelled.
        session.add(Event(job_id=refused_id, kind="submit_failed", message="refused", data={"cancelled": [cancelled]}))
    with db.snapshot() as session:
        since = cut_off_since(session, "root")
    assert since is not None
    runner.calls.clear()
    answers = ask_slurm(db, SlurmCli(runner), STATES, "root")
    assert [c[0] for c in runner.calls][-2:] == ["sdiag", "sacct"]  # slurmdbd's backlog first: see SlurmAnswers
    assert answers.behind == 0
    [sacct] = [c for c in runner.calls if c[0] == "sacct"]
    assert sacct[sacct.index("--user") + 1] == "root" and "--jobs" not in sacct
    assert sacct[sacct.index("--starttime") + 1] == (since - CLOCK_SLACK).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    assert answers.ended is not None and not any(r.id.is_step for r in answers.ended)
    het = str(rec.ids["het"])
    with db.transaction() as session:
        jobs = list_jobs(session, states=STATES)
        assert adopt_orphans(session, jobs, answers.queue, db.instance, "root") == []  # squeue no longer lists it
        actions = adopt_ended(session, jobs, answers.ended, db.instance, "root", tmp_path)
        assert actions == [f"adopted Slurm job {het} for job {ran_id}"]
        by_id = {j.id: j for j in jobs}
        adopted = by_id[ran_id]
        # One part for the het job, as adopt_orphans records one found in the queue.
        assert [(p.slurm_job_id, p.het_offset, p.state) for p in adopted.slurm_jobs] == [(het, 0, "COMPLETED")]
        assert adopted.state is JobState.COMPLETED and adopted.ended_at is not None  # settled, not run again
        assert all(p.ended_at is not None and p.exit_code == "0:0" for p in adopted.slurm_jobs)
        # The cancelled part of a refused dispatch is no orphan, though tagged and not on record.
        assert by_id[refused_id].state is JobState.PENDING and by_id[refused_id].slurm_jobs == []
        assert by_id[waiting_id].state is JobState.PENDING
        (event,) = session.scalars(select(Event).where(Event.kind == "adopted")).all()
        assert event.message == f"Slurm job {het} found by its comment tag, ended COMPLETED"
    # Both marks are gone: one adopted, one looked for in squeue and sacct and not found (sbatch never took it).
    assert _marks(db) == []
    runner.calls.clear()
    assert ask_slurm(db, SlurmCli(runner), STATES, "root").ended is None and "sacct" not in {c[0] for c in runner.calls}
    with db.transaction() as session:  # a second pass changes nothing
        jobs = list_jobs(session, states=STATES)
        assert sync_jobs(session, jobs, answers.view, tmp_path) == 0
        assert adopt_ended(session, jobs, answers.ended, db.instance, "root", tmp_path) == []


def test_a_cut_off_dispatch_of_a_job_now_placed_is_not_looked_for(db: Database) -> None:
    """The mark counts on unplaced jobs only: a placed job's Slurm job is on record, whatever a mark says."""
    with db.transaction() as session:
        job = create_job(session, SPEC, "root", "f.yaml")
        job.state = JobState.SUBMITTED
        session.flush()
        session.add(Event(job_id=job.id, kind=DISPATCHING, message="", data={}))
    with db.snapshot() as session:
        assert cut_off_since(session, "root") is None


class Accepting:
    """sbatch that numbers jobs as Slurm does; killed at call ``kill_at``: the command dies there, after sbatch
    took that call's job (``took_it``) or before (not)."""

    def __init__(self, kill_at: int, took_it: bool) -> None:
        self.kill_at, self.took_it, self.accepted = kill_at, took_it, []  # type: ignore[var-annotated]

    def submit(self, options: Sequence[str], script: str) -> str:
        slurm_id = str(200 + len(self.accepted))
        if len(self.accepted) == self.kill_at:
            if self.took_it:
                self.accepted.append(slurm_id)
            raise KeyboardInterrupt
        self.accepted.append(slurm_id)
        return slurm_id


def _forked_dispatch(db: Database, tmp_path: Path) -> tuple[int, Any, Settings]:
    """A forkable job planned on nodea's v100, forked onto the idle t4 and k80 too: arrays and a consolidation."""
    from tests.unit.test_forking import INVENTORY, TABLE as RATES_TABLE, _jp, _plan, _spec

    spec = _spec()
    with db.transaction() as session:
        job_id = create_job(session, spec, "alice", "f.yaml").id
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    plan = _plan(_jp(str(job_id), (("nodea", "v100", 1),)))
    [dispatch] = dispatches(plan, {job_id: spec}, PROFILE, settings, INVENTORY, db.instance, table=RATES_TABLE)
    assert dispatch.fork is not None and [p.role for p in dispatch.parts][-1] == "consolidation"
    return job_id, (dispatch, plan), settings


def _in_queue(slurm_ids: Sequence[str], roles: Sequence[str], tasks: Sequence[Sequence[int]], tag: str
              ) -> list[QueueRecord]:
    """squeue's records of what sbatch took: each array task on its own, running; a consolidation waiting."""
    out = []
    for slurm_id, role, indices in zip(slurm_ids, roles, tasks):
        if role == "array":
            out += [QueueRecord(f"{int(slurm_id) + 50 + i}", None, None, slurm_id, i, "j", "RUNNING", "", tag, "alice",
                                "nodeb") for i in indices]
        else:
            out.append(QueueRecord(slurm_id, None, None, None, None, "j", "PENDING", "Dependency", tag, "alice", ""))
    return out


def test_a_cut_off_forked_round_is_adopted_as_its_round_and_a_half_submitted_one_is_cancelled(
        db: Database, tmp_path: Path) -> None:
    """Killed as sbatch took its consolidation, a forked round was adopted as one plain job: its copies ended, the
    job read COMPLETED with steps left. Now every copy and the consolidation are recorded as the dispatch would
    have (roles, round, tasks, the pinned copies), and the Job Tracker judges the round. Killed between its
    arrays and its consolidation, the copies in Slurm are retired and cancelled: no round runs unconsolidated."""
    job_id, (dispatch, plan), settings = _forked_dispatch(db, tmp_path)
    fork, roles = dispatch.fork, [p.role for p in dispatch.parts]
    tasks = [[row.get("array_task") for row in rows] for rows in expected_rows(dispatch.parts, [job_id])[job_id]]
    tag = f"slurmhet:{job_id}@{db.instance}"
    sbatch = Accepting(kill_at=len(roles) - 1, took_it=True)
    with pytest.raises(KeyboardInterrupt):
        Dispatcher(db, sbatch, PROFILE, settings, None).submit(dispatch, plan)  # type: ignore[arg-type]
    assert _marks(db) == [job_id] and len(sbatch.accepted) == len(roles)
    queue = _in_queue(sbatch.accepted, roles, tasks, tag)
    with db.transaction() as session:
        [job] = list_jobs(session, states=STATES)
        actions = adopt_orphans(session, [job], queue, db.instance, "alice")
        assert actions == [f"adopted Slurm job {i} for job {job_id}" for i in sbatch.accepted]
        assert job.state is JobState.SUBMITTED
        got = [(p.slurm_job_id, p.role, p.round, p.array_task) for p in job.slurm_jobs]
        assert got == [(slurm_id, role, fork.round, task)
                       for slurm_id, role, indices in zip(sbatch.accepted, roles, tasks) for task in indices]
        assert all(p.state == "RUNNING" for p in job.slurm_jobs if p.role == "array")
        last = forked_round(job)
        assert last is not None and last.slurm_job_id == sbatch.accepted[-1] and last.state == "PENDING"
        dependency = "--dependency=afterany:" + ":".join(sbatch.accepted[:-1])
        assert last.argv[0] == "sbatch" and dependency in last.argv, last.argv  # as sbatch was called
        assert job.plan["forked"] == fork.record() and job.plan["slots"] == [list(s) for s in fork.slots]
        assert next_round(job) == fork.round + 1
        kinds = [e.kind for e in session.scalars(select(Event).where(Event.job_id == job_id))]
        assert "forked" in kinds and DISPATCHING not in kinds
    with db.transaction() as session:  # a second pass changes nothing
        [job] = list_jobs(session, states=STATES)
        assert adopt_orphans(session, [job], queue, db.instance, "alice") == []

    # Killed before sbatch took the consolidation: the arrays alone are in Slurm.
    job_id, (dispatch, plan), settings = _forked_dispatch(db, tmp_path)
    tag = f"slurmhet:{job_id}@{db.instance}"
    sbatch = Accepting(kill_at=len(roles) - 1, took_it=False)
    with pytest.raises(KeyboardInterrupt):
        Dispatcher(db, sbatch, PROFILE, settings, None).submit(dispatch, plan)  # type: ignore[arg-type]
    queue = _in_queue(sbatch.accepted, roles, tasks, tag)
    with db.transaction() as session:
        job = get_job(session, job_id)
        assert job is not None
        [action] = adopt_orphans(session, [job], queue, db.instance, "alice")
        assert action.startswith(f"job {job_id}: Slurm job(s) {','.join(sbatch.accepted)} found by their comment tag "
                                 f"are {len(sbatch.accepted)} of the {len(roles)}")
        assert job.state is JobState.PENDING and forked_round(job) is None and next_round(job) == 0
        assert [(p.slurm_job_id, p.role, p.state) for p in job.slurm_jobs] == [
            (i, "superseded", CANCELLING) for i in sbatch.accepted]
        assert owed_cancels([job], queue) == sbatch.accepted  # replan cancels them before it dispatches again
        # Settled: slurmdbd lagging changes nothing for it, and it is not held back.
        assert adopt_ended(session, [job], [], db.instance, "alice", tmp_path, behind=3) == []
        assert still_cut_off(session, [job]) == set() and job.reason == ""
    assert _marks(db) == []


class TimingOut:
    """sbatch that takes the job and times out before answering, with squeue down too: nobody can tell."""

    def __init__(self) -> None:
        self.accepted: list[str] = []

    def submit(self, options: Sequence[str], script: str) -> str:
        from slurmhet.slurm.runner import SlurmCommandError

        self.accepted.append("300")
        raise SlurmCommandError(["sbatch", *options], None, "", "", note="timed out after 8 s")

    def queue(self, job_ids: object = None) -> list[QueueRecord]:
        from slurmhet.slurm.runner import SlurmCommandError

        raise SlurmCommandError(["squeue"], 1, "", "slurm_load_jobs error: Socket timed out")


def test_a_dispatch_sbatch_may_have_taken_without_answering_keeps_its_mark_until_slurm_says(
        db: Database, tmp_path: Path) -> None:
    """sbatch timed out and squeue could not say either: SUBMIT_FAILED, maybe submitted. The mark stays, so the
    next replan looks for the job in squeue and, once it has left the queue, in sacct: found, it is adopted as the
    dispatch's part; not found in either, the mark goes and the job is dispatched again as before."""
    with db.transaction() as session:
        ids = [create_job(session, SPEC, "alice", "f.yaml").id for _ in range(2)]
    inventory = Inventory((Node("nodeb", {"t4": 2}),))
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    plan = plan_for([Candidate(i, SPEC, 0.0) for i in ids], inventory, TABLE, "slurmhet", now=0.0)
    for dispatch in dispatches(plan, {i: SPEC for i in ids}, PROFILE, settings, inventory, db.instance, table=TABLE):
        dispatcher = Dispatcher(db, TimingOut(), PROFILE, settings, None)  # type: ignore[arg-type]
        [outcome] = dispatcher.submit(dispatch, plan)
        assert outcome.state == "SUBMIT_FAILED" and outcome.reason.startswith("timed out after 8 s"), outcome
    assert sorted(i for i in _marks(db) if i is not None) == ids
    took, did_not = ids
    ran = QueueRecord("300", None, None, None, None, "a", "RUNNING", "", f"slurmhet:{took}@{db.instance}", "alice",
                      "nodeb")
    with db.transaction() as session:
        jobs = list_jobs(session, states=STATES)
        assert adopt_orphans(session, jobs, [ran], db.instance, "alice") == [f"adopted Slurm job 300 for job {took}"]
        assert adopt_ended(session, jobs, [], db.instance, "alice", tmp_path) == []  # sacct has no other
        by_id = {j.id: j for j in jobs}
        assert by_id[took].state is JobState.SUBMITTED
        assert [(p.slurm_job_id, p.role, p.gpu_type, p.state) for p in by_id[took].slurm_jobs] == [
            ("300", "batch", "t4", "RUNNING")]
        assert by_id[did_not].state is JobState.SUBMIT_FAILED and by_id[did_not].slurm_jobs == []
    assert _marks(db) == []


def test_while_slurmdbd_is_behind_a_cut_off_dispatch_not_found_keeps_its_mark_and_is_not_dispatched_again(
        rec: Recorded, db: Database, tmp_path: Path) -> None:
    """slurmctld still holds records for slurmdbd (sdiag's DBD Agent queue), as after slurmdbd was away: sacct may
    not list the cut-off dispatch's job yet, so not finding it proves nothing. Its mark stays and its job waits;
    once the backlog is gone, a job sacct does not list was never taken, and it is dispatched again."""
    with db.transaction() as session:
        job_id = create_job(session, SPEC, "root", "f.yaml").id
        session.add(Event(job_id=job_id, kind=DISPATCHING, message="", data={}))
    answers = _recorded(rec, db.instance, 0, 0)
    sdiag = answers["sdiag"]
    assert parse_sdiag_dbd_backlog(sdiag) == 0
    lagging = re.sub(r"(?m)^DBD Agent queue size:\s*0$", "DBD Agent queue size: 12", sdiag)
    assert parse_sdiag_dbd_backlog(lagging) == 12 and parse_sdiag_dbd_backlog("Server thread count: 3\n") is None
    behind = ask_slurm(db, SlurmCli(FakeRunner({**answers, "sdiag": lagging})), STATES, "root")
    assert behind.behind == 12 and behind.ended is not None
    with db.transaction() as session:
        jobs = list_jobs(session, states=STATES)
        [action] = adopt_ended(session, jobs, behind.ended, db.instance, "root", tmp_path, behind.behind)
        assert action == (f"job {job_id}: its dispatch was cut off and slurmdbd is 12 record(s) behind: not "
                          "dispatched again until sacct can say whether sbatch took it")
        assert still_cut_off(session, jobs) == {job_id} and jobs[0].state is JobState.PENDING
    assert _marks(db) == [job_id]
    caught_up = ask_slurm(db, SlurmCli(FakeRunner(answers)), STATES, "root")
    with db.transaction() as session:
        jobs = list_jobs(session, states=STATES)
        assert adopt_ended(session, jobs, caught_up.ended, db.instance, "root", tmp_path, caught_up.behind) == []
        assert still_cut_off(session, jobs) == set()
    assert _marks(db) == []
    # sdiag refused (or a Slurm that does not print the figure): sacct is taken as it stands, as before.
    with db.transaction() as session:
        session.add(Event(job_id=job_id, kind=DISPATCHING, message="", data={}))
    refusing = FakeRunner(answers, fail="sdiag")
    unknown = ask_slurm(db, SlurmCli(refusing), STATES, "root")
    assert [c[0] for c in refusing.calls][-2:] == ["sdiag", "sacct"] and unknown.behind == 0
    assert unknown.ended is not None
