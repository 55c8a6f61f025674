"""ThroughputTable: Gavel data, site tables, priors, EWMA, errors with places."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmhet.errors import InputError
from slurmhet.throughput import (
    ThroughputTable, canonical_key, eq10_type_ratios, load_tables, workload_key,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gavel() -> ThroughputTable:
    return ThroughputTable.gavel()


def test_gavel_is_shipped_with_its_licence() -> None:
    data = REPO / "slurmhet" / "data" / "gavel"
    assert "MIT" in (data / "LICENSE").read_text()
    assert (data / "README.md").exists()
    assert (data / "simulation_throughputs.json").stat().st_size > 1_000_000


def test_gavel_cells_are_samples_per_second_per_gpu(gavel: ThroughputTable) -> None:
    entry = gavel.get("ResNet-18 (batch size 64)", "v100")
    assert entry.source == "measured"
    assert entry.value == pytest.approx(24.093231895382736 * 64)  # steps/s x batch at scale factor 1
    assert set(gavel.gpu_types()) == {"k80", "p100", "v100"}
    assert gavel.get("A3C (batch size 1)", "k80").value > 0


def test_workload_names_map_to_gavel_job_types(gavel: ThroughputTable) -> None:
    assert canonical_key("resnet18 (batch size 64)") == "ResNet-18 (batch size 64)"
    assert workload_key("lstm", 20) == "LM (batch size 20)"
    assert gavel.get("resnet-50 (batch size 32)", "V100").value == gavel.get("ResNet-50 (batch size 32)", "v100").value


def test_colocated_pairs_come_from_gavel(gavel: ThroughputTable) -> None:
    own, partner = gavel.colocated("ResNet-18 (batch size 64)", "ResNet-50 (batch size 64)", "v100")
    alone = gavel.rate("ResNet-18 (batch size 64)", "v100")
    assert 0 < own < alone and partner > 0
    # Gavel writes [0, 0] for infeasible pairs (out of memory); those are not offered as measurements
    assert gavel.colocated_pairs[("ResNet-50 (batch size 64)", "ResNet-50 (batch size 128)", "v100")] == (0.0, 0.0)
    assert gavel.colocated("ResNet-50 (batch size 64)", "ResNet-50 (batch size 128)", "v100") is None


def test_missing_cell_without_prior_is_a_clear_error() -> None:
    table = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"v100": 100.0}})
    with pytest.raises(InputError) as err:
        table.get("Mystery (batch size 8)", "v100")
    assert "Mystery (batch size 8)" in err.value.cause and "v100" in err.value.place


def test_priors_are_flagged_never_zero(gavel: ThroughputTable) -> None:
    near = gavel.get("ResNet-18 (batch size 48)", "v100")
    assert near.is_prior and near.value == pytest.approx(gavel.rate("ResNet-18 (batch size 64)", "v100"))
    site = gavel.merged(ThroughputTable.from_rates({"VGG-19 (batch size 64)": {"v100": 1754.0}}))
    k80 = site.get("VGG-19 (batch size 64)", "k80")
    assert k80.is_prior and 0 < k80.value < 1754.0 and "ratio" in k80.provenance
    with pytest.raises(InputError):
        site.get("VGG-19 (batch size 64)", "k80", allow_prior=False)


def test_ewma_refines_and_replaces_priors() -> None:
    table = ThroughputTable.from_rates({"ResNet-18 (batch size 64)": {"v100": 100.0}})
    once = table.observe("ResNet-18 (batch size 64)", "v100", 200.0)
    assert once.rate("ResNet-18 (batch size 64)", "v100") == pytest.approx(0.3 * 200 + 0.7 * 100)
    assert once.get("ResNet-18 (batch size 64)", "v100").source == "ewma"
    assert table.rate("ResNet-18 (batch size 64)", "v100") == 100.0  # tables are immutable
    fresh = table.observe("ResNet-18 (batch size 64)", "k80", 40.0)
    assert fresh.rate("ResNet-18 (batch size 64)", "k80") == 40.0
    with pytest.raises(InputError):
        table.observe("ResNet-18 (batch size 64)", "v100", 0.0)


def test_devcluster_table_derives_t4_as_flagged_prior() -> None:
    table = load_tables([REPO / "etc" / "throughput" / "devcluster.yaml"])
    t4 = table.get("ResNet-50 (batch size 64)", "t4")
    v100 = table.rate("ResNet-50 (batch size 64)", "v100")
    assert t4.is_prior and t4.value == pytest.approx(v100 * 0.427) and "eq. (9)" in t4.provenance
    assert table.get("ResNet-50 (batch size 64)", "v100").source == "measured"
    assert table.gpu_memory_gb["k80"] == 12


def test_csv_table_errors_name_the_place(tmp_path: Path) -> None:
    good = tmp_path / "site.csv"
    good.write_text("workload,gpu_type,samples_per_s\nResNet-18 (batch size 64),t4,700\n")
    assert ThroughputTable.load(good).rate("ResNet-18 (batch size 64)", "t4") == 700.0
    bad = tmp_path / "bad.csv"
    bad.write_text("workload,gpu_type,samples_per_s\nResNet-18 (batch size 64),t4,fast\n")
    with pytest.raises(InputError) as err:
        ThroughputTable.load(bad)
    assert err.value.place == f"{bad}:2:samples_per_s"
    missing = tmp_path / "missing.csv"
    missing.write_text("workload,gpu_type,samples_per_s\nResNet-18 (batch size 64),t4\n")
    with pytest.raises(InputError) as err:
        ThroughputTable.load(missing)
    assert err.value.place == f"{missing}:2"


def test_yaml_table_rejects_non_numeric_and_zero(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("throughputs:\n  'ResNet-18 (batch size 64)': {t4: lots}\n")
    with pytest.raises(InputError) as err:
        ThroughputTable.load(path)
    assert "throughputs['ResNet-18 (batch size 64)']['t4']" in err.value.place
    path.write_text("throughputs:\n  'ResNet-18 (batch size 64)': {t4: 0}\n")
    with pytest.raises(InputError, match="positive"):
        ThroughputTable.load(path)
    path.write_text("throughputs:\n  'ResNet-18 (batch size 64)': {t4: 5\n")  # unclosed: the parser's mark
    with pytest.raises(InputError) as err:
        ThroughputTable.load(path)
    assert err.value.place == f"{path}:3:1" and err.value.cause.startswith("YAML syntax error: expected ',' or '}'")
    assert "\n" not in str(err.value)


def test_eq10_ratios_follow_compute_and_memory() -> None:
    ratios = eq10_type_ratios({"v100": (125.0, 16.0, 1.0), "t4": (65.0, 16.0, 1.0)}, "v100")
    assert ratios["v100"] == 1.0
    assert ratios["t4"] == pytest.approx((65 / 125) ** 0.5)
