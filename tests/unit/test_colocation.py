"""Co-location (seed 002): eq. (4.1) speedup, Algorithm 2 grouping, memory and threshold limits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import POLICIES, Allocation, ColocationSettings, PlanJob, PlanningInput, speedup
from slurmhet.throughput import ColocationProfile, ThroughputTable

GAVEL = ThroughputTable.gavel()
ONE_V100 = Inventory((Node("n", {"v100": 1}, gpu_memory_gb={"v100": 16.0}),))


def small(job_id: str, workload: str, memory: float = 4.0, colocate: bool = True, work: float = 1e6) -> PlanJob:
    batch = int(workload.rsplit(" ", 1)[1].rstrip(")"))
    return PlanJob(job_id, workload, work, batch, max_gpus=1, colocate=colocate, gpu_memory_gb=memory)


def plan_for(*jobs: PlanJob, table: ThroughputTable = GAVEL, settings: ColocationSettings | None = None):
    inp = PlanningInput(tuple(jobs), ONE_V100, table, colocation=settings or ColocationSettings())
    return POLICIES["slurmhet"](inp)


def test_measured_pair_gives_eq_4_1() -> None:
    a, b = small("a", "ResNet-18 (batch size 64)"), small("b", "Recommendation (batch size 512)")
    delta, slow, source = speedup([a, b], "v100", GAVEL, ColocationSettings())
    own, partner = GAVEL.colocated(a.workload, b.workload, "v100")
    t = [64 / GAVEL.rate(a.workload, "v100"), 512 / GAVEL.rate(b.workload, "v100")]
    assert delta == pytest.approx(sum(t) / max(64 / own, 512 / partner))
    assert slow[0] == pytest.approx(GAVEL.rate(a.workload, "v100") / own) and source.startswith("measured")


def test_waiting_job_joins_a_compatible_gpu_under_mps() -> None:
    plan = plan_for(small("a", "ResNet-18 (batch size 64)"), small("b", "Recommendation (batch size 512)"))
    a, b = plan.job("a"), plan.job("b")
    assert a.colocation_group == b.colocation_group is not None
    assert a.needs_mps and b.needs_mps and b.wait_reason is None
    assert a.allocation == b.allocation
    own, partner = GAVEL.colocated("ResNet-18 (batch size 64)", "Recommendation (batch size 512)", "v100")
    assert a.run_seconds == pytest.approx(1e6 / own)  # each member runs at its measured co-located rate
    assert b.run_seconds == pytest.approx(1e6 / partner)


def test_groups_never_exceed_gpu_memory() -> None:
    plan = plan_for(small("a", "ResNet-18 (batch size 64)", memory=10.0),
                    small("b", "Recommendation (batch size 512)", memory=10.0))
    assert sum(jp.allocation is None for jp in plan.jobs) == 1
    assert {jp.colocation_group for jp in plan.jobs} == {None}


def test_no_group_below_the_threshold() -> None:
    plan = plan_for(small("a", "ResNet-50 (batch size 16)"), small("b", "Recommendation (batch size 8192)"))
    assert {plan.job("a").colocation_group, plan.job("b").colocation_group} == {None}


def test_only_jobs_that_allow_it() -> None:
    plan = plan_for(small("a", "ResNet-18 (batch size 64)"),
                    small("b", "Recommendation (batch size 512)", colocate=False))
    assert plan.job("a").allocation is None and plan.job("a").wait_reason  # b holds the GPU and does not share


def test_metrics_model_stops_before_slowdown() -> None:
    """Three jobs with profiles (no measured triple): Algorithm 2 adds while delta >= 1 + margin."""
    rates = {f"M{i} (batch size 32)": {"v100": 500.0} for i in range(4)}
    table = ThroughputTable.from_rates(rates)
    profiles = {f"M{i} (batch size 32)": ColocationProfile(occupancy=c, membw=0.0)
                for i, c in enumerate([5e6, 6e6, 8e6, 3e7])}
    table = ThroughputTable(table.entries, profiles=profiles)
    jobs = [small(f"j{i}", f"M{i} (batch size 32)", memory=3.0, work=1e5 * (i + 1)) for i in range(4)]
    settings = ColocationSettings(max_group=4)
    plan = plan_for(*jobs, table=table, settings=settings)
    group = [jp.job_id for jp in plan.jobs if jp.colocation_group]
    occupancy = sum(profiles[f"M{int(j[1])} (batch size 32)"].occupancy for j in group)
    assert len(group) == 3 and "j3" not in group  # adding j3 would push sum(C) past the threshold
    assert settings.delta0 - settings.per_occupancy * occupancy >= 1 + settings.margin


def running(job: PlanJob, node: str) -> PlanJob:
    return replace(job, current=Allocation(((node, "v100", 1),)))


def test_without_profiles_a_candidate_joins_its_best_measured_pair_not_the_first_gpu() -> None:
    """Measured pairs only: the first GPU says nothing of the others, so the joiner takes its best pair."""
    two = Inventory((Node("n1", {"v100": 1}, gpu_memory_gb={"v100": 16.0}),
                     Node("n2", {"v100": 1}, gpu_memory_gb={"v100": 16.0})))
    first = running(small("h1", "ResNet-50 (batch size 16)"), "n1")  # pair with c: delta 1.12
    best = running(small("h2", "LM (batch size 80)"), "n2")  # pair with c: delta 1.78
    joiner = small("c", "ResNet-18 (batch size 64)")
    plan = POLICIES["slurmhet"](PlanningInput((first, best, joiner), two, GAVEL, colocation=ColocationSettings()))
    assert plan.job("c").colocation_group == plan.job("h2").colocation_group is not None
    assert plan.job("h1").colocation_group is None
    assert plan.job("c").allocation == Allocation((("n2", "v100", 1),))


def test_without_profiles_a_candidate_below_the_threshold_does_not_stop_the_next() -> None:
    """Algorithm 2's stop rests on ascending occupancy; without profiles a poor pair says nothing of the next."""
    host = running(small("h", "LM (batch size 80)"), "n")
    poor = small("d", "Recommendation (batch size 8192)", work=1e4)  # first in the planner's order; delta 0.60
    good = small("e", "ResNet-18 (batch size 64)")  # delta 1.78
    plan = POLICIES["slurmhet"](PlanningInput((host, poor, good), ONE_V100, GAVEL, colocation=ColocationSettings()))
    assert plan.job("d").colocation_group is None and plan.job("d").allocation is None
    assert plan.job("e").colocation_group == plan.job("h").colocation_group is not None
