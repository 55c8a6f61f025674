"""Start-up cost: charged in the job model and the planner, learned by EWMA from progress records, stored."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
from alembic import command
from sqlalchemy import inspect, select, text

from slurmhet.cluster import Inventory, Node
from slurmhet.errors import InputError
from slurmhet.planner import POLICIES, Allocation, PlanJob, PlanningInput, plan_job_from_spec, run_seconds
from slurmhet.policies.default import SlurmhetOverTime
from slurmhet.planner.model import epoch_seconds
from slurmhet.planner.problem import Problem
from slurmhet.runtime.progress import ProgressRecord, ProgressReporter, read_record
from slurmhet.sim import SimConfig, run_policies
from slurmhet.sim.traces import TraceJob
from slurmhet.spec import load_text
from slurmhet.startup import STARTUP_PRIOR_S, StartupCosts, fold_startup, learned_startup
from slurmhet.store import Database, SlurmJob, create_job
from slurmhet.store.db import _alembic_config, make_engine
from slurmhet.store.models import StartupObservation, ThroughputObservation
from slurmhet.submission import Candidate, plan_for, plan_record
from slurmhet.throughput import ThroughputTable

from tests.unit.sim_rates import tiny

WORKLOAD = "ResNet-18 (batch size 64)"
SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: resnet18, batch_size: 64}\nwork: {steps: 100}\n"
                 "global_batch: 64\n", "f.yaml")[0]
T0 = datetime(2026, 11, 21, 13, 0, tzinfo=timezone.utc)


# --------------------------------------------------------------------------- job model and planner


def test_run_seconds_adds_startup_but_epochs_do_not() -> None:
    plain = PlanJob("a", WORKLOAD, 1000.0, 10, samples_per_epoch=500.0)
    slow = PlanJob("a", WORKLOAD, 1000.0, 10, samples_per_epoch=500.0, startup_s=7.5)
    assert run_seconds(plain, 500.0, 1, 10.0) == 2.0
    assert run_seconds(slow, 500.0, 1, 10.0) == 9.5
    assert epoch_seconds(slow, 500.0, 1, 10.0) == epoch_seconds(plain, 500.0, 1, 10.0) == 1.0


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_startup_must_be_finite_and_not_negative(value: float) -> None:
    with pytest.raises(InputError) as err:
        PlanJob("job-x", WORKLOAD, 100.0, 8, startup_s=value)
    assert err.value.place == "job-x.startup_s"


def test_spec_jobs_pay_startup_only_when_not_running() -> None:
    assert plan_job_from_spec("1", SPEC, 0.0, startup_s=4.0).startup_s == 4.0
    running = Allocation.of({("n", "v100"): 1})
    assert plan_job_from_spec("1", SPEC, 0.0, current=running, startup_s=4.0).startup_s == 0.0


def test_allocator_cost_and_plan_include_startup() -> None:
    inv = Inventory((Node("n", {"v100": 1}),))
    table = ThroughputTable.from_rates({WORKLOAD: {"v100": 640.0}})
    job = PlanJob("a", WORKLOAD, 6400.0, 64, startup_s=3.0)
    problem = Problem((job,), ("v100",), ("n",), capacity=np.array([[1]]), rates=np.array([[640.0]]),
                      intra_gbps=10.0, inter_gbps=1.0)
    assert problem.run_time(0, 640.0, 1, True) == 13.0
    plan = POLICIES["slurmhet"](PlanningInput((job,), inv, table, now=100.0)).job("a")
    assert plan.run_seconds == 13.0 and plan.finish_s == 113.0 and plan.jct_s == 113.0
    assert plan.epoch_seconds == 10.0


def test_plan_for_charges_learned_or_prior_startup_to_unplaced_jobs_only() -> None:
    inv = Inventory((Node("n", {"v100": 2}),))
    table = ThroughputTable.from_rates({WORKLOAD: {"v100": 640.0}})
    fresh = Candidate(1, SPEC, 0.0)
    running = Candidate(2, SPEC, 0.0, current=Allocation.of({("n", "v100"): 1}))
    assert plan_for([fresh, running], inv, table, "slurmhet", 0.0).job("1").run_seconds == 10.0
    prior = plan_for([fresh, running], inv, table, "slurmhet", 0.0, startup=StartupCosts())
    assert prior.job("1").run_seconds == 10.0 + STARTUP_PRIOR_S and prior.job("2").run_seconds == 10.0
    learned = StartupCosts({WORKLOAD: 2.0})
    assert plan_for([fresh], inv, table, "slurmhet", 0.0, startup=learned).job("1").run_seconds == 12.0
    assert learned.for_spec(SPEC) == (2.0, False) and StartupCosts().for_spec(SPEC) == (STARTUP_PRIOR_S, True)
    record = plan_record(prior.job("1"), "slurmhet", StartupCosts().for_spec(SPEC))
    assert record["startup_s"] == STARTUP_PRIOR_S and record["startup_prior"] is True


# --------------------------------------------------------------------------- learning


def _record(job_id: str, slurm_job_id: str, rank: int, started_at: float | None) -> ProgressRecord:
    return ProgressRecord(job_id=job_id, slurm_job_id=slurm_job_id, rank=rank, gpu_type="v100", node="n",
                          steps_done=5, samples_done=320, samples_per_second=100.0, epoch=0, updated_at=0.0,
                          emulated=False, started_at=started_at)


def test_fold_learns_first_record_once_per_slurm_job_by_ewma(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")
        job.slurm_jobs += [SlurmJob(slurm_job_id="10", role="het", het_offset=0, started_at=T0),
                           SlurmJob(slurm_job_id="10", role="het", het_offset=1, started_at=T0),
                           SlurmJob(slurm_job_id="11", started_at=T0),
                           SlurmJob(slurm_job_id="12")]  # pending: no Slurm start yet
        session.flush()
        jid, t0 = str(job.id), T0.timestamp()
        records = [_record(jid, "10", 0, t0 + 12.0), _record(jid, "10", 1, t0 + 10.0),  # the first record counts
                   _record(jid, "11", 0, t0 + 20.0), _record(jid, "12", 0, t0 + 3.0),
                   _record("999", "10", 0, t0 + 1.0)]  # another job's
        workloads = {jid: "resnet18 (batch size 64)"}
        folded = fold_startup(session, [job], records, workloads, alpha=0.5)
        assert folded == [(WORKLOAD, 10.0), (WORKLOAD, 20.0)]
        assert {p.slurm_job_id: p.startup_s for p in job.slurm_jobs} == {"10": 10.0, "11": 20.0, "12": None}
        # Once per Slurm job: the same records again change nothing.
        assert fold_startup(session, [job], records, workloads, alpha=0.5) == []
    with db.transaction() as session:
        obs = session.get(StartupObservation, WORKLOAD)
        assert obs is not None and obs.seconds == 0.5 * 20.0 + 0.5 * 10.0 and obs.samples == 2
        assert learned_startup(session).of("resnet18 (batch size 64)") == (15.0, False)
        assert learned_startup(session).of("VGG-19 (batch size 64)") == (STARTUP_PRIOR_S, True)


def test_fold_skips_negative_and_missing_start_times_and_naive_store_times(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")
        job.slurm_jobs += [SlurmJob(slurm_job_id="10", started_at=T0.replace(tzinfo=None))]  # as SQLite returns it
        session.flush()
        jid, t0 = str(job.id), T0.timestamp()
        workloads = {jid: WORKLOAD}
        # A record of an earlier run (requeue) or a skewed clock: before the Slurm start.
        assert fold_startup(session, [job], [_record(jid, "10", 0, t0 - 5.0)], workloads, 0.3) == []
        assert fold_startup(session, [job], [_record(jid, "10", 0, None)], workloads, 0.3) == []
        assert job.slurm_jobs[0].startup_s is None and session.get(StartupObservation, WORKLOAD) is None
        # Left for a later record of this run.
        assert fold_startup(session, [job], [_record(jid, "10", 0, t0 + 4.0)], workloads, 0.3) == [(WORKLOAD, 4.0)]


def test_reporter_stamps_its_start(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    reporter = ProgressReporter(path, _record("1", "10", 0, None))
    reporter.update(steps_done=1, samples_done=64, epoch=0, rank_samples=64)
    written = read_record(path)
    assert written is not None and written.started_at is not None and written.started_at > 0


# --------------------------------------------------------------------------- migration


def test_migration_adds_startup_on_a_fresh_store(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    inspector = inspect(db.engine)
    assert "startup_observations" in inspector.get_table_names()
    assert "startup_s" in {c["name"] for c in inspector.get_columns("slurm_jobs")}
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0005"


def test_migration_upgrades_an_existing_0002_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    engine = make_engine(url)
    command.upgrade(_alembic_config(engine), "0002")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO throughput_observations VALUES ('w', 'v100', 1.5, 3, '2026-11-21')"))
        conn.execute(text("INSERT INTO jobs (name, owner, spec, source, state, reason, attempts, created_at, "
                          "updated_at) VALUES ('a', 'alice', '{}', '', 'RUNNING', '', 1, '2026-11-21', '2026-11-21')"))
        conn.execute(text("INSERT INTO slurm_jobs (job_id, slurm_job_id, role, round, gpu_count, nodes, state, "
                          "reason, alloc_tres, submitted_at, argv) VALUES (1, '10', 'batch', 0, 1, 'n', 'RUNNING', "
                          "'', '', '2026-11-21', '[]')"))
    engine.dispose()
    db = Database(url)
    with db.transaction() as session:
        old = session.get(ThroughputObservation, ("w", "v100"))
        assert old is not None and old.samples_per_s == 1.5 and old.source == "ewma"  # 0004: earlier rows were EWMA
        part = session.scalars(select(SlurmJob)).one()
        assert part.slurm_job_id == "10" and part.startup_s is None
        assert part.restarts == 0  # 0005: parts stored before it were never seen requeued
        assert list(session.scalars(select(StartupObservation))) == []


# --------------------------------------------------------------------------- simulator


def test_simulator_tells_the_planner_the_start_cost_it_charges() -> None:
    """Two jobs, one GPU: the plan made at their arrival predicts both simulated JCTs, start-ups included."""
    inventory = Inventory((Node("n", {"v100": 1}),), intra_node_gbps=10.0, inter_node_gbps=1.0)
    jobs = [TraceJob(1, "m", 1, arrival=0.0, total_steps=100.0), TraceJob(2, "m", 1, arrival=0.0, total_steps=40.0)]
    predicted: list[dict[str, float]] = []

    class Watching(SlurmhetOverTime):
        def decide(self, view):  # type: ignore[no-untyped-def]
            if view.now == 0.0:
                predicted.append({jp.job_id: jp.jct_s for jp in POLICIES["slurmhet"](self.planning_input(view)).jobs})
            return super().decide(view)

    for start_s in (0.0, 7.0):
        predicted.clear()
        run = run_policies(jobs, inventory, tiny({"m": {"v100": 2.0}}), {"slurmhet": Watching()},
                           SimConfig(start_s=start_s)).runs["slurmhet"]
        simulated = {str(r.job_id): r.finish - r.arrival for r in run.records}
        # Shortest first: job 2 runs 20 s after its start-up, then job 1 its 50 s after its own.
        assert simulated == {"2": pytest.approx(20.0 + start_s), "1": pytest.approx(70.0 + 2 * start_s)}
        assert predicted == [{k: pytest.approx(v) for k, v in simulated.items()}]
