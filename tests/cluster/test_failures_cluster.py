"""Runs that fail, on the dev cluster: a start-up crash is retried once and then left FAILED with its stderr;
a run out of GPU memory is re-planned on a type with more memory and completes there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cluster.helpers import cli, job, status, write
from tests.cluster.replan_helpers import sbatch_foreign, scancel, wait_slurm

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def _replan_until(state_dir: Path, job_id: int, states: tuple[str, ...], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        cli("replan", "--once", state=state_dir)  # what cron does
        row = status(state_dir)[job_id]
        if row["state"] in states:
            return row
        assert time.monotonic() < deadline, row
        time.sleep(2)


def test_a_start_up_crash_is_retried_once_then_failed_with_its_stderr(tmp_path: Path, state_dir: Path,
                                                                      leftovers: list[str]) -> None:
    crash = 'echo "Traceback: no module named nothere (run $SLURM_JOB_ID)" >&2; exit 3'
    spec = write(tmp_path / "crash.yaml", job("crash", ["bash", "-c", crash], "{min: 1, max: 1, types: [t4]}"))
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    job_id = out["job_id"]
    row = _replan_until(state_dir, job_id, ("FAILED",))
    runs = row["slurm"]
    assert [p["role"] for p in runs] == ["retried", "batch"], runs  # two runs in Slurm, not more
    assert row["reason"].startswith("failed 2 times within 5 min of starting (exit 3:0)"), row["reason"]
    for _ in range(3):  # later replans leave it failed: no third run
        cli("replan", "--once", state=state_dir)
    assert len(status(state_dir)[job_id]["slurm"]) == 2

    detail = json.loads(cli("status", str(job_id), "--json", state=state_dir).stdout)
    last = detail["last_failure"]
    assert (last["verdict"], last["exit_code"], last["slurm_job_ids"]) == ("failed", "3:0", [runs[1]["id"]])
    # The program's stderr, then the launcher's and srun's words on its end.
    assert last["stderr_tail"][0] == f"Traceback: no module named nothere (run {runs[1]['id']})", last
    assert "slurmhet run: rank 0 command exited with status 3" in last["stderr_tail"]
    text = cli("status", str(job_id), state=state_dir).stdout
    assert f"| Traceback: no module named nothere (run {runs[1]['id']})" in text, text
    assert [e["kind"] for e in detail["events"]].count("retried") == 1
    # Both runs' stderr stay readable, the retried run first.
    errors = cli("logs", "--stderr", str(job_id), state=state_dir).stdout
    assert errors.index(f"(run {runs[0]['id']})") < errors.index(f"(run {runs[1]['id']})")
    report = json.loads(cli("report", "--json", state=state_dir).stdout)
    (line,) = [j for j in report["jobs"] if j["id"] == job_id]
    assert (line["state"], line["restarts"]) == ("FAILED", 1)


def test_a_run_out_of_gpu_memory_is_replanned_on_a_type_with_more_memory(tmp_path: Path, state_dir: Path,
                                                                         leftovers: list[str]) -> None:
    # Every t4 is held by another user: the job starts on k80 (12 GB), where it runs out of GPU memory.
    blocker = sbatch_foreign("--gres=gpu:t4:4", "-p", "t4", "-t", "10", "--wrap", "sleep 600")
    leftovers.append(blocker)
    wait_slurm(blocker, ("RUNNING",), timeout=90)
    script = ('if [ "$SLURMHET_GPU_TYPE" = k80 ]; then echo "torch.OutOfMemoryError: CUDA out of memory. '
              'Tried to allocate 2.00 GiB" >&2; exit 1; fi; echo "ran on $SLURMHET_GPU_TYPE"')
    spec = write(tmp_path / "oom.yaml", job("big-model", ["bash", "-c", script], "{min: 1, max: 1, types: [k80, t4]}"))
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    assert out["allocation"].endswith("k80@nodec"), out
    job_id = out["job_id"]
    deadline = time.monotonic() + 90
    row = status(state_dir)[job_id]  # status syncs: the failed run is judged there, no replan needed
    while not any(p["role"] == "retried" for p in row["slurm"]):
        assert time.monotonic() < deadline and row["state"] != "FAILED", row
        time.sleep(2)
        row = status(state_dir)[job_id]
    assert row["reason"] == "GPU out of memory on k80 (12 GB); re-planned on t4", row
    scancel([blocker])  # the t4s free up: a replan runs it there
    row = _replan_until(state_dir, job_id, ("COMPLETED", "FAILED"))
    assert row["state"] == "COMPLETED", row
    assert [(p["role"], p["gpu_type"]) for p in row["slurm"]] == [("retried", "k80"), ("batch", "t4")]
    assert "ran on t4" in cli("logs", str(job_id), state=state_dir).stdout
    detail = json.loads(cli("status", str(job_id), "--json", state=state_dir).stdout)
    assert detail["spec"]["gpus"]["types"] == ["t4"] and detail["last_failure"]["unusable"] == ["k80"]
