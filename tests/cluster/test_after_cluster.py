"""``after:`` on the dev cluster: a dependant waits in slurmhet until its predecessor completes, and is
cancelled, never submitted, when its predecessor fails."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, status

pytestmark = pytest.mark.usefixtures("slurm_cluster")

SPEC = """\
jobs:
  - name: train
    command: [bash, -c, "sleep 6; echo trained"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: eval
    after: [train]
    command: [bash, -c, "echo evaluated"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: bad
    command: [bash, -c, "exit 3"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: after-bad
    after: [bad]
    command: [bash, -c, "echo never"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
"""


def test_after_holds_until_the_predecessor_completes_and_cancels_when_it_fails(tmp_path: Path, state_dir: Path,
                                                                               leftovers: list[str]) -> None:
    spec = tmp_path / "deps.yaml"
    spec.write_text(SPEC)
    jobs = {j["name"]: j for j in json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]}
    leftovers.extend(i for j in jobs.values() for i in j["slurm_job_ids"])
    ids = {name: j["job_id"] for name, j in jobs.items()}
    assert jobs["train"]["state"] == jobs["bad"]["state"] == "SUBMITTED"
    assert jobs["eval"]["state"] == "PENDING" and not jobs["eval"]["slurm_job_ids"]
    reason = jobs["eval"]["reason"]  # the predecessor's state as planned (PENDING, then SUBMITTED in status)
    assert reason.startswith(f"waits for job {ids['train']} (train, ") and reason.endswith(" to complete (after:)")

    deadline = time.monotonic() + 240
    while True:
        cli("replan", "--once", state=state_dir)  # what cron does
        rows = status(state_dir)
        if rows[ids["eval"]]["state"] == "COMPLETED" and rows[ids["after-bad"]]["state"] == "CANCELLED":
            break
        assert time.monotonic() < deadline, rows
        time.sleep(2)
    assert rows[ids["train"]]["state"] == "COMPLETED" and rows[ids["bad"]]["state"] == "FAILED"
    assert rows[ids["after-bad"]]["slurm"] == []  # never reached Slurm
    assert rows[ids["after-bad"]]["reason"] == f"cancelled: job {ids['bad']} (bad) it runs after ended FAILED"
    train_id = rows[ids["train"]]["slurm"][0]["id"]
    eval_id = rows[ids["eval"]]["slurm"][0]["id"]
    leftovers.append(eval_id)
    train, ev = ([r for r in accounting([i]) if not r.id.is_step][0] for i in (train_id, eval_id))
    assert train.end is not None and ev.submit is not None and ev.submit >= train.end  # submitted after it ended
