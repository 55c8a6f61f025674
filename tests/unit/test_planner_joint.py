"""The joint MILP of a revisable plan (planner/joint.py): who runs, where, and who shares a GPU, by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import POLICIES, PlanJob, PlanningInput, joint
from slurmhet.planner.critical import with_critical_path
from slurmhet.planner.joint import Choice, choose, count_vectors
from slurmhet.planner.model import ColocationSettings
from slurmhet.throughput import ThroughputTable

ONE_EACH = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})))


def single(job_id: str, workload: str, samples: float, **kw: object) -> PlanJob:
    return PlanJob(job_id, workload, samples, 1, min_gpus=1, max_gpus=1, **kw)  # type: ignore[arg-type]


def test_choose_takes_the_most_value_within_each_types_gpus() -> None:
    # Type 0 has 2 GPUs: the gang (value 3) or the two single jobs (2 + 2) fit, not all three.
    choices = [Choice((0,), (2,), 3.0), Choice((1,), (1,), 2.0), Choice((2,), (1,), 2.0)]
    assert choose(choices, 3, [2]) == choices[1:]


def test_choose_runs_a_forced_job_though_another_would_add_more() -> None:
    choices = [Choice((0,), (1,), 1.0), Choice((1,), (1,), 5.0)]
    assert choose(choices, 2, [1], forced=[0]) == [choices[0]]


def test_choose_refuses_forced_jobs_that_cannot_all_run() -> None:
    choices = [Choice((0,), (1,), 1.0), Choice((1,), (1,), 1.0)]
    assert choose(choices, 2, [1], forced=[0, 1]) is None
    assert choose([], 1, [1], forced=[0]) is None


def test_a_pair_counts_one_gpu_and_each_member_once() -> None:
    # Jobs 0 and 1 alone (value 1 each) or sharing the one GPU (value 1.6): the pair, and job 1 not again.
    choices = [Choice((0,), (1,), 1.0), Choice((1,), (1,), 1.0), Choice((0, 1), (1,), 1.6)]
    assert choose(choices, 2, [1]) == [choices[2]]


def test_a_gang_spans_types_only_when_no_type_alone_holds_it() -> None:
    allowed = np.array([True, True, False])
    assert count_vectors(2, allowed, np.array([4, 4, 4])) == [(2, 0, 0), (0, 2, 0)]
    assert sorted(count_vectors(3, allowed, np.array([2, 2, 8]))) == [(1, 2, 0), (2, 1, 0)]


def test_the_k80_goes_to_the_waiting_job_that_keeps_most_of_its_rate_there() -> None:
    # One V100, one K80. GPU-time order admits s (10 s) onto the V100 and x (20 s) onto the K80, where x
    # crawls at 0.1 of its rate, while y (30 s) would keep 0.9 there. Index (1/T*)^0.25, share of the best
    # rate: s V100 + x K80 = 10^-.25 + 0.1 x 20^-.25 = 0.61 < s V100 + y K80 = 10^-.25 + 0.9 x 30^-.25 = 0.95.
    table = ThroughputTable.from_rates({"crawls": {"v100": 1.0, "k80": 0.1}, "keeps": {"v100": 1.0, "k80": 0.9}})
    jobs = (single("s", "crawls", 10.0), single("x", "crawls", 20.0), single("y", "keeps", 30.0))
    plan = POLICIES["slurmhet"](PlanningInput(jobs, ONE_EACH, table, pin_running=False))
    assert plan.job("s").allocation.by_type() == {"v100": 1}
    assert plan.job("y").allocation.by_type() == {"k80": 1}
    assert plan.job("x").allocation is None
    # A plan kept to the end (a live cluster) admits in GPU-time order as before: s and x run, y waits.
    kept = POLICIES["slurmhet"](PlanningInput(jobs, ONE_EACH, table, pin_running=True))
    assert kept.job("x").allocation is not None and kept.job("y").allocation is None


def test_two_short_jobs_share_the_v100_when_their_measured_pair_beats_one_alone() -> None:
    # a and b run 1/s alone on the V100 and 0.8/s each together (1.6x the work); the K80 crawls (0.1/s).
    # Alone: a on the V100 (1) + b on the K80 (0.1); shared: 0.8 + 0.8 = 1.6 on one GPU.
    base = ThroughputTable.from_rates({"a": {"v100": 1.0, "k80": 0.1}, "b": {"v100": 1.0, "k80": 0.1}})
    table = replace(base, colocated_pairs={("a", "b", "v100"): (0.8, 0.8), ("b", "a", "v100"): (0.8, 0.8)})
    jobs = tuple(single(i, i, 100.0, colocate=True, gpu_memory_gb=1.0) for i in ("a", "b"))
    plan = POLICIES["slurmhet"](PlanningInput(jobs, ONE_EACH, table, pin_running=False))
    assert plan.job("a").allocation == plan.job("b").allocation
    assert plan.job("a").allocation.by_type() == {"v100": 1}
    assert plan.job("a").colocation_group and plan.job("a").colocation_group == plan.job("b").colocation_group
    assert plan.job("b").run_seconds == pytest.approx(125.0)  # 100 samples at 0.8/s
    # Without room in the GPU's memory they do not share.
    big = tuple(replace(j, gpu_memory_gb=10.0) for j in jobs)
    apart = POLICIES["slurmhet"](PlanningInput(big, ONE_EACH, replace(table, gpu_memory_gb={"v100": 16.0}),
                                               pin_running=False))
    assert apart.job("a").colocation_group is None and apart.job("b").colocation_group is None


def test_a_critical_job_must_run_while_jobs_arrive_and_takes_its_fastest_gpus_once_they_stop() -> None:
    # One V100 (2/s), one K80 (1/s). Bound max((100 + 10 + 10) / 2, 100) = 100 s: "long" is critical.
    table = ThroughputTable.from_rates({"w": {"v100": 2.0, "k80": 1.0}})
    jobs = (single("long", "w", 200.0), single("s1", "w", 20.0), single("s2", "w", 20.0))
    arriving = with_critical_path(PlanningInput(jobs, ONE_EACH, table, now=50.0, pin_running=False))
    assert [(j.id, j.priority, j.must_run) for j in arriving.jobs] == [("long", 1, True), ("s1", 0, False),
                                                                        ("s2", 0, False)]
    plan = POLICIES["slurmhet"](arriving)
    assert plan.job("long").allocation.by_type() == {"k80": 1}  # it runs; s1 takes the V100 by progress
    assert plan.job("s1").allocation.by_type() == {"v100": 1} and plan.job("s2").allocation is None
    stopped = with_critical_path(PlanningInput(jobs, ONE_EACH, table, now=100.0, pin_running=False))
    assert [(j.priority, j.must_run) for j in stopped.jobs] == [(1, False), (0, False), (0, False)]
    assert POLICIES["slurmhet"](stopped).job("long").allocation.by_type() == {"v100": 1}
    # A live plan (pinned) gives the priority whenever.
    live = with_critical_path(PlanningInput(jobs, ONE_EACH, table, now=50.0))
    assert [(j.priority, j.must_run) for j in live.jobs] == [(1, False), (0, False), (0, False)]


def test_a_short_gang_weighs_k_to_the_quarter_so_it_is_not_starved_by_longer_single_gpu_jobs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two V100s, one K80 where everything crawls (0.1 of its rate). A 2-GPU gang with 10 s left, two single-GPU
    # jobs with 100 s. Index (1/T*)^0.25: gang 10^-.25 x 2^0.25 = 0.669 (+ a single on the K80, 0.1 x 0.316)
    # = 0.70 beats both singles on the V100s, 2 x 0.316 = 0.632; weighed as one share (2^0), 0.594 does not.
    from slurmhet.planner import joint

    table = ThroughputTable.from_rates({"g": {"v100": 1.0, "k80": 0.1}, "s": {"v100": 1.0, "k80": 0.1}})
    inv = Inventory((Node("a", {"v100": 2}), Node("b", {"k80": 1})))
    jobs = (PlanJob("gang", "g", 20.0, 2, min_gpus=2, max_gpus=2), single("s1", "s", 100.0), single("s2", "s", 100.0))
    plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, table, pin_running=False))
    assert plan.job("gang").allocation.by_type() == {"v100": 2}
    monkeypatch.setattr(joint, "GANG_EXPONENT", 0.0)
    plan = POLICIES["slurmhet"](PlanningInput(jobs, inv, table, pin_running=False))
    assert plan.job("gang").allocation is None
    assert {plan.job(j).allocation.by_type()["v100"] for j in ("s1", "s2")} == {1}


def test_the_size_check_before_the_problem_is_built_lets_through_exactly_the_milps_admit_takes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Three single-GPU jobs that may share (3 pairs) and a gang, on two types: 4 x 2 + 3 x 2 = 14 columns.
    table = ThroughputTable.from_rates({"w": {"v100": 1.0, "k80": 0.5}})
    jobs = tuple(single(f"s{i}", "w", 10.0 + i, colocate=True, gpu_memory_gb=1.0) for i in range(3)) + (
        PlanJob("g", "w", 5.0, 1, min_gpus=2, max_gpus=2),)
    inventory = Inventory((Node("a", {"v100": 2}), Node("b", {"k80": 2})))
    asked: list[int] = []
    admit = joint.admit

    def counted(problem, *args):  # type: ignore[no-untyped-def]
        asked.append(len(problem.jobs))
        return admit(problem, *args)

    monkeypatch.setattr(joint, "admit", counted)
    for limit, runs in ((14, True), (13, False)):
        monkeypatch.setattr(joint, "MAX_COLUMNS", limit)
        assert joint.within_size(jobs, 2, ColocationSettings()) is runs
        asked.clear()
        plan = POLICIES["slurmhet"](PlanningInput(jobs, inventory, table, pin_running=False))
        assert asked == ([4] if runs else [])
        assert sum(1 for jp in plan.jobs if jp.allocation is not None) >= 2
