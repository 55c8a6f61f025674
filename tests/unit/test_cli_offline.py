"""CLI paths that need neither Slurm nor a database: simulate and bad input exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from slurmhet.cli import main


def test_simulate_generated_trace_json() -> None:
    result = CliRunner().invoke(main, ["simulate", "--generate", "12", "--cluster", "v100:4,k80:4", "--policy",
                                       "slurmhet,yarn-cs", "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["policies"]) == {"slurmhet", "yarn-cs"}
    for metrics in data["policies"].values():
        assert {"avg_jct", "weighted_jct", "makespan", "utilization", "avg_queue", "jain", "plan_seconds"} <= set(metrics)
        assert metrics["makespan"] >= metrics["avg_jct"] > 0 and 0 < metrics["utilization"] <= 1


def test_simulate_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(main, ["simulate", "--generate", "3", "--trace", "x", "--cluster", "v100:4"])
    assert both.exit_code == 2 and "exactly one of --trace and --generate" in both.output
    cluster = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:x"])
    assert cluster.exit_code == 2 and "bad cluster spec entry 'v100:x'" in cluster.output
    policy = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:4", "--policy", "fifo"])
    assert policy.exit_code == 2 and "unknown policy" in policy.output
    trace = tmp_path / "bad.trace"
    trace.write_text("ResNet-50 (batch size 64)\tcmd\tdir\t--n\t1\tnan\t1\t1\t-1\t0\n")
    broken = runner.invoke(main, ["simulate", "--trace", str(trace), "--cluster", "v100:4"])
    assert broken.exit_code == 2 and f"{trace}:1" in broken.output
    for value in ("0", "-2", "nan"):
        wait = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:4", "--max-wait-h", value])
        assert wait.exit_code == 2 and "--max-wait-h" in wait.output, wait.output
        assert "not in the range x>0" in wait.output or "must be a positive number of hours" in wait.output


def test_simulate_refuses_negative_or_nan_overheads() -> None:
    runner = CliRunner()
    for flag, value in (("--start-s", "-1"), ("--restart-s", "nan")):
        result = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:4", flag, value])
        assert result.exit_code == 2 and f"{flag} must be a finite number of seconds >= 0" in result.output, result.output
    for value in ("nan", "inf", "0"):  # a NaN round compared false with 0 and ran
        result = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:4", "--round-s", value])
        assert result.exit_code == 2, result.output
        assert "--round-s: round length must be a positive number of seconds" in result.output, result.output


def test_a_trace_job_the_cluster_cannot_run_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,gpus,workload,steps\n0,1,ResNet-18 (batch size 64),100\n"
                     "5,9,ResNet-18 (batch size 64),100\n")
    runner = CliRunner()
    too_big = runner.invoke(main, ["simulate", "--trace", str(trace), "--cluster", "v100:2"])
    assert too_big.exit_code == 2 and f"{trace}:3: asks 9 GPUs; the cluster has 2" in too_big.output, too_big.output
    no_rate = runner.invoke(main, ["simulate", "--trace", str(trace), "--cluster", "gpu9:16"])
    assert no_rate.exit_code == 2, no_rate.output
    assert f"{trace}:2: job 0 (ResNet-18 (batch size 64)) has no throughput on any GPU type" in no_rate.output


def test_simulate_json_on_stdout_is_only_json_with_lp_policies() -> None:
    """A real process, so output written by C code (HiGHS's banner) is seen too; gavel-mmf and hare solve LPs."""
    command = [sys.executable, "-c", "from slurmhet.cli import main; main()", "simulate", "--generate", "6",
               "--cluster", "v100:8,k80:8", "--policy", "gavel-mmf,hare,sched-allox", "--seed", "2", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["policies"]) == {"gavel-mmf", "hare", "sched-allox"}


def test_solver_prints_nothing_to_stdout() -> None:
    script = ("import pulp\nfrom slurmhet.planner.solver import highs, pulp_highs\n"
              "p = pulp.LpProblem('x', pulp.LpMinimize)\nx = p.add_variable('x', 0)\np += x\np += x >= 1\n"
              "p.solve(pulp_highs())\nhighs()\nprint(x.value())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1.0\n"


def test_simulate_refuses_jobs_the_cluster_or_a_policy_cannot_place() -> None:
    runner = CliRunner()
    too_big = runner.invoke(main, ["simulate", "--generate", "6", "--cluster", "v100:1", "--seed", "0"])
    assert too_big.exit_code == 2 and "job 1: asks 4 GPUs; the cluster has 1" in too_big.output, too_big.output
    # 4-GPU jobs fit the 4 GPUs, but gavel-mmf runs a job on one type and each type has 2: a clean exit 2, not a trace.
    starved = runner.invoke(main, ["simulate", "--generate", "6", "--cluster", "v100:2,k80:2", "--policy",
                                   "slurmhet,gavel-mmf", "--seed", "0"])
    assert starved.exit_code == 2, starved.output
    assert "--policy gavel-mmf: gavel-mmf places none of the waiting jobs 1 (4 GPUs)" in starved.output
    assert "GPUs per type: k80 2, v100 2" in starved.output and "Traceback" not in starved.output


def test_bench_unknown_case_exits_2() -> None:
    for command in ("reproduce", "placement"):
        result = CliRunner().invoke(main, ["bench", command, "--case", "nope"])
        assert result.exit_code == 2 and "--case: unknown case 'nope'" in result.output, result.output


def test_simulate_table_fits_80_columns() -> None:
    """Without --json: hours and milliseconds, so no cell of a pipe's 80-column table is cut to '…'."""
    result = CliRunner().invoke(main, ["simulate", "--generate", "12", "--cluster", "v100:8,k80:8", "--policy",
                                       "slurmhet,sched-allox", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert "JCT h" in result.output and "plan ms" in result.output and "sched-allox" in result.output
    assert "…" not in result.output and max(len(line) for line in result.output.splitlines()) <= 80


def _one_document(*argv: str) -> dict:
    """Run ``slurmhet ARGV`` as a real process; its stdout must be exactly one JSON document."""
    done = subprocess.run([sys.executable, "-m", "slurmhet", *argv], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # "Extra data" if a second document (or anything else) follows


def test_every_offline_json_output_is_one_document() -> None:
    placement = _one_document("bench", "placement", "--json", "--case", "tpds-example")
    assert [c["name"] for c in placement["cases"]] == ["tpds-example"]
    reproduce = _one_document("bench", "reproduce", "--json", "--quick", "--case", "hadare")
    assert set(reproduce["cases"]) == {"hadare"}
    sim = _one_document("simulate", "--generate", "8", "--cluster", "v100:4,k80:4", "--policy", "slurmhet,gavel-mmf",
                        "--bound", "--json")
    assert set(sim["bound"]) == {"avg_jct", "makespan", "weighted_jct"}
    for name, row in sim["policies"].items():
        assert set(row["ratio_to_bound"]) == {"avg_jct", "makespan", "weighted_jct"}
        assert all(r >= 1 - 1e-9 for r in row["ratio_to_bound"].values()), name
        records = row["jobs"]
        assert sorted(r["id"] for r in records) == list(range(8))
        for r in records:
            assert r["arrival"] <= r["start"] < r["end"] and sum(r["gpu_types"].values()) >= 1


def test_simulate_runs_gavel_traces_in_gavel_setup_unless_told() -> None:
    trace = Path(__file__).resolve().parents[2] / "slurmhet" / "data" / "gavel" / "traces" / "artifact_evaluation.trace"
    gavel = _one_document("simulate", "--trace", str(trace), "--cluster", "v100:4,k80:4", "--policy", "gavel-fifo",
                          "--json")
    assert gavel["meta"]["setup"] == "gavel" and gavel["meta"]["restart_s"] == 0.0
    told = _one_document("simulate", "--trace", str(trace), "--cluster", "v100:4,k80:4", "--policy", "gavel-fifo",
                         "--restart-s", "10", "--gpus-per-node", "2", "--json")
    assert told["meta"]["restart_s"] == 10.0 and told["meta"]["gpus_per_node"] == 2


def test_an_unknown_policy_is_named_where_it_was_written(tmp_path: Path) -> None:
    """`plan --policy` names the flag; a config's default_policy (what submit and replan plan with) names the key."""
    spec = tmp_path / "j.yaml"
    spec.write_text("name: a\ncommand: [x]\nworkload: {model: ResNet-18, batch_size: 64}\nwork: {steps: 5}\n")
    config = tmp_path / "config.yaml"
    config.write_text("default_policy: nope\n")
    env = {"SLURMHET_CONFIG": str(config), "SLURMHET_STATE_DIR": str(tmp_path / "state")}
    runner = CliRunner()
    flag = runner.invoke(main, ["plan", str(spec), "--cluster", "v100:4", "--policy", "fifo"], env=env)
    assert flag.exit_code == 2 and "--policy: unknown policy 'fifo' (hint: one of slurmhet, " in flag.output, flag.output
    key = runner.invoke(main, ["plan", str(spec), "--cluster", "v100:4"], env=env)
    assert key.exit_code == 2, key.output
    assert "default_policy: unknown policy 'nope' (hint: set the config's default_policy to one of " in key.output
