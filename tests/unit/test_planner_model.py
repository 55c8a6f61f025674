"""Job model (seed 001 eqs. 6-7, 11-12), value objects and spec conversion."""

from __future__ import annotations

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.errors import InputError
from slurmhet.planner import POLICIES, Allocation, PlanJob, PlanningInput, plan_job_from_spec
from slurmhet.planner.model import (
    allreduce_seconds, equal_share_seconds, jain_fairness, realised_run_seconds, run_seconds, shard_weights,
)
from slurmhet.planner.pipeline import build_problem
from slurmhet.spec import load_text
from slurmhet.throughput import ThroughputTable

RATES = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"t4": 275.0, "v100": 644.0},
                                    "VGG-19 (batch size 64)": {"t4": 884.0, "v100": 1754.0}})


def test_allreduce_is_eq6() -> None:
    # 2 (K-1) D / (r K): 4 workers, 100 MB, 1.25 GB/s
    assert allreduce_seconds(100.0, 4, 1.25) == pytest.approx(2 * 3 * 0.1 / (1.25 * 4))
    assert allreduce_seconds(100.0, 1, 1.25) == 0.0


def test_run_time_is_compute_plus_communication() -> None:
    job = PlanJob("a", "ResNet-18 (batch size 64)", 1000.0, 10, model_size_mb=50.0, samples_per_sync=100.0)
    # 1000 samples at 500/s, 10 syncs of 2*(2-1)*0.05/(10*2) s
    assert run_seconds(job, 500.0, 2, 10.0) == pytest.approx(2.0 + 10 * 0.005)


def test_shard_weights_sum_to_one_and_follow_throughput() -> None:
    alloc = Allocation.of({("n1", "v100"): 2, ("n2", "t4"): 1})
    weights = shard_weights({"v100": 644.0, "t4": 275.0}, alloc)
    assert sum(weights) == pytest.approx(1.0)
    assert [r for r in alloc.ranks()] == [("n1", "v100"), ("n1", "v100"), ("n2", "t4")]
    assert weights[0] / weights[2] == pytest.approx(644.0 / 275.0)


def test_wrong_predictions_make_stragglers() -> None:
    inv = Inventory((Node("n", {"t4": 1, "v100": 1}),))
    job = PlanJob("a", "ResNet-18 (batch size 64)", 10_000.0, 64)
    alloc = Allocation.of({("n", "v100"): 1, ("n", "t4"): 1})
    true = {"v100": 644.0, "t4": 275.0}
    exact = realised_run_seconds(job, alloc, shard_weights(true, alloc), true, inv)
    assert exact == pytest.approx(10_000 / 919.0)
    assert realised_run_seconds(job, alloc, (0.5, 0.5), true, inv) == pytest.approx(5_000 / 275.0)


@pytest.mark.parametrize("field,value", [("samples_remaining", 0), ("global_batch", -1), ("model_size_mb", -5.0),
                                         ("min_gpus", 0), ("weight", 0.0), ("gpu_memory_gb", 0.0),
                                         ("time_limit_s", 0.0), ("time_limit_s", float("inf"))])
def test_bad_sizes_name_job_and_field(field: str, value: float) -> None:
    kwargs = {"samples_remaining": 100.0, "global_batch": 8, field: value}
    with pytest.raises(InputError) as err:
        PlanJob("job-x", "ResNet-18 (batch size 64)", **kwargs)  # type: ignore[arg-type]
    assert "job-x" in err.value.cause and err.value.place == f"job-x.{field}"


def test_jain_fairness_range() -> None:
    assert jain_fairness({"a": 2.0, "b": 2.0}, {"a": 1.0, "b": 1.0}) == pytest.approx(1.0)
    assert jain_fairness({"a": 1.0, "b": 100.0}, {"a": 1.0, "b": 1.0}) < 0.6
    assert equal_share_seconds(PlanJob("a", "w", 100.0, 10), 50.0, 4, 2, 1.0) == pytest.approx(100.0 * 2 / 50.0)


