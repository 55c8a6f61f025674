"""Planning over stored jobs: pinned packs, drained types, overdue jobs queued in Slurm (slurmhet.submission)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from slurmhet.cluster import Inventory, Node
from slurmhet.config import Settings
from slurmhet.planner import Allocation, Plan
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import JobSpec, load_text
from slurmhet.store import Database, Job, JobState, SlurmJob, create_job
from slurmhet.submission import (Candidate, Dispatcher, candidate_of, dispatches, plan_for, queue_overdue,
                                 render_parts, running_allocation, stored_allocation, unplaceable)
from slurmhet.throughput import ThroughputTable

SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 50}\n"
                 "gpus: {types: [t4]}\n", "f.yaml")[0]
TABLE = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"t4": 100.0, "k80": 40.0}})


def test_running_pack_members_hold_their_gpu_once() -> None:
    inventory = Inventory((Node("nodeb", {"t4": 1}),))
    gpu = Allocation((("nodeb", "t4", 1),))
    members = [Candidate(1, SPEC, 0.0, gpu, pack="55"), Candidate(2, SPEC, 0.0, gpu, pack="55")]
    plan = plan_for([*members, Candidate(3, SPEC, 0.0)], inventory, TABLE, "slurmhet", now=0.0)
    assert plan.job("1").allocation == gpu
    assert plan.job("3").allocation is None and plan.job("3").wait_reason  # the one GPU is taken, once
    assert {jp.job_id for jp in plan.jobs} == {"1", "3"}


def test_jobs_whose_types_are_all_drained_wait_instead_of_failing_the_plan() -> None:
    inventory = Inventory((Node("nodeb", {"t4": 2}, state="drained"), Node("nodec", {"k80": 2})))
    other = load_text("name: b\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 50}\n",
                      "g.yaml")[0]
    candidates = [Candidate(1, SPEC, 0.0), Candidate(2, other, 0.0)]
    assert "have 0 usable GPU(s)" in unplaceable(candidates, inventory)[1]
    plan = plan_for(candidates, inventory, TABLE, "slurmhet", now=0.0)
    assert plan.job("2").allocation is not None and {jp.job_id for jp in plan.jobs} == {"2"}


def test_a_part_slurm_put_on_another_node_is_pinned_where_it_runs() -> None:
    planned = Allocation((("nodea", "v100", 2), ("nodeb", "t4", 1)))
    assert running_allocation(planned, [("v100", 2, "nodex")]) == Allocation((("nodeb", "t4", 1), ("nodex", "v100", 2)))
    assert running_allocation(planned, [("v100", 2, "nodea"), ("t4", 1, "")]) is planned  # as planned / not started
    assert running_allocation(planned, [("v100", 2, "node[x-y]"), ("t4", 1, "nodex,nodey")]) is planned  # several nodes
    assert running_allocation(planned, [("v100", 1, "nodex")]) is planned  # no planned slot of that shape
    twice = Allocation((("nodea", "t4", 1), ("nodeb", "t4", 1)))
    assert running_allocation(twice, [("t4", 1, "nodec")]) is twice  # which slot moved is unknown


def test_stored_allocation_follows_running_parts_only() -> None:
    job = Job(plan={"slots": [["nodea", "v100", 2]]}, slurm_jobs=[
        SlurmJob(slurm_job_id="7", role="batch", gpu_type="v100", gpu_count=2, nodes="nodex", state="RUNNING")])
    assert stored_allocation(job) == Allocation((("nodex", "v100", 2),))
    job.slurm_jobs[0].state = "PENDING"
    assert stored_allocation(job) == Allocation((("nodea", "v100", 2),))


def test_the_sites_wait_limit_keeps_a_free_gpu_for_an_overdue_wide_job() -> None:
    inventory = Inventory((Node("nodeb", {"t4": 2}),))
    wide = load_text("name: w\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 200}\n"
                     "gpus: {types: [t4], min: 2, max: 2}\n", "w.yaml")[0]
    running = Candidate(9, SPEC, 0.0, Allocation((("nodeb", "t4", 1),)))
    candidates = [running, Candidate(1, wide, 0.0), Candidate(2, SPEC, 7_000.0)]
    # Smaller GPU-time first: the narrow job takes the free t4 ...
    assert plan_for(candidates, inventory, TABLE, "slurmhet", now=7_200.0).job("2").allocation is not None
    # ... unless the wide one has waited longer than the limit: then the t4 is kept for it.
    plan = plan_for(candidates, inventory, TABLE, "slurmhet", now=7_200.0, max_wait_s=3_600.0)
    assert plan.job("2").allocation is None and plan.job("1").allocation is None
    assert "overdue" in (plan.job("1").wait_reason or "")


WIDE = load_text("name: w\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 200}\n"
                 "gpus: {types: [t4], min: 3, max: 3}\n", "w.yaml")[0]
PROFILE = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True)


def overdue_wide(spec: JobSpec, max_wait_s: float | None) -> tuple[Plan, frozenset[int], list[Candidate]]:
    # 2 of nodea's t4s and 2 of nodeb's 4 run our jobs: the overdue wide job (3 t4s) waits, and so does the
    # narrow one behind it (the 2 free t4s are kept).
    inventory = Inventory((Node("nodea", {"t4": 2}), Node("nodeb", {"t4": 4})))
    candidates = [Candidate(9, SPEC, 0.0, Allocation((("nodea", "t4", 2),))),
                  Candidate(8, SPEC, 0.0, Allocation((("nodeb", "t4", 2),))),
                  Candidate(1, spec, 0.0), Candidate(2, SPEC, 7_000.0)]
    plan = plan_for(candidates, inventory, TABLE, "slurmhet", now=7_200.0, max_wait_s=max_wait_s)
    ready = {c.job_id: c.spec for c in candidates if c.current is None}
    queued_plan, queued = queue_overdue(plan, candidates, ready, inventory, max_wait_s)
    return queued_plan, queued, candidates


def test_an_overdue_job_that_waits_is_queued_in_slurm_on_one_node_of_its_type_without_a_nodelist(
        tmp_path: Path) -> None:
    plan, queued, candidates = overdue_wide(WIDE, 3_600.0)
    assert queued == {1}
    wide = plan.job("1")
    assert wide.allocation == Allocation((("nodeb", "t4", 3),))  # the one node that holds 3 t4s
    assert "queued in Slurm for 3 x t4" in (wide.wait_reason or "")
    assert plan.job("2").allocation is None  # not overdue: it waits in the store
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    inventory = Inventory((Node("nodea", {"t4": 2}), Node("nodeb", {"t4": 4})))
    work = dispatches(plan, {1: WIDE, 2: SPEC}, PROFILE, settings, inventory, queued=queued)
    assert [d.job_ids for d in work] == [(1,)]
    [rendered] = render_parts(work[0].parts)
    argv = rendered["argv"]
    assert rendered["role"] == "batch"
    assert "--gres=gpu:t4:3" in argv and not any(a.startswith("--nodelist") for a in argv)


def test_no_job_is_queued_without_a_wait_limit_or_when_no_node_holds_its_minimum() -> None:
    assert overdue_wide(WIDE, None)[1] == frozenset()
    five = load_text("name: f\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 200}\n"
                     "gpus: {types: [t4], min: 5, max: 5}\n", "f.yaml")[0]
    plan, queued, _ = overdue_wide(five, 3_600.0)
    assert queued == frozenset() and plan.job("1").allocation is None
    assert "overdue" in (plan.job("1").wait_reason or "")


def test_only_a_plain_job_pending_in_slurm_that_never_started_is_queued(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        def stored(state: JobState, role: str = "batch", part_state: str = "PENDING", started: bool = False) -> Job:
            job = create_job(session, WIDE, "alice", "w.yaml")
            job.state, job.plan = state, {"slots": [["nodeb", "t4", 3]]}
            when = datetime(2026, 11, 27, tzinfo=timezone.utc) if started else None
            job.slurm_jobs.append(SlurmJob(slurm_job_id="70", role=role, state=part_state, started_at=when))
            return job

        jobs = [stored(JobState.SUBMITTED), stored(JobState.SUBMITTED, started=True),
                stored(JobState.SUBMITTED, role="pack"), stored(JobState.RUNNING, part_state="RUNNING"),
                stored(JobState.PENDING, part_state="CANCELLED")]
        session.flush()
        found = [candidate_of(j) for j in jobs]
    assert [c.queued for c in found] == [True, False, False, False, False]
    assert found[0].current == Allocation((("nodeb", "t4", 3),))  # held in the plan until overdue


def test_each_plan_stores_a_queued_jobs_new_forecast_and_keeps_the_slots_it_waits_on_in_slurm(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    queued_at = {"slots": [["nodeb", "t4", 3]], "start_s": 7_300.0, "finish_s": 7_400.0, "jct_s": 7_400.0,
                 "order": 0, "wait_reason": "queued then", "policy": "slurmhet"}
    with db.transaction() as session:
        job = create_job(session, WIDE, "alice", "w.yaml")
        job.state, job.plan, job.predicted_jct_s = JobState.SUBMITTED, dict(queued_at), 7_400.0
        job.slurm_jobs.append(SlurmJob(slurm_job_id="70", role="batch", state="PENDING"))
        session.flush()
        wide_id = job.id
    inventory = Inventory((Node("nodea", {"t4": 2}), Node("nodeb", {"t4": 4})))
    # Our two running jobs hold 4 of the 6 t4s until about 8,400 s: the queued job now starts later than it was
    # expected to when it was queued.
    candidates = [Candidate(9, SPEC, 0.0, Allocation((("nodea", "t4", 2),))),
                  Candidate(8, SPEC, 0.0, Allocation((("nodeb", "t4", 2),))),
                  Candidate(wide_id, WIDE, 0.0, Allocation((("nodeb", "t4", 3),)), queued=True)]
    settings = Settings(state_dir=tmp_path, database_url="sqlite://")
    dispatcher = Dispatcher(db, None, PROFILE, settings, None)  # type: ignore[arg-type]  # no Slurm command runs

    def stored() -> tuple[dict, float | None]:
        with db.transaction() as session:
            job = session.get(Job, wide_id)
            assert job is not None
            return dict(job.plan or {}), job.predicted_jct_s

    # Not overdue (no wait limit): the plan pins it on its slots, and its stored plan is left alone.
    pinned = plan_for(candidates, inventory, TABLE, "slurmhet", now=7_500.0)
    assert pinned.job(str(wide_id)).allocation is not None
    dispatcher.record_plan(pinned, [], queued=[wide_id])
    assert stored() == (queued_at, 7_400.0)
    # Overdue: it waits first in order on its t4s, and the store takes this plan's forecast.
    plan = plan_for(candidates, inventory, TABLE, "slurmhet", now=7_500.0, max_wait_s=3_600.0)
    forecast = plan.job(str(wide_id))
    assert forecast.allocation is None and forecast.start_s > 7_500.0
    dispatcher.record_plan(plan, [], queued=[wide_id])
    now_stored, predicted = stored()
    assert now_stored["slots"] == [["nodeb", "t4", 3]]  # what Slurm holds it on stays
    assert (now_stored["start_s"], now_stored["finish_s"], predicted) == (forecast.start_s, forecast.finish_s,
                                                                          forecast.jct_s)
    assert now_stored["start_s"] != queued_at["start_s"]
    assert "overdue" in now_stored["wait_reason"] and "queued in Slurm for 3 x t4" in now_stored["wait_reason"]
