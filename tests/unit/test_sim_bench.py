"""bench.reproduce in --quick mode: every case runs, reports ratios against slurmhet."""

from bench.reproduce import run


def test_quick_cases_report_metrics_and_ratios() -> None:
    result = run(["hare", "sjfbco", "hadare", "gavel-trace", "scale"], quick=True)
    cases = result["cases"]
    assert result["quick"] is True
    hare = cases["hare"]
    assert set(hare["policies"]) == {"slurmhet", "hare", "gavel-fifo", "srtf", "sched-homo", "sched-allox"}
    assert hare["ratios_vs_slurmhet"]["slurmhet"]["weighted_jct"] == 1.0
    sjf = cases["sjfbco"]["policies"]
    assert sjf["sjf-bco"]["makespan"] < sjf["rand"]["makespan"]
    assert cases["sjfbco"]["kappa_sweep_makespan"]
    assert {"M-1", "M-5"} <= set(cases["hadare"]["mixes"])
    assert cases["scale"]["policies"]["slurmhet"]["plan_seconds_first"] < 10
