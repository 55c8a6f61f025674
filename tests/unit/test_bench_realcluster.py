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


def test_slurm_chooses_request_asks_for_gpus_min_of_any_allowed_type_and_lets_slurm_pick() -> None:
    spec = load_text("""
jobs:
  - name: cross
    workload: {model: mlp-small, batch_size: 128}
    global_batch: 256
    command: [python, examples/train.py, --steps, "7"]
    work: {steps: 7}
    gpus: {min: 2, max: 3, types: [v100, t4]}
    time_limit: 10
  - name: anywhere
    workload: {model: mlp-small, batch_size: 128}
    command: [python, examples/train.py]
    work: {steps: 7}
""", "test")
    node_types = {"nodeb": "t4", "nodea": "v100", "nodec": "k80"}
    m = rc.slurm_chooses_request(3, spec[0], "/logs", ("python", "-m", "slurmhet", "run", "--"),
                                 [("SLURMHET_EMULATE_THROUGHPUT", "1")], ["v100", "t4", "k80"], node_types)
    assert "--gpus=2" in m.argv and "--constraint=v100|t4" in m.argv and "--nodes=1" in m.argv
    assert "--ntasks-per-node=2" in m.argv and "--time=10" in m.argv
    assert not any(a.startswith("--gres") for a in m.argv)  # no type: Slurm chooses
    assert "SLURMHET_RANK_GPU_TYPES" not in m.script  # the ranks read their node's type instead
    assert "export SLURMHET_NODE_GPU_TYPES=nodea=v100,nodeb=t4,nodec=k80" in m.script
    assert "export SLURMHET_EMULATE_THROUGHPUT=1" in m.script
    assert "slurmhet run -- python examples/train.py --steps 7" in m.script
    anywhere = rc.slurm_chooses_request(4, spec[1], "/logs", ("x",), [], ["v100", "t4", "k80"], node_types)
    assert "--constraint=v100|t4|k80" in anywhere.argv and "--gpus=1" in anywhere.argv


def test_plan_error_compares_slurmhets_predicted_jcts_with_the_measured_ones() -> None:
    jobs = [rc.MeasuredJob("a", ("1",), T0, predicted_jct_s=50.0), rc.MeasuredJob("b", ("2",), T0, predicted_jct_s=90.0),
            rc.MeasuredJob("c", ("3",), T0), rc.MeasuredJob("d", ("4",), T0, predicted_jct_s=10.0)]
    records = [record("1", end=40), record("2", end=100), record("3", end=60), record("4", state="FAILED", end=5)]
    measured = rc.measure(jobs, records)
    assert [j["predicted_jct_s"] for j in measured["jobs"]] == [50.0, 90.0, None, 10.0]
    out = rc.plan_error(measured)
    # a and b only (c has no prediction, d did not complete): predicted 70 s, measured 70 s on average;
    # per job 10/40 and 10/100.
    assert out == {"jobs": 2, "avg_jct_predicted_s": 70.0, "avg_jct_measured_s": 70.0, "error_avg_jct": 0.0,
                   "mean_job_error": round((0.25 + 0.1) / 2, 4)}
    assert rc.plan_error(rc.measure(jobs[2:3], records))["error_avg_jct"] is None


def test_arm_ratios_are_slurmhet_over_each_baseline() -> None:
    arms = {"slurmhet": {"makespan_s": 300.0, "avg_jct_s": 150.0}, "naive": {"makespan_s": 400.0, "avg_jct_s": 200.0},
            "slurm-chooses": {"makespan_s": 375.0, "avg_jct_s": None}}
    assert rc.arm_ratios(arms) == {"slurmhet/naive": {"makespan": 0.75, "avg_jct": 0.75},
                                   "slurmhet/slurm-chooses": {"makespan": 0.8, "avg_jct": None}}


def test_background_starts_the_devcluster_noise_with_the_same_seed_for_every_arm() -> None:
    load = rc.Background(rate_per_min=3.0, seed=7)
    assert load.start_argv() == [str(rc.DEVCLUSTER), "noise", "start", "--rate", "3", "--seed", "7",
                                 "--max-queued", "8"]
    assert rc.DEVCLUSTER.is_file() and rc.ARMS == ("slurmhet", "naive", "slurm-chooses")


def test_run_reports_every_arm_with_and_without_background_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The glue of run(): one result per load and arm, ratios, plan error and simulator error per load."""
    calls: list[list[str]] = []

    def devcluster(argv: list[str]) -> object:
        calls.append(argv[1:])
        return type("Done", (), {"returncode": 3 if argv[2] == "status" else 0, "stderr": ""})()

    def arms(spec_file: Path, specs: object, rates: object, work: Path, replan_every_s: float, timeout_s: float,
             client: object, load: rc.Background | None, busy: dict[str, int]) -> tuple[dict[str, object], set[str]]:
        slow = 2.0 if load else 1.0
        jobs = [{"name": "a", "state": "COMPLETED", "jct_s": 100.0 * slow, "predicted_jct_s": 90.0}]
        out = {arm: {"makespan_s": m * slow, "avg_jct_s": m * slow / 2, "jobs": jobs, "origin": T0}
               for arm, m in (("slurmhet", 300.0), ("naive", 400.0), ("slurm-chooses", 375.0))}
        return out, {"1"}

    monkeypatch.setattr(rc, "_devcluster", devcluster)
    monkeypatch.setattr(rc, "SlurmCli", lambda *a, **k: None)
    monkeypatch.setattr(rc, "_wait_idle", lambda client, timeout_s: 0)
    monkeypatch.setattr(rc, "run_probe", lambda *a: {"start_s": 4.0, "replan_s": 1.0})
    monkeypatch.setattr(rc, "predict", lambda *a, **k: {"slurmhet": {"makespan_s": 330.0, "avg_jct_s": 150.0},
                                                        "naive": {"makespan_s": 400.0, "avg_jct_s": 200.0}})
    monkeypatch.setattr(rc, "run_arms", arms)
    monkeypatch.setattr(rc, "_foreign", lambda *a: {"jobs": 0, "gpu_s": 0.0})
    out = rc.run(0.1, 5.0, rc.Background(seed=4))
    assert calls == [["noise", "status"]]  # run_arms starts and stops the noise itself
    assert set(out["summary"]) == {"quiet", "background"} and out["background"]["seed"] == 4
    quiet, loaded = out["summary"]["quiet"], out["summary"]["background"]
    assert quiet["arms"]["slurm-chooses"] == {"makespan_s": 375.0, "avg_jct_s": 187.5}
    assert quiet["ratios"]["slurmhet/naive"] == {"makespan": 0.75, "avg_jct": 0.75}
    assert loaded["ratios"]["slurmhet/slurm-chooses"] == {"makespan": 0.8, "avg_jct": 0.8}
    assert quiet["plan_error"]["error_avg_jct"] == 0.1 and loaded["plan_error"]["error_avg_jct"] == 0.55
    assert quiet["simulator_error"]["slurmhet"]["error_makespan"] == 0.1
    assert loaded["simulator_error"]["slurmhet"]["error_makespan"] == 0.45
    assert out["simulator"]["slurmhet"] == {"makespan_s": 330.0, "avg_jct_s": 150.0}  # not changed by the errors
    assert "origin" not in out["arms"]["quiet"]["slurmhet"]
