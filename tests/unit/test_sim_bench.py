"""bench.reproduce in --quick mode: every case runs, reports ratios against slurmhet."""

import json

from bench.reproduce import median_over_seeds, run


def test_quick_cases_report_metrics_and_ratios() -> None:
    result = run(["hare", "sjfbco", "hadare", "gavel-trace", "gavel-generated", "scale-10k"], quick=True)
    cases = result["cases"]
    assert result["quick"] is True
    assert set(result["solver"]) == {"highspy", "pulp"} and all(result["solver"].values())
    hare = cases["hare"]
    assert set(hare["policies"]) == {"slurmhet", "hare", "gavel-fifo", "srtf", "sched-homo", "sched-allox"}
    assert hare["ratios_vs_slurmhet"]["slurmhet"]["weighted_jct"] == 1.0
    sjf = cases["sjfbco"]["policies"]
    assert sjf["sjf-bco"]["makespan"] < sjf["rand"]["makespan"]
    assert cases["sjfbco"]["kappa_sweep_makespan"]
    assert {"M-1", "M-5"} <= set(cases["hadare"]["mixes"])
    assert [(r["jobs"], r["gpus"]) for r in cases["scale-10k"]["rows"]] == [(256, 128), (512, 1024)]
    assert all(r["seconds"] > 0 and r["ratio_to_bound"] >= 1 for r in cases["scale-10k"]["rows"])
    reports = [hare, cases["sjfbco"], *cases["hadare"]["mixes"].values(), *cases["gavel-trace"]["traces"].values(),
               *cases["gavel-generated"]["traces"].values()]
    for report in reports:  # every simulated case: the instance's bounds, and every policy at or above them
        assert set(report["bound"]) == {"avg_jct", "makespan", "weighted_jct"}
        for row in report["policies"].values():
            assert all(v is None or v >= 1 - 1e-9 for v in row["ratio_to_bound"].values())
    assert set(cases["gavel-trace"]["traces"]["max_min_fairness"]["policies"]) == {
        "slurmhet", "gavel-mmf", "gavel-fifo", "gavel-mtd"}
    json.dumps(result, allow_nan=False)  # strict JSON, no NaN


def test_median_over_seeds_orders_policies_by_median_ttd() -> None:
    def m(ttd: float, jct: float = 1.0, util: float = 0.5) -> dict[str, float]:
        return {"makespan": ttd, "avg_jct": jct, "utilization": util}

    # One seed where b's long job lands badly must not decide the order: medians are 10 / 20 / 30.
    per_seed = {"1": {"slurmhet": m(10), "a": m(20), "b": m(90)},
                "2": {"slurmhet": m(12), "a": m(25), "b": m(30)},
                "3": {"slurmhet": m(8, 3.0), "a": m(19), "b": m(15)}}
    out = median_over_seeds(per_seed)
    assert out["median"]["b"]["makespan"] == 30 and out["median"]["slurmhet"]["avg_jct"] == 1.0
    assert out["ttd_order_of_medians"] == ["slurmhet", "a", "b"]
    assert out["median_ratios_vs_slurmhet"]["a"]["makespan"] == 2.0
