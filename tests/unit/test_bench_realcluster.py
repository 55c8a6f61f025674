"""bench/realcluster.py's pure parts: scaling the workload, measuring from sacct rows, the simulator's input."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bench import realcluster as rc
from slurmhet.slurm.parsers import AccountingRecord, parse_job_id
from slurmhet.spec import load_file, load_text

T0 = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)


def record(job_id: str, state: str = "COMPLETED", submit: float = 0, start: float | None = 0,
           end: float | None = 10, gpus: dict[str, int] | None = None) -> AccountingRecord:
    tres = {f"gres/gpu:{t}": float(n) for t, n in (gpus or {}).items()}
    at = (lambda s: T0 + timedelta(seconds=s) if s is not None else None)
    return AccountingRecord(id=parse_job_id(job_id), raw_id=job_id, name="x", state=state, exit_code="0:0",
                            submit=at(submit), start=at(start), end=at(end),
                            elapsed_s=int((end or 0) - (start or 0)), alloc_tres=tres, nodes="nodea", comment="",
                            user="root", partition="gpu")


def test_scale_workload_scales_work_steps_and_the_command_alike() -> None:
    data = {"jobs": [
        {"name": "a", "command": ["python", "t.py", "--steps", "1500", "--x", "1"], "work": {"steps": 1500}},
        {"name": "b", "command": ["python", "t.py", "--steps=400"], "work": {"steps": 400}},
        {"name": "c", "command": ["python", "t.py", "--steps", "1"], "work": {"steps": 1}},
    ]}
    out = rc.scale_workload(data, 0.3)
    assert out["jobs"][0]["work"]["steps"] == 450 and out["jobs"][0]["command"][3] == "450"
    assert out["jobs"][0]["command"][5] == "1"  # other arguments untouched
    assert out["jobs"][1]["work"]["steps"] == 120 and out["jobs"][1]["command"][2] == "--steps=120"
    assert out["jobs"][2]["work"]["steps"] == 1 and out["jobs"][2]["command"][3] == "1"  # never below one step
    assert data["jobs"][0]["work"]["steps"] == 1500  # the input is not changed
    with pytest.raises(ValueError):
        rc.scale_workload(data, 0.0)


def test_scaled_examples_load_and_stay_consistent(tmp_path: Path) -> None:
    original = load_file(rc.WORKLOAD)
    scaled = load_file(rc.write_scaled_workload(rc.WORKLOAD, 0.3, tmp_path / "jobs.yaml"))
    assert [s.name for s in scaled] == [s.name for s in original]
    for before, after in zip(original, scaled):
        assert after.steps == rc.scaled_steps(before.steps or 0, 0.3)
        argv = list(after.command)
        assert int(argv[argv.index("--steps") + 1]) == after.steps
        assert (after.gpus, after.workload, after.global_batch) == (before.gpus, before.workload, before.global_batch)


def test_naive_request_is_gpus_min_of_the_first_allowed_type() -> None:
    spec = load_text("""
jobs:
  - name: cross
    workload: {model: mlp-small, batch_size: 128}
    global_batch: 384
    command: [python, examples/train.py, --steps, "7"]
    work: {steps: 7}
    gpus: {min: 3, max: 4, types: [v100, t4, k80]}
    time_limit: 10
