"""`slurmhet result` on the dev cluster: an entrypoint job's return value, and an exception's traceback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import cli, status

pytestmark = pytest.mark.usefixtures("slurm_cluster")

REPO = Path(__file__).resolve().parents[2]
SPEC = """\
jobs:
  - name: adds
    entrypoint: tests.cluster.entry_targets:add
    args: [2, 3]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: raises
    entrypoint: tests.cluster.entry_targets:boom
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: plain
    command: [bash, -c, "echo hi"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
"""


def test_result_returns_the_value_or_the_exception(tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    spec = tmp_path / "entry.yaml"
    spec.write_text(SPEC)
    jobs = {j["name"]: j for j in json.loads(cli("submit", "--json", str(spec), state=state_dir, cwd=REPO).stdout)["jobs"]}
    leftovers.extend(i for j in jobs.values() for i in j["slurm_job_ids"])
    ids = {name: j["job_id"] for name, j in jobs.items()}
    # "raises" fails at start-up: by the failure rules it is retried once (a replan submits it again), then FAILED.
    deadline = time.monotonic() + 180
    while not all((rows := status(state_dir))[i]["state"] in ("COMPLETED", "FAILED", "CANCELLED") for i in ids.values()):
        assert time.monotonic() < deadline, rows
        cli("replan", "--once", state=state_dir, cwd=REPO)
        time.sleep(2)
    assert rows[ids["adds"]]["state"] == "COMPLETED" and rows[ids["raises"]]["state"] == "FAILED"
    assert [p["role"] for p in rows[ids["raises"]]["slurm"]] == ["retried", "batch"]

    assert cli("result", str(ids["adds"]), state=state_dir).stdout.strip() == "{'sum': 5}"
    assert json.loads(cli("result", "--json", str(ids["adds"]), state=state_dir).stdout) == {"sum": 5}
    raised = cli("result", str(ids["raises"]), state=state_dir, check=False)
    assert raised.returncode == 1 and "ValueError: boom from the entrypoint" in raised.stderr
    assert f"job {ids['raises']} raised" in raised.stderr
    plain = cli("result", str(ids["plain"]), state=state_dir, check=False)
    assert plain.returncode == 2 and "not a Python entrypoint" in plain.stderr
    assert "==> part 1: Slurm job" in cli("logs", str(ids["adds"]), state=state_dir).stdout  # submitit's log found
