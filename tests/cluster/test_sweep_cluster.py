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
    # Variants the plan puts on one type now share one Slurm job array: variant k is its task A_k.
    by_type: dict[str, list[str]] = {}
    for j in jobs:
        (slurm_id,) = j["slurm_job_ids"]
        by_type.setdefault(j["allocation"].split("x", 1)[1].split("@")[0], []).append(slurm_id)
    assert max(len(v) for v in by_type.values()) >= 2, by_type  # 6 one-GPU variants on 3 types
    for gpu_type, slurm_ids in by_type.items():
        roots = {i.split("_")[0] for i in slurm_ids}
        if len(slurm_ids) > 1:
            assert len(roots) == 1 and sorted(int(i.split("_")[1]) for i in slurm_ids) == \
                list(range(len(slurm_ids))), (gpu_type, slurm_ids)
        else:
            assert "_" not in slurm_ids[0], (gpu_type, slurm_ids)  # a lone variant is a plain batch job
    ids = [j["job_id"] for j in jobs]
    deadline = time.monotonic() + 120
    while not all(status(state_dir)[i]["state"] == "RUNNING" for i in ids):
        assert time.monotonic() < deadline, status(state_dir)
        time.sleep(2)
    rows = status(state_dir)
    assert {rows[i]["group"] for i in ids} == {"sw"}
    # Each array task runs its own variant and writes its own log, which `logs` finds by the variant's id.
    arrayed = [j for j in jobs if "_" in j["slurm_job_ids"][0]]
    for j in arrayed[:2]:
        lr = j["name"].split("-", 1)[1].rsplit("-seed", 1)[0]
        seed = j["name"].rsplit("-seed", 1)[1]
        while f"lr={lr} seed={seed}" not in cli("logs", str(j["job_id"]), state=state_dir).stdout:
            assert time.monotonic() < deadline, cli("logs", str(j["job_id"]), state=state_dir).stdout
            time.sleep(1)
        assert cli("logs", str(j["job_id"]), state=state_dir).stdout.count("lr=") == 1
    # Cancelling one variant cancels its task alone; its array siblings keep running.
    alone, sibling = arrayed[0], arrayed[1]
    cli("cancel", str(alone["job_id"]), state=state_dir)
    assert status(state_dir)[alone["job_id"]]["state"] == "CANCELLED"
    time.sleep(3)
    rows = status(state_dir)
    assert rows[sibling["job_id"]]["state"] == "RUNNING", rows[sibling["job_id"]]
    ids = [i for i in ids if i != alone["job_id"]]

    cancelled = cli("cancel", "--group", "sw", state=state_dir).stdout.splitlines()
    assert sorted(int(line.split("\t")[0]) for line in cancelled) == sorted(ids)
    ids.append(alone["job_id"])
    slurm_ids = sorted({i.split("_")[0] for j in jobs for i in j["slurm_job_ids"]})
    assert {r.state for r in accounting(slurm_ids) if not r.id.is_step} == {"CANCELLED"}
    assert {status(state_dir)[i]["state"] for i in ids} == {"CANCELLED"}
    again = cli("cancel", "--group", "sw", state=state_dir, check=False)
    assert again.returncode == 2 and "no live jobs in group 'sw'" in again.stderr

    report = json.loads(cli("report", "--group", "sw", "--json", state=state_dir).stdout)
    assert sorted(r["id"] for r in report["jobs"]) == sorted(ids)
    # A variant's row holds its own array task only (its time and GPU-hours, not its siblings').
    rows = {r["id"]: r for r in report["jobs"]}
    for j in arrayed:
        assert rows[j["job_id"]]["slurm_ids"] == j["slurm_job_ids"], rows[j["job_id"]]
        assert sum(rows[j["job_id"]]["gpu_hours"].values()) * 3600 <= rows[j["job_id"]]["run_s"] + 5
    none = cli("report", "--group", "nope", "--json", state=state_dir, check=False)
    assert none.returncode == 2 and none.stdout == ""