""", "test")[0]
    m = rc.naive_request(8, spec, "/logs", ("python", "-m", "slurmhet", "run", "--"),
                         [("SLURMHET_EMULATE_THROUGHPUT", "1")]).materialize()
    assert "--gres=gpu:v100:3" in m.argv and "--nodes=1" in m.argv and "--time=10" in m.argv
    assert "export SLURMHET_EMULATE_THROUGHPUT=1" in m.script
    assert "SLURMHET_RANK_GPU_TYPES=v100,v100,v100" in m.script
    assert "slurmhet run -- python examples/train.py --steps 7" in m.script


def test_measure_counts_store_wait_het_components_and_ignores_steps() -> None:
    created = T0 - timedelta(seconds=5)  # the store took the job 5 s before its first sbatch
    jobs = [
        rc.MeasuredJob("het", ("100",), created, samples=1600.0 * 60),
        rc.MeasuredJob("plain", ("101",), None, samples=800.0 * 30),
    ]
    records = [
        record("100+0", submit=0, start=10, end=80, gpus={"v100": 1}),
        record("100+1", submit=0, start=10, end=82, gpus={"t4": 2}),
        record("100+0.batch", submit=0, start=10, end=500),  # a step: ignored
        record("101", submit=20, start=30, end=70, gpus={"t4": 1}),
        record("999", submit=0, start=0, end=1000, gpus={"k80": 1}),  # not ours
    ]
    rates = {("het", "v100"): 1600.0, ("het", "t4"): 800.0, ("plain", "t4"): 800.0}
    out = rc.measure(jobs, records, rates)
    by_name = {j["name"]: j for j in out["jobs"]}
    assert by_name["het"]["jct_s"] == 87.0  # created_at (-5 s) to the last component's end (82 s)
    assert by_name["het"]["gpus"] == {"v100": 1, "t4": 2}
    assert by_name["het"]["emulated_run_s"] == 30.0  # 96000 samples / (1600 + 2 x 800)
    assert by_name["het"]["overhead_s"] == 42.0  # ran 72 s
    assert by_name["plain"]["jct_s"] == 50.0  # sacct submit (20 s) to end (70 s)
    assert out["makespan_s"] == 87.0  # first submit (-5 s) to last end (82 s)
    assert out["avg_jct_s"] == 68.5
    assert out["completed"] == 2 and out["not_completed"] == []


def test_measure_leaves_unfinished_jobs_out_of_avg_jct() -> None:
    jobs = [rc.MeasuredJob("ok", ("1",)), rc.MeasuredJob("bad", ("2",)), rc.MeasuredJob("never", ())]
    records = [record("1", end=40), record("2", state="FAILED", end=20)]
    out = rc.measure(jobs, records)
    assert out["avg_jct_s"] == 40.0 and out["makespan_s"] == 40.0
    assert out["not_completed"] == ["bad", "never"]


def test_trace_and_rates_follow_the_specs(tmp_path: Path) -> None:
    specs = load_file(rc.write_scaled_workload(rc.WORKLOAD, 0.3, tmp_path / "jobs.yaml"))
    types = ["v100", "t4", "k80"]
    rates = rc.table_rates(specs, types)
    assert rates[("small-v100", "v100")] == 1600.0 and rates[("large-k80x2", "k80")] == 160.0
    trace = rc.build_trace(specs)
    cross = next(t for t in trace if t.job_type == "cross-all-types")
    assert (cross.gpus, cross.arrival, cross.total_steps) == (3, 0.0, 210 * 384)
    full = rc.build_rates(specs, rates, types, first_only=False)
    naive = rc.build_rates(specs, rates, types, first_only=True)
    assert full.throughput("cross-all-types", "k80", 3) == 3 * 400.0
    assert naive.throughput("cross-all-types", "k80", 3) == 0.0  # the naive job holds its first type only
    assert naive.throughput("cross-all-types", "v100", 2) == 2 * 1600.0
    assert full.throughput("small-k80", "v100", 1) == 0.0  # types the job does not allow stay closed


def test_predict_naive_queues_each_type_on_its_own() -> None:
    specs = load_text("""
jobs:
  - {name: v1, workload: {model: mlp-small, batch_size: 100}, command: [x], work: {steps: 16}, gpus: {min: 4, types: [v100]}}
  - {name: k1, workload: {model: mlp-small, batch_size: 100}, command: [x], work: {steps: 4}, gpus: {min: 2, types: [k80]}}
  - {name: v2, workload: {model: mlp-small, batch_size: 100}, command: [x], work: {steps: 16}, gpus: {min: 4, types: [v100]}}
