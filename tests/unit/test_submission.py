"""Planning over stored jobs: pinned packs, drained types (pure parts of slurmhet.submission)."""

from __future__ import annotations

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import Allocation
from slurmhet.spec import load_text
from slurmhet.store import Job, SlurmJob
from slurmhet.submission import Candidate, plan_for, running_allocation, stored_allocation, unplaceable
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
