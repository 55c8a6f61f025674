"""Smoke run of ``bench.placement`` on the small exact cases: schema and slurmhet's ratio."""

from __future__ import annotations

import json

import pytest

from bench import placement

REQUIRED = {"slurmhet", "has", "jps-20", "jps-40", "jps-60", "optimus", "optimus-lb", "exhaustive"}


@pytest.fixture(scope="module")
def result() -> dict:
    return placement.run(cases=["tpds-example", "tpds-k15"], with_robustness=False)


def test_schema(result: dict) -> None:
    json.dumps(result)  # one JSON object
    assert [c["name"] for c in result["cases"]] == ["tpds-example", "tpds-k15"]
    for case in result["cases"]:
        assert {"name", "jobs", "gpus", "reference", "reference_avg_jct", "policies"} <= set(case)
        assert set(case["policies"]) == REQUIRED
        for res in case["policies"].values():
            assert {"avg_jct", "ratio", "seconds"} <= set(res)
            if res["ratio"] is not None:
                assert res["ratio"] == pytest.approx(res["avg_jct"] / case["reference_avg_jct"], rel=1e-4)
                assert res["ratio"] >= 1 - 1e-9  # the reference is the exact optimum


def test_slurmhet_matches_the_exact_optimum(result: dict) -> None:
    for case in result["cases"]:
        assert case["policies"]["slurmhet"]["ratio"] <= 1.01


def test_example_placement_is_the_papers_optimum(result: dict) -> None:
    example = result["cases"][0]
    assert example["reference_avg_jct"] == pytest.approx(10592.0, abs=0.5)
    placement_ = example["placement"]["slurmhet"]
    assert all("v100" in slot for slot in placement_["resnet18"])
    assert all("t4" in slot for slot in placement_["vgg19"])
    assert example["policies"]["has"]["avg_jct"] == pytest.approx(11225.8, abs=0.1)


def test_unknown_case_is_an_input_error() -> None:
    from slurmhet.errors import InputError

    with pytest.raises(InputError):
        placement.run(cases=["nope"])