""", "test")
    rates = {(s.name, t): r for s in specs for t, r in (("v100", 100.0), ("t4", 50.0), ("k80", 25.0))}
    out = rc.predict(specs, rates)
    # v100: two 4-GPU jobs of 1600 samples at 400 samples/s, one after the other (4 s, 8 s);
    # k80: 400 samples at 50 samples/s (8 s), not blocked behind the second v100 job.
    assert out["naive"]["makespan_s"] == pytest.approx(8.0)
    assert out["naive"]["avg_jct_s"] == pytest.approx((4 + 8 + 8) / 3, abs=0.1)
    assert set(out["slurmhet"]) >= {"makespan_s", "avg_jct_s"}
    errors = rc.add_errors(out, {"naive": {"makespan_s": 10.0, "avg_jct_s": None}})
    assert errors["naive"]["error_makespan"] == pytest.approx(0.2) and errors["naive"]["error_avg_jct"] is None


def test_foreign_usage_counts_other_jobs_inside_the_window_only() -> None:
    records = [
        record("1", start=0, end=100, gpus={"v100": 1}),  # ours
        record("7", start=50, end=150, gpus={"v100": 2}),  # 50 s inside, 2 GPUs
        record("7.batch", start=50, end=150),
        record("8", start=200, end=300, gpus={"t4": 1}),  # after the window
        record("9", state="RUNNING", start=90, end=None, gpus={"k80": 1}),  # still running: up to the window's end
    ]
    out = rc.foreign_usage(records, {"1"}, T0, T0 + timedelta(seconds=100))
    assert out == {"jobs": 2, "gpu_s": 110.0}


def test_probe_jobs_are_short_copies_of_the_workloads_own_shapes(tmp_path: Path) -> None:
    source = rc.write_scaled_workload(rc.WORKLOAD, 1.0, tmp_path / "jobs.yaml")
    rates = rc.table_rates(load_file(source), ["v100", "t4", "k80"])
    probes = load_file(rc.write_probe_workload(source, rates, tmp_path / "probe.yaml", seconds=20.0))
    assert [(p.name, p.gpus.min) for p in probes] == [("probe-small-v100", 1), ("probe-large-v100x2", 2)]
    probe_rates = rc.table_rates(probes, ["v100"])
    for probe in probes:  # 20 s of emulated work on its first type, the command's --steps scaled alike
        assert probe.total_samples / (probe.gpus.min * probe_rates[(probe.name, "v100")]) == pytest.approx(20.0)
        argv = list(probe.command)
        assert int(argv[argv.index("--steps") + 1]) == probe.steps


def test_start_costs_are_jct_beyond_the_emulated_run() -> None:
    measured = {"jobs": [{"jct_s": 28.0, "emulated_run_s": 20.0}, {"jct_s": 31.5, "emulated_run_s": 20.0},
                         {"jct_s": None, "emulated_run_s": 20.0}]}
    assert rc.start_costs(measured) == [8.0, 11.5]


def test_predict_charges_the_start_cost_and_decides_at_replan_ticks_with_jobs_pinned() -> None:
    specs = load_text("""
jobs:
  - {name: a, workload: {model: mlp-small, batch_size: 100}, command: [x], work: {steps: 16}, gpus: {min: 1, types: [v100]}}
  - {name: b, workload: {model: mlp-small, batch_size: 100}, command: [x], work: {steps: 8}, gpus: {min: 1, types: [v100]}}
""", "test")
    rates = {(s.name, t): r for s in specs for t, r in (("v100", 100.0), ("t4", 50.0), ("k80", 25.0))}
    policy = rc.SlurmhetReplanned(round_s=5.0)
    assert policy.round_s == 5.0 and policy.migrate is False
    out = rc.predict(specs, rates, round_s=5.0, cluster=(("nodea", "v100", 1),), start_s={"slurmhet": 3.0, "naive": 2.0})
    # naive, one v100: a (16 s + 2) then b (8 s + 2): ends 18 and 28.
    assert (out["naive"]["makespan_s"], out["naive"]["avg_jct_s"]) == (28.0, 23.0)
    # slurmhet: b first (shorter), 3 + 8 = 11; a waits for the tick at 15: 15 + 3 + 16 = 34.
    assert (out["slurmhet"]["makespan_s"], out["slurmhet"]["avg_jct_s"]) == (34.0, 22.5)
    assert out["slurmhet"]["restarts"] == 0