SPEC = """
jobs:
  - name: small
    workload: {model: resnet18, batch_size: 64}
    global_batch: 128
    command: [python, train.py]
    work: {epochs: 2, dataset_size: 50000}
    gpus: {min: 1, max: 4, types: [v100, t4]}
    weight: 2
    time_limit: "1:30"
  - name: custom
    workload: {model: MyNet, batch_size: 32}
    command: [python, train.py]
    work: {steps: 100}
    gpus: {min: 1, max: 2}
"""


def test_plan_job_from_spec() -> None:
    small, custom = load_text(SPEC, "jobs.yaml")
    job = plan_job_from_spec("17", small, 5.0, samples_done=10_000)
    assert job.workload == "ResNet-18 (batch size 64)"
    assert job.samples_remaining == 90_000 and job.samples_per_sync == 128 and job.samples_per_epoch == 50_000
    assert job.model_size_mb == pytest.approx(44.7) and job.allowed_types == ("v100", "t4") and job.weight == 2
    assert job.time_limit_s == 5_400.0  # Slurm ends it by then: what backfill may rely on
    with pytest.raises(InputError) as err:
        plan_job_from_spec("18", custom, 0.0)
    assert "custom" in err.value.cause and "model_size_mb" in err.value.cause


def _inp(*jobs: PlanJob, inventory: Inventory | None = None) -> PlanningInput:
    inv = inventory or Inventory((Node("a", {"v100": 2}), Node("b", {"t4": 2})))
    return PlanningInput(tuple(jobs), inv, RATES)


def test_contradictory_types_and_infeasible_min_are_refused() -> None:
    with pytest.raises(InputError) as err:
        build_problem(_inp(PlanJob("j1", "ResNet-18 (batch size 64)", 100.0, 8, allowed_types=("a100",))))
    assert "j1" in err.value.cause and err.value.place == "j1.gpus.types"
    with pytest.raises(InputError) as err:
        build_problem(_inp(PlanJob("j2", "ResNet-18 (batch size 64)", 100.0, 8, min_gpus=3, max_gpus=3,
                                   allowed_types=("v100",))))
    assert "j2" in err.value.cause and err.value.place == "j2.gpus.min"


def test_unknown_workload_without_prior_names_the_job() -> None:
    with pytest.raises(InputError) as err:
        POLICIES["slurmhet"](_inp(PlanJob("j3", "Mystery (batch size 4)", 100.0, 4)))
    assert "j3" in err.value.cause and err.value.place == "j3.workload"


def test_plan_reports_priors() -> None:
    table = RATES.merged(ThroughputTable.from_rates({"ResNet-18 (batch size 32)": {"v100": 600.0}}))
    inp = PlanningInput((PlanJob("p", "ResNet-18 (batch size 32)", 1e5, 32, allowed_types=("t4",)),),
                        Inventory((Node("b", {"t4": 2}),)), table)
    plan = POLICIES["slurmhet"](inp)
    assert plan.job("p").priors == ("t4",)


def test_render_rows_and_dict() -> None:
    import json

    from slurmhet.planner.render import HEADER, plan_dict, plan_rows

    jobs = (PlanJob("a", "ResNet-18 (batch size 64)", 1e6, 64, max_gpus=2),
            PlanJob("b", "VGG-19 (batch size 64)", 1e6, 64, max_gpus=2),
            PlanJob("c", "VGG-19 (batch size 64)", 1e7, 64, min_gpus=3, max_gpus=3))
    plan = POLICIES["slurmhet"](_inp(*jobs))
    rows = plan_rows(plan)
    assert len(rows) == 3 and all(len(r) == len(HEADER) for r in rows)
    waiting = [r for r in rows if r[2] == "-"]
    assert waiting and "waits" in waiting[0][-1]
    data = json.loads(json.dumps(plan_dict(plan)))
    assert {j["job"] for j in data["jobs"]} == {"a", "b", "c"}
    placed = [j for j in data["jobs"] if j["placement"]]
    assert all(sum(p["count"] for p in j["placement"]) == len(j["shard_weights"]) for j in placed)
