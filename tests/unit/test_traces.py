"""Trace loaders on the shipped Gavel traces and on broken files (errors name file:line)."""

from pathlib import Path

import pytest

from slurmhet.errors import InputError
from slurmhet.sim import default_throughputs, generate_trace, load_csv_trace, load_gavel_trace
from slurmhet.sim.rates import RateModel
from slurmhet.sim.traces import resolve_steps

FIXTURES = Path(__file__).parent.parent / "fixtures" / "traces"
GAVEL = Path("/work/shared/data/gavel/traces")
TYPES = default_throughputs().job_types()


@pytest.mark.parametrize("name,count", [("max_min_fairness", 96), ("minimize_makespan", 100)])
def test_shipped_gavel_traces_load(name: str, count: int) -> None:
    path = Path(__file__).parents[2] / "slurmhet" / "data" / "gavel" / "traces" / f"{name}.trace"
    jobs = load_gavel_trace(path if path.exists() else GAVEL / f"{name}.trace", TYPES)
    assert len(jobs) == count
    assert all(j.total_steps and j.total_steps > 0 and j.gpus in (1, 2, 4, 8) for j in jobs)
    assert [j.arrival for j in jobs] == sorted(j.arrival for j in jobs)


@pytest.mark.parametrize("fixture,needle", [
    ("nan_steps.trace", "total_steps"), ("negative_arrival.trace", "arrival_time"),
    ("unknown_type.trace", "unknown job type"), ("non_monotone.trace", "earlier than"),
    ("short_row.trace", "10 tab-separated"),
])
def test_broken_gavel_rows_name_the_line(fixture: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        load_gavel_trace(FIXTURES / fixture, TYPES)
    assert needle in str(err.value) and f"{fixture}:2" in err.value.place


def test_csv_durations_resolve_to_v100_steps() -> None:
    jobs = load_csv_trace(FIXTURES / "good.csv", TYPES)
    rates = RateModel(default_throughputs())
    resolved = resolve_steps(jobs, lambda t, k: rates.type_rate(t, k, "v100"))
    expected = 600 * default_throughputs().throughput("ResNet-50 (batch size 64)", "v100", 2)
    assert resolved[0].total_steps == pytest.approx(expected) and resolved[1].arrival == 30


def test_csv_bad_row_names_the_line() -> None:
    with pytest.raises(InputError) as err:
        load_csv_trace(FIXTURES / "negative_gpus.csv", TYPES)
    assert err.value.place.endswith("negative_gpus.csv:3") and "gpus" in str(err.value)


def test_generator_is_seeded_and_follows_gavel_distributions() -> None:
    a, b = generate_trace(400, 5), generate_trace(400, 5)
    assert a == b and a != generate_trace(400, 6)
    assert all(60 * 10**1.5 <= j.duration_s <= 60 * 10**4 for j in a)
    share_single = sum(j.gpus == 1 for j in a) / len(a)
    assert 0.6 < share_single < 0.8
    assert all(j.arrival == 0 for j in generate_trace(20, 1, "zero"))
    with pytest.raises(InputError):
        generate_trace(3, 1, "bursty")
