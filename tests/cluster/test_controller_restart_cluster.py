"""slurmctld restarts while slurmhet jobs run and wait: afterwards every job is found in its right state, the one
that finished meanwhile is recorded from accounting, and nothing is resubmitted or duplicated."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import cli, job, status, write
from tests.cluster.replan_helpers import live_tagged, sbatch_foreign, store_tag, wait_slurm

pytestmark = pytest.mark.usefixtures("slurm_cluster")

DEVCLUSTER = Path(__file__).resolve().parents[2] / "etc" / "devcluster" / "devcluster"


def test_a_controller_restart_loses_nothing_and_runs_nothing_twice(tmp_path: Path, state_dir: Path,
                                                                   leftovers: list[str]) -> None:
    blocker = sbatch_foreign("--gres=gpu:k80:2", "-p", "k80", "-t", "10", "--wrap", "sleep 600")
    leftovers.append(blocker)
    wait_slurm(blocker, ("RUNNING",), timeout=90)
    spec = write(tmp_path / "jobs.yaml", job("long", ["sleep", "600"], "{min: 1, max: 1, types: [v100]}"),
                 job("short", ["sleep", "8"], "{min: 1, max: 1, types: [t4]}"),
                 job("waits", ["sleep", "5"], "{min: 1, max: 1, types: [k80]}"))  # k80s held: it waits
    jobs = {j["name"]: j for j in json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]}
    leftovers.extend(i for j in jobs.values() for i in j["slurm_job_ids"])
    ids = {name: j["job_id"] for name, j in jobs.items()}
    assert [jobs[n]["state"] for n in ("long", "short", "waits")] == ["SUBMITTED", "SUBMITTED", "PENDING"], jobs
    deadline = time.monotonic() + 90
    while (rows := status(state_dir))[ids["short"]]["state"] != "RUNNING":
        assert time.monotonic() < deadline, rows
        time.sleep(1)
    before = live_tagged(store_tag(state_dir))

    # Down for 20 s: "short" (8 s) ends meanwhile. Commands fail cleanly while it is down.
    restart = subprocess.Popen([str(DEVCLUSTER), "restart", "slurmctld", "--down-s", "20"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30  # SIGTERM'd, slurmctld saves its state first (seconds on 26.05)
    while subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30).stdout.count("UP"):
        assert time.monotonic() < deadline and restart.poll() is None, "slurmctld did not go down"
        time.sleep(0.5)
    down = cli("replan", "--once", state=state_dir, check=False)
    assert down.returncode == 1 and "Unable to contact slurm controller" in down.stderr, down
    assert len(down.stderr.strip().splitlines()) == 1, down.stderr
    _, err = restart.communicate(timeout=180)
    assert restart.returncode == 0, err

    deadline = time.monotonic() + 120
    while True:
        out = cli("replan", "--once", state=state_dir, check=False)
        rows = status(state_dir, check=False) if out.returncode == 0 else {}
        if rows and rows[ids["short"]]["state"] == "COMPLETED":
            break
        assert time.monotonic() < deadline, (out.stdout, out.stderr, rows)
        time.sleep(2)
    assert "SUBMITTED" not in out.stdout, out.stdout  # nothing resubmitted
    assert rows[ids["long"]]["state"] == "RUNNING" and rows[ids["waits"]]["state"] == "PENDING", rows
    assert [p["id"] for name in ids for p in rows[ids[name]]["slurm"]] == [
        i for name in ids for i in jobs[name]["slurm_job_ids"]]  # each job has the Slurm job it had
    after = live_tagged(store_tag(state_dir))
    assert set(after) <= set(before) and all(len(v) == 1 for v in after.values()), (before, after)

    subprocess.run(["scancel", blocker], check=True, timeout=30)  # the k80s free up: "waits" runs, once
    deadline = time.monotonic() + 120
    while (rows := status(state_dir))[ids["waits"]]["state"] != "COMPLETED":
        assert time.monotonic() < deadline, rows
        cli("replan", "--once", state=state_dir)
        time.sleep(2)
    assert len(rows[ids["waits"]]["slurm"]) == 1, rows[ids["waits"]]
