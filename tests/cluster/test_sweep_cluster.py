"""A sweep on the dev cluster: six variants submitted, listed, cancelled and reported as one group."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, status

pytestmark = pytest.mark.usefixtures("slurm_cluster")

SWEEP = """\
jobs:
  - name: sw-{lr}
    sweep: {lr: [1e-3, 3e-4, 1e-4], seed: [0, 1]}
    command: [bash, -c, "echo lr={lr} seed={seed}; sleep 300"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
    gpus: {min: 1, max: 1}
"""


def test_a_six_variant_sweep_runs_and_is_cancelled_and_reported_as_a_group(tmp_path: Path, state_dir: Path,
                                                                             leftovers: list[str]) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SWEEP)
    jobs = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(i for j in jobs for i in j["slurm_job_ids"])
    assert sorted(j["name"] for j in jobs) == sorted(f"sw-{lr}-seed{s}" for lr in ("1e-3", "3e-4", "1e-4")
                                                     for s in (0, 1))
    assert all(j["state"] == "SUBMITTED" for j in jobs)  # 10 GPUs: every variant starts now, on its own type
    ids = [j["job_id"] for j in jobs]
    deadline = time.monotonic() + 120
    while not all(status(state_dir)[i]["state"] == "RUNNING" for i in ids):
        assert time.monotonic() < deadline, status(state_dir)
        time.sleep(2)
    rows = status(state_dir)
    assert {rows[i]["group"] for i in ids} == {"sw"}
    first = jobs[0]
    while "lr=" not in cli("logs", str(first["job_id"]), state=state_dir).stdout:
        assert time.monotonic() < deadline
        time.sleep(1)
    assert f"lr={first['name'].split('-', 1)[1].rsplit('-seed', 1)[0]}" in cli("logs", str(first["job_id"]),
                                                                               state=state_dir).stdout

    cancelled = cli("cancel", "--group", "sw", state=state_dir).stdout.splitlines()
    assert sorted(int(line.split("\t")[0]) for line in cancelled) == sorted(ids)
    slurm_ids = [i for j in jobs for i in j["slurm_job_ids"]]
    assert {r.state for r in accounting(slurm_ids) if not r.id.is_step} == {"CANCELLED"}
    assert {status(state_dir)[i]["state"] for i in ids} == {"CANCELLED"}
    again = cli("cancel", "--group", "sw", state=state_dir, check=False)
    assert again.returncode == 2 and "no live jobs in group 'sw'" in again.stderr

    report = json.loads(cli("report", "--group", "sw", "--json", state=state_dir).stdout)
    assert sorted(r["id"] for r in report["jobs"]) == sorted(ids)
    none = cli("report", "--group", "nope", "--json", state=state_dir, check=False)
    assert none.returncode == 2 and none.stdout == ""
