"""HadarE's Job Forker (slurmhet/forking.py) on hand-made plans: pure, no Slurm."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from slurmhet.cluster import Inventory, Node
from slurmhet.emit.from_plan import EmitSettings, requests_for
from slurmhet.emit.requests import ArrayRequest, ConsolidationRequest
from slurmhet.forking import ForkedJob, divide_round_steps, idle_gpus, job_forker, round_steps
from slurmhet.planner.model import Allocation, JobPlan, Plan
from slurmhet.replan import job_tracker
from slurmhet.slurm.profile import SiteProfile
from slurmhet.spec import GpuRequest, JobSpec, Workload
from slurmhet.store import Database, Job, JobState, SlurmJob, create_job
from slurmhet.submission import next_round
from slurmhet.throughput import ThroughputTable

RATES = {"v100": 1600.0, "t4": 800.0, "k80": 400.0}
TABLE = ThroughputTable.from_rates({"mlp-small (batch size 64)": RATES})
PROFILE = SiteProfile("22.05.8", True, 1001, 10**6, "gres", False, True, True)
INVENTORY = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2})))


def _spec(name: str = "j", *, sync: str = "local-sgd", checkpoint_dir: str | None = "/ckpt", steps: int = 1000,
          gpus: GpuRequest = GpuRequest(1, 1)) -> JobSpec:
    return JobSpec(name=name, workload=Workload("mlp-small", 64), global_batch=64, command=("train",), steps=steps,
                   sync=sync, checkpoint_dir=checkpoint_dir, gpus=gpus, model_size_mb=1.0)


def _jp(job_id: str, slots: tuple[tuple[str, str, int], ...] | None, order: int = 0) -> JobPlan:
    return JobPlan(job_id, Allocation(slots) if slots else None, (), 1.0, 1.0, 0.0, 1.0, 1.0, order,
                   wait_reason=None if slots else "waiting")


def _plan(*jobs: JobPlan) -> Plan:
    return Plan("hadar", tuple(jobs))


def _used(plan: Plan, forks: dict[str, ForkedJob]) -> Counter[tuple[str, str]]:
    """GPUs held per (node, type): the plan's allocations, with forked jobs' copies instead."""
    used: Counter[tuple[str, str]] = Counter()
    for jp in plan.jobs:
        slots = forks[jp.job_id].slots if jp.job_id in forks else (jp.allocation.slots if jp.allocation else ())
        for node, gpu_type, count in slots:
            used[(node, gpu_type)] += count
    return used


def test_idle_gpus_are_what_the_plan_leaves() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 3),)), _jp("2", None, 1))
    assert idle_gpus(plan, INVENTORY) == {("nodea", "v100"): 1, ("nodeb", "t4"): 4, ("nodec", "k80"): 2}
    assert idle_gpus(plan, INVENTORY, busy_nodes={"nodeb"}) == {("nodea", "v100"): 1, ("nodec", "k80"): 2}


def test_idle_nodes_get_copies_with_throughput_proportional_steps() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    forks = job_forker(plan, INVENTORY, TABLE, {1: _spec()}, round_s=10)
    fork = forks["1"]
    # The planned gang is copy 0; one copy per other node, fastest first.
    assert [c.slots[0] for c in fork.copies] == [("nodea", "v100", 1), ("nodeb", "t4", 1), ("nodec", "k80", 1)]
    # Round: 10 s x (1600 + 800 + 400) samples/s / 64 per step = 437 steps, split 4:2:1.
    assert fork.total_round_steps == 437 == sum(fork.round_steps)
    assert fork.round_steps == (250, 125, 62)
    assert fork.rates == (1600.0, 800.0, 400.0)
    assert fork.round == 0


def test_round_steps_are_capped_by_the_steps_left() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    fork = job_forker(plan, INVENTORY, TABLE, {1: _spec(steps=1000)}, steps_done={1: 930}, rounds={1: 3},
                      round_s=10)["1"]
    assert sum(fork.round_steps) == 70 and fork.round == 3
    assert round_steps(2800, 10, 64, 10_000) == 437
    assert round_steps(2800, 10, 64, 5) == 5
    assert round_steps(1, 1, 64, 5) == 1  # a round trains at least one step


@pytest.mark.parametrize("total,rates", [(437, (1600, 800, 400)), (7, (3, 3, 3)), (1, (5, 1)), (100, (1, 1, 1)),
                                         (13, (0.3, 0.7))])
def test_divided_steps_sum_to_the_round_and_follow_throughput(total: int, rates: tuple[float, ...]) -> None:
    steps = divide_round_steps(total, rates)
    assert sum(steps) == total
    for s, r in zip(steps, rates):
        assert abs(s - total * r / sum(rates)) < 1  # largest remainder: within one step of the exact share


def test_no_capacity_overcommit_across_jobs() -> None:
    # Two forkable jobs started now, two-GPU copies, one waiting forkable job with one-GPU copies.
    plan = _plan(_jp("1", (("nodea", "v100", 2),), 0), _jp("2", (("nodeb", "t4", 2),), 1), _jp("3", None, 2))
    two = GpuRequest(1, 2)
    forks = job_forker(plan, INVENTORY, TABLE, {1: _spec(gpus=two), 2: _spec(gpus=two), 3: _spec()}, round_s=60)
    used = _used(plan, forks)
    capacity = {(n.name, t): c for n in INVENTORY.nodes for t, c in n.gpus.items()}
    assert all(used[k] <= capacity[k] for k in used), used
    # HadarE's rule, one copy at a time to the job that would finish last (samples left / samples/s):
    # job 3 waits (infinite) and takes a v100 on nodea (now 64,000 / 1,600 = 40 s); jobs 2 and 3 tie at
    # 40 s and at a gain of 800/s (k80 x2 on nodec vs one t4 on nodeb), so job 2, the earlier, takes
    # nodec's k80s (26.7 s); job 3 takes a t4 on nodeb (26.7 s). Nothing left fits: nodea keeps one
    # v100, nodeb one t4, and job 1 (20 s, the first to finish) gets no copy.
    assert "1" not in forks
    assert [c.slots[0] for c in forks["2"].copies] == [("nodeb", "t4", 2), ("nodec", "k80", 2)]
    assert [c.slots[0] for c in forks["3"].copies] == [("nodea", "v100", 1), ("nodeb", "t4", 1)]
    assert forks["2"].round_steps == (667, 333)  # 1,000 steps left at 1,600 : 800 samples/s
    for fork in forks.values():
        assert len({c.slots[0][0] for c in fork.copies}) == len(fork.copies)  # one copy per node


def test_a_waiting_forkable_job_runs_as_copies_on_idle_gpus() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 4),)), _jp("2", None, 1))
    fork = job_forker(plan, INVENTORY, TABLE, {2: _spec()}, round_s=10)["2"]
    assert [c.slots[0] for c in fork.copies] == [("nodeb", "t4", 1), ("nodec", "k80", 1)]


def test_non_forkable_jobs_are_untouched() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)), _jp("2", None, 1))
    ready = {1: _spec(sync="allreduce"), 2: _spec(sync="allreduce")}
    assert job_forker(plan, INVENTORY, TABLE, ready, round_s=10) == {}


def test_jobs_without_checkpoint_dir_are_never_forked() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    assert job_forker(plan, INVENTORY, TABLE, {1: _spec(checkpoint_dir=None)}, round_s=10) == {}


def test_no_fork_without_a_second_copy() -> None:
    full = _plan(_jp("1", (("nodea", "v100", 1),)), _jp("9", (("nodeb", "t4", 4),), 1), _jp("8", (("nodec", "k80", 2),), 2))
    assert job_forker(full, INVENTORY, TABLE, {1: _spec()}, round_s=10) == {}  # the cluster is otherwise busy
    gang = _plan(_jp("1", (("nodea", "v100", 1), ("nodeb", "t4", 1))))
    assert job_forker(gang, INVENTORY, TABLE, {1: _spec()}, round_s=10) == {}  # a multi-node gang stays one
    one_step = _plan(_jp("1", (("nodea", "v100", 1),)))
    assert job_forker(one_step, INVENTORY, TABLE, {1: _spec(steps=1)}, round_s=10) == {}
    # Foreign jobs on nodeb and nodec: no copies there.
    assert job_forker(one_step, INVENTORY, TABLE, {1: _spec()}, round_s=10, busy_nodes={"nodeb", "nodec"}) == {}


def test_slow_copies_that_would_get_no_step_are_dropped() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    fork = job_forker(plan, INVENTORY, TABLE, {1: _spec(steps=100)}, steps_done={1: 97}, round_s=10)["1"]
    # 3 steps over rates 4:2:1 -> 2,1,0: the k80 copy is dropped, 3 steps over 2:1.
    assert [c.slots[0][1] for c in fork.copies] == ["v100", "t4"] and fork.round_steps == (2, 1)


def test_max_copies_limits_the_fork() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    fork = job_forker(plan, INVENTORY, TABLE, {1: _spec()}, round_s=10, max_copies=2)["1"]
    assert [c.slots[0][1] for c in fork.copies] == ["v100", "t4"]


def test_forked_job_emits_one_array_per_step_share_with_round_steps() -> None:
    plan = _plan(_jp("1", (("nodea", "v100", 1),)))
    fork = job_forker(plan, INVENTORY, TABLE, {1: _spec()}, rounds={1: 2}, round_s=10)["1"]
    settings = EmitSettings(log_dir="/logs", launcher=("run",), slurmhet=("slurmhet",),
                            after_consolidation=("slurmhet", "replan", "--once"))
    parts = requests_for(1, _spec(), plan.jobs[0], PROFILE, settings, copies=fork.copies, round=fork.round,
                         round_steps=fork.round_steps)
    arrays = [p.request for p in parts if isinstance(p.request, ArrayRequest)]
    consolidation = parts[-1].request
    assert isinstance(consolidation, ConsolidationRequest) and consolidation.round == 2
    assert consolidation.copy_tasks == (0, 1, 2) and consolidation.then == ("slurmhet", "replan", "--once")
    assert [(a.shape.gpu_type, a.chunk.first_index, dict(a.plan_env)["SLURMHET_ROUND_STEPS"]) for a in arrays] == [
        ("v100", 0, "250"), ("t4", 1, "125"), ("k80", 2, "62")]
    script = arrays[1].materialize().script
    assert "SLURMHET_ROUND_STEPS=125" in script and "SLURMHET_ROUND=2" in script


def _forked_job(session: Session, state: JobState, consolidation_state: str, round_no: int = 0) -> Job:
    job = create_job(session, _spec(steps=120), "alice", "f.yaml")
    job.state = state
    job.plan = {"slots": [["nodea", "v100", 1], ["nodeb", "t4", 1]], "forked": {"round": round_no}}
    job.slurm_jobs += [SlurmJob(slurm_job_id="10", role="array", array_task=0, round=round_no, state="COMPLETED"),
                       SlurmJob(slurm_job_id="11", role="array", array_task=1, round=round_no, state="COMPLETED"),
                       SlurmJob(slurm_job_id="12", role="consolidation", round=round_no, state=consolidation_state,
                                ended_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
                                if consolidation_state == "COMPLETED" else None)]
    session.flush()
    return job


def test_job_tracker_advances_a_consolidated_round_and_closes_a_finished_job(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        running = _forked_job(session, JobState.RUNNING, "RUNNING")
        left = _forked_job(session, JobState.RUNNING, "COMPLETED")  # the sync leaves a forked round open
        done = _forked_job(session, JobState.RUNNING, "COMPLETED", round_no=1)
        inside = _forked_job(session, JobState.RUNNING, "RUNNING")
        steps = {str(running.id): 87, str(left.id): 87, str(done.id): 120, str(inside.id): 87}
        events, actions = job_tracker(session, [running, left, done], steps, False, None)
        assert running.state is JobState.RUNNING  # its round still runs: not re-dispatched
        assert left.state is JobState.PENDING and next_round(left) == 1
        assert done.state is JobState.COMPLETED  # ended when its last consolidation did, not at this replan
        assert done.ended_at is not None and done.ended_at.replace(tzinfo=timezone.utc) == datetime(
            2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
        assert f"job {left.id} (j) round 0 consolidated at step 87" in events
        assert actions == [f"plan round 1 of job {left.id}: 33 steps left"]
        # The consolidation's own `then` replan (SLURM_JOB_ID = the consolidation) may advance at once.
        job_tracker(session, [inside], steps, False, "12")
        assert inside.state is JobState.PENDING
        # Idempotent: a second pass changes nothing.
        assert job_tracker(session, [running, done], steps, False, None) == ([], [])
