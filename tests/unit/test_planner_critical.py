"""Critical-path priorities (planner/critical.py), computed by hand, and their use by the live planner."""

from __future__ import annotations

import math

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import PlanJob, PlanningInput
from slurmhet.planner.critical import critical_ranks, fastest_packed, packed_allocation, with_critical_path
from slurmhet.spec import load_text
from slurmhet.submission import Candidate, plan_for
from slurmhet.throughput import ThroughputTable

#: Node a: 4 V100, node b: 2 V100, node c: 8 K80; inter-node 1 GB/s, intra-node infinite.
INVENTORY = Inventory((Node("a", {"v100": 4}), Node("b", {"v100": 2}), Node("c", {"k80": 8})), math.inf, 1.0)
TABLE = ThroughputTable.from_rates({"w": {"v100": 2.0, "k80": 1.0}})


def job(job_id: str, samples: float, gpus: int = 1, priority: int = 0, size_mb: float = 0.0) -> PlanJob:
    return PlanJob(id=job_id, workload="w", samples_remaining=samples, global_batch=gpus, model_size_mb=size_mb,
                   min_gpus=gpus, max_gpus=gpus, priority=priority)


def test_packed_allocation_takes_the_fewest_nodes_largest_first() -> None:
    assert packed_allocation(INVENTORY, "v100", 6).slots == (("a", "v100", 4), ("b", "v100", 2))
    assert packed_allocation(INVENTORY, "v100", 3).slots == (("a", "v100", 3),)
    assert packed_allocation(INVENTORY, "k80", 9) is None


def test_a_job_larger_than_a_node_is_timed_with_its_all_reduce() -> None:
    six = job("x", 600.0, gpus=6, size_mb=400.0)
    inp = PlanningInput((six,), INVENTORY, TABLE)
    # V100s: 4 + 2 on two nodes: 600 / 12 = 50 s of compute + 100 syncs x 2 x 5/6 x 0.4 GB / 1 GB/s = 116.7 s.
    # K80s: one node holds all 6: 600 / 6 = 100 s, no all-reduce between nodes. One node's V100 cell says 50 s.
    seconds, gpus = fastest_packed(six, inp)
    assert (seconds, gpus) == (pytest.approx(100.0), 6)


def test_an_elastic_job_is_timed_on_its_fastest_size() -> None:
    """gpus 1..6: V100 x1 300 s, x4 on node a 75 s, x6 over a and b 116.7 s; K80 x1 600 s, x6 100 s."""
    elastic = PlanJob(id="e", workload="w", samples_remaining=600.0, global_batch=6, model_size_mb=400.0,
                      min_gpus=1, max_gpus=6)
    seconds, gpus = fastest_packed(elastic, PlanningInput((elastic,), INVENTORY, TABLE))
    assert (seconds, gpus) == (pytest.approx(75.0), 4)
    # Its load is 75 s x 4 GPUs = 300 GPU-s: with a rigid 1-GPU job of 300 s (600 GPU-s) beside it the
    # bound is max(900 / 14, 300) = 300 s, so the elastic job (75 s) is not critical and the long one is.
    inp = PlanningInput((elastic, job("r", 600.0)), INVENTORY, TABLE)
    assert critical_ranks(inp) == {"r": 1}


def test_critical_jobs_rank_longest_first_and_user_priority_still_orders_first() -> None:
    # Times on the fastest type (V100, 2 samples/s): 100, 95, 92, 10, 10 s; load (307 s) / 14 GPUs = 21.9 s,
    # so the bound is the longest, 100 s, and jobs of >= 95 s are critical (92 s has 8% slack: not).
    jobs = (job("long", 200.0), job("near", 190.0), job("mid", 184.0), job("s1", 20.0), job("s2", 20.0, priority=1))
    inp = PlanningInput(jobs, INVENTORY, TABLE)
    assert critical_ranks(inp) == {"near": 1, "long": 2}
    merged = {j.id: j.priority for j in with_critical_path(inp).jobs}
    assert merged == {"long": 2, "near": 1, "mid": 0, "s1": 0, "s2": 6}  # 1 x (5 + 1) + 0: above every critical job
    assert with_critical_path(inp, math.inf) is inp


def test_the_live_planner_starts_the_critical_job_before_shorter_ones() -> None:
    """Two GPUs (a V100, a K80) and three jobs: WSPT alone starts the two short ones and leaves the
    long one to set the makespan; with the critical path it starts, on the V100."""
    def spec(name: str, steps: int):
        return load_text(f"name: {name}\ncommand: [x]\nworkload: {{model: ResNet-18, batch_size: 64}}\n"
                         f"work: {{steps: {steps}}}\n", f"{name}.yaml")[0]

    inventory = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))
    table = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"v100": 128.0, "k80": 64.0}})
    candidates = [Candidate(1, spec("long", 200), 0.0), Candidate(2, spec("s1", 20), 0.0),
                  Candidate(3, spec("s2", 20), 0.0)]
    plan = plan_for(candidates, inventory, table, "slurmhet", now=0.0)
    assert plan.job("1").allocation is not None and plan.job("1").allocation.slots == (("a", "v100", 1),)
    assert plan.job("3").allocation is None
    # The same queue under a policy without the critical path (seed 001's HAS): shortest first.
    assert plan_for(candidates, inventory, table, "has", now=0.0).job("1").allocation is None
