"""The fluid makespan LP (planner/fluid.py), solved by hand, and the type narrowing it drives (planner/critical.py)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.planner import POLICIES, Allocation, PlanJob, PlanningInput
from slurmhet.planner.critical import booked_types, packed_times, with_critical_path
from slurmhet.planner.fluid import fluid_booking, greedy_makespan
from slurmhet.throughput import ThroughputTable

#: One V100 (node a), one K80 (node b). "conv" crawls on the K80 (0.01 of its V100 rate), "seq" keeps half.
INVENTORY = Inventory((Node("a", {"v100": 1}), Node("b", {"k80": 1})), math.inf, 1.0)
TABLE = ThroughputTable.from_rates({"conv": {"v100": 10.0, "k80": 0.1}, "seq": {"v100": 10.0, "k80": 5.0}})


def job(job_id: str, workload: str, samples: float) -> PlanJob:
    return PlanJob(id=job_id, workload=workload, samples_remaining=samples, global_batch=1, model_size_mb=0.0,
                   min_gpus=1, max_gpus=1)


def test_the_lp_splits_a_gang_across_types_one_at_a_time() -> None:
    """A: 10 s on the V100, 20 s on the K80; B: 10 s on the V100 only. B takes the V100 for 10 s; A does a
    share a on the K80: the V100 holds 10 + 10 (1 - a), A itself runs 10 (1 - a) + 20 a (one type at a
    time), so both equal 20 - 10 a = 10 + 10 a at a = 0.5 and F = 15 (the K80's 10 s fit)."""
    booking = fluid_booking({"A": {"v100": (10.0, 1), "k80": (20.0, 1)}, "B": {"v100": (10.0, 1)}},
                            {"v100": 1, "k80": 1})
    assert booking is not None
    assert booking.makespan == pytest.approx(15.0)
    assert booking.types == {"A": ("v100", "k80"), "B": ("v100",)}


def test_where_capacity_is_spare_a_job_is_booked_on_its_fastest_type() -> None:
    """The long job sets F = 100 s on a V100; the short one fits on the other V100 or the K80 alike. The
    GPU-time tie-break books it on the V100 (10 GPU-s, not 20)."""
    booking = fluid_booking({"long": {"v100": (100.0, 1), "k80": (200.0, 1)},
                             "short": {"v100": (10.0, 1), "k80": (20.0, 1)}}, {"v100": 2, "k80": 1})
    assert booking is not None and booking.makespan == pytest.approx(100.0)
    assert booking.types["short"] == ("v100",)


def test_a_type_too_small_for_a_gang_is_never_booked() -> None:
    booking = fluid_booking({"g": {"v100": (10.0, 4), "k80": (30.0, 2)}}, {"v100": 2, "k80": 2})
    assert booking is not None and booking.types == {"g": ("k80",)} and booking.makespan == pytest.approx(30.0)
    assert fluid_booking({"g": {"v100": (10.0, 4)}}, {"v100": 2}) is None


def queue() -> PlanningInput:
    """20 conv jobs of 10 s on the V100 (1,000 s on the K80) and one seq job of 100 s (200 s on the K80).
    Fluid LP: the V100 does the conv jobs (200 s) and the K80 the seq job (200 s), F = 200 s = 2 x the
    longest job; the crude load bound (300 GPU-s / 2 GPUs = 150 s) leaves seq (100 s) off the critical path."""
    return PlanningInput(tuple(job(f"c{i:02d}", "conv", 100.0) for i in range(20)) + (job("seq", "seq", 1000.0),),
                         INVENTORY, TABLE)


def test_when_load_sets_the_makespan_jobs_keep_to_their_booked_types() -> None:
    inp = queue()
    times = {j.id: packed_times(j, inp) for j in inp.jobs}
    booked = booked_types(inp, times)
    assert booked["seq"] == ("k80",) and all(booked[f"c{i:02d}"] == ("v100",) for i in range(20))
    narrowed = {j.id: j.allowed_types for j in with_critical_path(inp).jobs}
    assert narrowed["seq"] == ("k80",) and narrowed["c00"] == ("v100",)
    # Planned: the seq job starts on the K80 at once; without the narrowing a conv job takes it for 1,000 s.
    plan = POLICIES["slurmhet"](with_critical_path(inp))
    assert plan.job("seq").allocation is not None and plan.job("seq").allocation.slots == (("b", "k80", 1),)
    plain = POLICIES["slurmhet"](with_critical_path(inp, load_bound=math.inf))
    assert plain.job("seq").allocation is None and plain.job("c01").allocation.slots == (("b", "k80", 1),)


def test_near_the_longest_job_no_type_is_narrowed() -> None:
    """Two conv jobs beside the seq job: F is within 1.25 x the seq job's 100 s on the V100, so every job
    keeps its types (the seq job is critical: ranked first, on any type)."""
    inp = PlanningInput((job("c0", "conv", 100.0), job("c1", "conv", 100.0), job("seq", "seq", 1000.0)),
                        INVENTORY, TABLE)
    assert booked_types(inp, {j.id: packed_times(j, inp) for j in inp.jobs}) == {}
    assert {j.id: (j.allowed_types, j.priority) for j in with_critical_path(inp).jobs} == {
        "c0": ((), 0), "c1": ((), 0), "seq": ((), 1)}


def test_a_pinned_running_job_keeps_its_types_and_critical_jobs_keep_theirs() -> None:
    base = queue()
    running = replace(base.jobs[-1], current=Allocation.of({("a", "v100"): 1}))
    pinned = replace(base, jobs=base.jobs[:-1] + (running,), pin_running=True)
    assert {j.id: j.allowed_types for j in with_critical_path(pinned).jobs}["seq"] == ()
    # Revisable plan (the simulator): the running job may move, so it is narrowed like the others.
    revisable = replace(pinned, pin_running=False)
    assert {j.id: j.allowed_types for j in with_critical_path(revisable).jobs}["seq"] == ("k80",)
    # A share that marks the seq job critical (100 s >= 0.6 x 150 s) leaves it every type, and first.
    critical = {j.id: j for j in with_critical_path(base, share=0.6).jobs}
    assert critical["seq"].allowed_types == () and critical["seq"].priority == 1


def test_the_greedy_makespan_is_one_some_schedule_reaches_so_never_below_the_lps() -> None:
    """It gates the LP (skipped when the greedy one is already under the threshold): it must never be lower."""
    rng = random.Random(5)
    for _ in range(60):
        capacity = {"v100": rng.randint(1, 4), "k80": rng.randint(1, 8)}
        times = {f"j{i}": {t: (rng.uniform(1.0, 100.0) * (1.0 if t == "v100" else rng.uniform(1.0, 10.0)),
                               rng.choice((1, 1, 2, 4))) for t in capacity} for i in range(rng.randint(1, 6))}
        booking = fluid_booking(times, capacity)
        greedy = greedy_makespan(times, capacity)
        if booking is None:
            assert greedy == 0.0  # no job fits any type
        else:
            assert greedy >= booking.makespan * (1 - 1e-9)
    # Capacity to spare: every job on its fastest type, and the longest job is the makespan.
    assert greedy_makespan({"long": {"v100": (100.0, 1), "k80": (200.0, 1)},
                            "short": {"v100": (10.0, 1), "k80": (20.0, 1)}}, {"v100": 2, "k80": 1}) == 100.0
