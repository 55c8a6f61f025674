"""``after:`` on the dev cluster: a dependant waits in slurmhet while its predecessor is not yet running, goes to
Slurm with ``--dependency=afterok`` once the predecessor runs as its final Slurm job (Slurm then starts it the
moment the predecessor completes, with no replan in between), is taken back when the run it was chained to is
retried, and is cancelled, in slurmhet and in Slurm, when its predecessor fails for good."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import accounting, cli, never_ran, status

pytestmark = pytest.mark.usefixtures("slurm_cluster")

SPEC = """\
jobs:
  - name: train
    command: [bash, -c, "sleep 25; echo trained"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: eval
    after: [train]
    command: [bash, -c, "echo evaluated"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: bad
    command: [bash, -c, "sleep 25; exit 3"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
  - name: after-bad
    after: [bad]
    command: [bash, -c, "echo never"]
    workload: {model: ResNet-18, batch_size: 64}
    work: {steps: 10}
"""


def _dependency(row: dict) -> str:
    (part,) = row["slurm"]
    return str(part["after"])


def test_after_holds_then_chains_in_slurm_and_cancels_when_the_predecessor_fails(tmp_path: Path, state_dir: Path,
                                                                                  leftovers: list[str]) -> None:
    spec = tmp_path / "deps.yaml"
    spec.write_text(SPEC)
    jobs = {j["name"]: j for j in json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]}
    leftovers.extend(i for j in jobs.values() for i in j["slurm_job_ids"])
    ids = {name: j["job_id"] for name, j in jobs.items()}
    assert jobs["train"]["state"] == jobs["bad"]["state"] == "SUBMITTED"
    # Just submitted, the predecessor is not running yet: slurmhet holds the dependant itself.
    assert jobs["eval"]["state"] == "PENDING" and not jobs["eval"]["slurm_job_ids"]
    reason = jobs["eval"]["reason"]
    assert reason.startswith(f"waits for job {ids['train']} (train, ") and reason.endswith(" to complete (after:)")

    # Once the predecessors run, a replan (cron) hands both dependants to Slurm with afterok on them.
    deadline = time.monotonic() + 120
    while True:
        cli("replan", "--once", state=state_dir)
        rows = status(state_dir)
        if rows[ids["eval"]]["slurm"] and rows[ids["after-bad"]]["slurm"]:
            break
        assert time.monotonic() < deadline, rows
        time.sleep(1)
    leftovers.extend(p["id"] for name in ("eval", "after-bad") for p in rows[ids[name]]["slurm"])
    train_id, bad_id = (rows[ids[n]]["slurm"][0]["id"] for n in ("train", "bad"))
    assert rows[ids["train"]]["state"] == rows[ids["bad"]]["state"] == "RUNNING"
    assert _dependency(rows[ids["eval"]]) == f"afterok:{train_id}"
    assert _dependency(rows[ids["after-bad"]]) == f"afterok:{bad_id}"
    detail = cli("status", str(ids["eval"]), state=state_dir).stdout
    assert f"starts after afterok:{train_id}" in detail, detail

    # No replan from here on: Slurm itself starts eval when train completes.
    while rows[ids["eval"]]["state"] != "COMPLETED":
        assert time.monotonic() < deadline + 60, rows
        time.sleep(2)
        rows = status(state_dir)
    eval_id = rows[ids["eval"]]["slurm"][0]["id"]
    train, ev = ([r for r in accounting([i]) if not r.id.is_step][0] for i in (train_id, eval_id))
    assert train.end is not None and ev.start is not None and train.end <= ev.start
    assert ev.submit is not None and ev.submit < train.end  # in Slurm before its predecessor ended
    assert (ev.start - train.end).total_seconds() < 30  # Slurm's scheduler, not a replan interval, started it

    # bad fails at start-up, is retried once (after-bad's afterok on the first run can never be met, so it is
    # taken back and chained to the second run) and fails again: after-bad is cancelled with the reason, and
    # none of its Slurm jobs ever ran.
    while rows[ids["after-bad"]]["state"] != "CANCELLED":
        assert time.monotonic() < deadline + 240, rows
        cli("replan", "--once", state=state_dir)
        time.sleep(2)
        rows = status(state_dir)
    assert rows[ids["bad"]]["state"] == "FAILED" and [p["role"] for p in rows[ids["bad"]]["slurm"]] == [
        "retried", "batch"]
    assert rows[ids["after-bad"]]["reason"] == f"cancelled: job {ids['bad']} (bad) it runs after ended FAILED"
    after_bad = [r for r in accounting([p["id"] for p in rows[ids["after-bad"]]["slurm"]]) if not r.id.is_step]
    assert after_bad and all(r.state == "CANCELLED" and never_ran(r) for r in after_bad), after_bad
