"""The GPU catalog and the priors it gives: no model is refused, every guess is labelled, a measurement wins."""

from __future__ import annotations

import math

import pytest

from slurmhet.errors import InputError
from slurmhet.gpu_catalog import builtin, parse_catalog
from slurmhet.site_table import with_specs
from slurmhet.spec import load_text
from slurmhet.throughput import ThroughputTable, WorkloadTraits

REQUIRED = ("k80", "p100", "v100", "t4", "a10", "a40", "l4", "l40s", "a100", "a100-80gb", "h100", "h200",
            "mi250", "mi300x")


def test_catalog_has_every_required_type_with_a_source() -> None:
    catalog = builtin()
    for name in REQUIRED:
        model = catalog.models[name]
        assert model.fp32_tflops > 0 and model.memory_gbps > 0 and model.memory_gb > 0, name
        assert model.source, name


@pytest.mark.parametrize(("site_name", "row"), [
    ("v100", "v100"), ("Tesla_V100", "v100"), ("a100", "a100"), ("a100_80gb", "a100-80gb"),
    ("A100-SXM4-80GB", "a100-80gb"), ("a100-pcie-40gb", "a100"), ("h100_nvl", "h100"), ("a10g", "a10"),
    ("l40s", "l40s"), ("v100-32g", "v100-32gb"), ("rtx2080ti", None), ("l40", None),
])
def test_site_type_names_find_their_row(site_name: str, row: str | None) -> None:
    found = builtin().lookup(site_name)
    assert (found.name if found else None) == row


def test_ratio_by_geometric_mean_and_by_roofline() -> None:
    catalog = builtin()
    t4, v100 = catalog.models["t4"], catalog.models["v100"]
    assert catalog.ratio("t4", "v100") == pytest.approx(math.sqrt(8.1 / 15.7 * 320 / 900))
    # Low intensity: memory-bound on both, the bandwidth ratio; high: compute-bound, the FP32 ratio.
    assert catalog.ratio("t4", "v100", intensity=1.0) == pytest.approx(t4.memory_gbps / v100.memory_gbps)
    assert catalog.ratio("t4", "v100", intensity=1000.0) == pytest.approx(t4.fp32_tflops / v100.fp32_tflops)
    # Mixed precision reads the tensor cores; K80 has none and falls back to FP32.
    assert catalog.ratio("a100", "v100", "mixed", 1e6) == pytest.approx(312 / 125)
    assert catalog.ratio("k80", "v100", "mixed", 1e6) == pytest.approx(4.37 / 125)
    assert catalog.ratio("rtx2080ti", "v100") is None


def test_catalog_ratios_track_gavels_measurements() -> None:
    """The prior is a guess, but not a wild one: over every Gavel workload measured on two of
    k80/p100/v100, the catalog's ratio is off by a factor of 1.64 in geometric mean (the worst,
    Recommendation on V100/K80, by 5.5x: it is input-bound, and nothing in peak figures says so)."""
    gavel, catalog = ThroughputTable.gavel(), builtin()
    errors = []
    for workload in gavel.workloads():
        for a, b in (("v100", "k80"), ("p100", "k80"), ("v100", "p100")):
            if (workload, a) in gavel.entries and (workload, b) in gavel.entries:
                measured = gavel.rate(workload, a) / gavel.rate(workload, b)
                errors.append(abs(math.log(catalog.ratio(a, b) / measured)))
    assert len(errors) > 50
    assert math.exp(sum(errors) / len(errors)) < 1.8


def test_hint_plus_catalog_gives_a_labelled_prior_that_a_measurement_replaces() -> None:
    spec = load_text("name: mine\ncommand: x\nworkload: {model: my-net, batch_size: 32, "
                     "samples_per_s_hint: {t4: 900}}\nwork: {steps: 10}\n", "f.yaml")[0]
    table = with_specs(ThroughputTable.gavel(), [spec])
    hinted = table.get("my-net (batch size 32)", "t4")
    assert hinted.is_prior and hinted.value == 900.0 and "hint in spec 'mine'" in hinted.provenance
    v100 = table.get("my-net (batch size 32)", "v100")
    assert v100.is_prior and v100.value == pytest.approx(900.0 * builtin().ratio("v100", "t4"))
    assert "catalog v100/t4" in v100.provenance and "hint" in v100.provenance
    measured = table.observe("my-net (batch size 32)", "v100", 1500.0)
    assert measured.get("my-net (batch size 32)", "v100").source == "ewma"
    assert measured.rate("my-net (batch size 32)", "v100") == 1500.0
    # The measured v100 now anchors the other types: t4 keeps the user's hint, k80 follows Gavel's measured ratios.
    assert measured.get("my-net (batch size 32)", "k80").provenance.startswith("prior: geometric mean k80 ratio")


def test_site_table_cells_beat_hints_and_traits_steer_the_roofline() -> None:
    table = ThroughputTable.from_rates({"net (batch size 8)": {"v100": 100.0}}).with_hints(
        [("net (batch size 8)", {"v100": 5.0}, WorkloadTraits("fp32", 1.0), "spec")])
    assert table.rate("net (batch size 8)", "v100") == 100.0
    assert table.rate("net (batch size 8)", "t4") == pytest.approx(100.0 * 320 / 900)


def test_default_prior_only_on_the_live_path() -> None:
    gavel = ThroughputTable.gavel()
    with pytest.raises(InputError, match="no prior for it"):
        gavel.get("unheard-of (batch size 4)", "v100")  # traces and benchmarks: an error, not a guess
    live = ThroughputTable.gavel().merged(ThroughputTable(default_prior=True))
    entry = live.get("unheard-of (batch size 4)", "v100")
    assert entry.is_prior and entry.value > 0 and "default" in entry.provenance
    h100 = live.get("unheard-of (batch size 4)", "h100")  # a type no table has: catalog x the default
    assert h100.is_prior and h100.value > entry.value and "catalog h100/" in h100.provenance
    with pytest.raises(InputError, match="not in the GPU catalog"):
        live.get("unheard-of (batch size 4)", "rtx2080ti")


def test_bad_catalog_rows_name_their_place() -> None:
    with pytest.raises(InputError, match=r"c.yaml:types\['x'\].memory_gbps"):
        parse_catalog({"types": {"x": {"fp32_tflops": 1, "memory_gbps": 0, "memory_gb": 1}}}, "c.yaml")
    with pytest.raises(InputError, match="maps 'types'"):
        parse_catalog([], "c.yaml")
