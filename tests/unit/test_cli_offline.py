"""CLI paths that need neither Slurm nor a database: simulate and bad input exit codes."""

from __future__ import annotations

import json
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


def test_simulate_refuses_negative_or_nan_overheads() -> None:
    runner = CliRunner()
    for flag, value in (("--start-s", "-1"), ("--restart-s", "nan")):
        result = runner.invoke(main, ["simulate", "--generate", "3", "--cluster", "v100:4", flag, value])
        assert result.exit_code == 2 and f"{flag} must be a finite number of seconds >= 0" in result.output, result.output
