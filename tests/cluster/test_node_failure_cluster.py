"""A node fails under a running job, on the dev cluster: the job restarts as a whole from its last checkpoint on
the nodes left, replan says which node failed under which job, no two runs of it overlap, and status and report
count the restart."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurmhet.runtime.progress import job_steps, read_progress
from tests.cluster.helpers import accounting, cli, status, train_spec

pytestmark = pytest.mark.usefixtures("slurm_cluster")

REPO = Path(__file__).resolve().parents[2]
STEPS = 80
EVERY = 5
#: 32 emulated samples/s per GPU at a global batch of 48 on 6 GPUs: about 3 steps a second, so the run is still
#: mid-way when the node fails however slow the machine (at 96, some 9 steps a second, a loaded machine's CLI
#: calls let it reach its last step first: the next test's case).
ENV = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_EMULATED_SAMPLES_PER_S": "32"}


def _steps(state_dir: Path, job_id: int) -> int:
    return max((r.steps_done for r in read_progress(state_dir / "progress") if r.job_id == str(job_id)), default=0)


def _node(name: str, state: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={name}", f"state={state}", "reason=slurmhet node-failure test"],
                   check=True, timeout=30)


def _resume(name: str) -> None:
    """Bring the node back unless it already is (slurmd re-registering returns it: ReturnToService=2)."""
    if subprocess.run(["sinfo", "-h", "-n", name, "-o", "%T"], capture_output=True, text=True,
                      timeout=30).stdout.strip().startswith(("down", "drain")):
        _node(name, "resume")


def _fail_node_and_replan(state_dir: Path, job_id: int, node: str, env: dict[str, str]
                          ) -> tuple[dict[str, Any], list[str]]:
    """``node`` fails under the job: down kills and requeues what runs there; drained, it stays out of use (a
    slurmd re-registering would otherwise return a merely DOWN node at once: ReturnToService=2), as a broken node
    does until repaired. Then ``replan --once`` every 2 s, as cron would, until the job is final, and the node is
    brought back. The job's last status row, and replan's events and actions on the way."""
    _node(node, "down")
    try:
        _node(node, "drain")
        events: list[str] = []
        deadline = time.monotonic() + 240
        while (row := status(state_dir, env=env)[job_id])["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
            assert time.monotonic() < deadline, (row, events)
            result = json.loads(cli("replan", "--once", "--json", state=state_dir, env=env).stdout)
            events += result["events"] + result["actions"]
            time.sleep(2)
    finally:
        _resume(node)
    return row, events


def test_a_node_failing_under_a_het_job_restarts_it_whole_from_its_checkpoint(tmp_path: Path, state_dir: Path,
                                                                             leftovers: list[str]) -> None:
    ckpt = tmp_path / "ckpt"
    spec = train_spec(tmp_path / "job.yaml", "het-train", STEPS, 48, "{min: 6, max: 6, types: [v100, t4, k80]}", ckpt,
                      "--dataset-size", "480", "--checkpoint-every", str(EVERY), batch_size=8)
    env = {**ENV, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    job_id, (first,) = out["job_id"], out["slurm_job_ids"]
    deadline = time.monotonic() + 120
    while _steps(state_dir, job_id) < 2 * EVERY + 2:
        assert time.monotonic() < deadline, status(state_dir)[job_id]
        time.sleep(0.5)
    row = status(state_dir)[job_id]
    assert row["state"] == "RUNNING" and len(row["slurm"]) == 2, row  # one het job, two components
    (failing,) = {p["nodes"] for p in row["slurm"]} - {"nodea"}  # 4 v100 on nodea, 2 GPUs on another node
    seen = _steps(state_dir, job_id)
    row, events = _fail_node_and_replan(state_dir, job_id, failing, env)
    assert row["state"] == "COMPLETED", (row, events)
    assert any(e.startswith(f"node {failing} failed under job {job_id} (het-train)") for e in events), events
    runs = sorted({p["id"] for p in row["slurm"]}, key=int)
    assert len(runs) == 2 and runs[0] == first, row  # the failed run and the restart, nothing more
    assert all(failing not in p["nodes"] for p in row["slurm"] if p["id"] == runs[1]), row
    records = {r.id.job: r for r in accounting(runs) if not r.id.is_step and r.id.het_offset in (None, 0)}
    end_of_first, start_of_second = records[runs[0]].end, records[runs[1]].start
    assert end_of_first is not None and start_of_second is not None and end_of_first <= start_of_second, records
    assert records[runs[1]].state == "COMPLETED", records

    # It resumed from its last checkpoint: at most one checkpoint interval of work lost.
    log = cli("logs", str(job_id), state=state_dir).stdout + cli("logs", "--stderr", str(job_id), state=state_dir).stdout
    resumed = [line for line in log.splitlines() if "resuming from" in line]
    assert resumed, log
    at = int(resumed[-1].rsplit("at step ", 1)[1].split()[0].rstrip(":,."))
    # The last checkpoint: a periodic one, or the one written on the kill signal the node's jobs got.
    assert seen - EVERY <= at < STEPS, (seen, at)
    assert row["restarts"] == 1, row
    report = json.loads(cli("report", "--json", state=state_dir).stdout)
    (line,) = [j for j in report["jobs"] if j["id"] == job_id]
    assert (line["state"], line["restarts"]) == ("COMPLETED", 1), line


def test_a_node_failing_after_the_runs_last_step_before_it_exits_runs_it_again_and_it_completes(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """The node fails after the run reached its last step but before its command ended (here it lingers, as a
    long final save or upload would): it dies at step STEPS with exit 143, Slurm requeues it, replan re-plans it.
    Before, the planner took the job as done (every step reached) while the sync had no run left to close: it
    stayed PENDING for good (found on 24.11 under load). Now it runs again from its checkpoint, at its last step,
    and completes; a run cannot tell a save cut short from a finished one, so it is never closed unfinished."""
    ckpt, marker = tmp_path / "ckpt", tmp_path / "lingered"
    spec = train_spec(tmp_path / "job.yaml", "lingers", STEPS, 64, "{min: 1, max: 1, types: [t4, k80]}", ckpt,
                      "--dataset-size", "256", then=f"if [ ! -e {marker} ]; then touch {marker}; sleep 120; fi")
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_EMULATED_SAMPLES_PER_S": "1280",  # 20 steps a second
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    job_id, (first,) = out["job_id"], out["slurm_job_ids"]
    deadline = time.monotonic() + 120
    while not marker.exists():  # every step done, the command lingering
        assert time.monotonic() < deadline, status(state_dir)[job_id]
        time.sleep(0.5)
    assert _steps(state_dir, job_id) == STEPS
    (failing,) = {p["nodes"] for p in status(state_dir)[job_id]["slurm"]}
    row, events = _fail_node_and_replan(state_dir, job_id, failing, env)
    assert (row["state"], row["restarts"]) == ("COMPLETED", 1), (row, events)
    assert any(e.startswith(f"node {failing} failed under job {job_id} (lingers)") for e in events), events
    runs = sorted({p["id"] for p in row["slurm"]}, key=int)
    assert len(runs) == 2 and runs[0] == first, row  # the run the node failed under, and one more
    dead = [r for r in read_progress(state_dir / "progress") if r.job_id == str(job_id) and r.slurm_job_id == first]
    # Killed with every step done: its launcher says failed (143), or, killed with it, the record is still
    # train.py's own "done" with no exit status (seen on 22.05 under CI load); never "done" with exit 0.
    assert [r.steps_done for r in dead] == [STEPS] and (dead[0].state, dead[0].exit_code) != ("done", 0), dead
    log = cli("logs", str(job_id), state=state_dir).stdout + cli("logs", "--stderr", str(job_id), state=state_dir).stdout
    assert f"resuming from {ckpt / 'checkpoint.pt'} at step {STEPS}" in log, log  # nothing trained twice


FORK_STEPS = 1000
#: 16 s rounds: at 1600 + 800 + 400 emulated samples/s and 64 per step, round 0 is about 700 steps.
FORK_ROUND_S = "16"


def _submit_forked(tmp_path: Path, state_dir: Path, leftovers: list[str]) -> tuple[int, dict[str, str]]:
    """Submit the forked job of the two tests below (its id, and the environment its CLI calls need)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = train_spec(tmp_path / "fork.yaml", "forked", FORK_STEPS, 64, "{min: 1, max: 1}", ckpt, "--dataset-size",
                      "1024", extra="sync: local-sgd\n")
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_FORK_ROUND_S": FORK_ROUND_S,
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    return out["job_id"], env


def test_a_node_failing_under_a_forked_copy_leaves_it_out_of_its_round_and_the_job_completes(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    job_id, env = _submit_forked(tmp_path, state_dir, leftovers)
    copies = [p for p in status(state_dir, env=env)[job_id]["slurm"] if p["role"] == "array"]
    on_k80 = [p for p in copies if p["gpu_type"] == "k80"]
    assert len(copies) >= 2 and len(on_k80) == 1, copies  # an idle dev cluster: a copy on every node
    (copy,) = on_k80
    deadline = time.monotonic() + 60
    while not any(r.slurm_job_id == copy["id"] and r.steps_done >= 5 for r in read_progress(state_dir / "progress")):
        assert time.monotonic() < deadline, status(state_dir, env=env)[job_id]
        time.sleep(0.5)
    row, events = _fail_node_and_replan(state_dir, job_id, "nodec", env)
    assert row["state"] == "COMPLETED", (row, events)
    parts = row["slurm"]
    # The copy on nodec ran once: Slurm requeued it onto its dead node, where replan cancelled it (if the copy
    # had not ended first: a copy stopped by the node's kill signal may also end on its own checkpoint).
    left_out = [e for e in events if e.startswith(f"node nodec failed under job {job_id} (forked): copy ")]
    runs_on_c = [p for p in parts if p["role"] == "array" and p["gpu_type"] == "k80"]
    assert len(runs_on_c) == 1 and (left_out or runs_on_c[0]["state"] != "PENDING"), (parts, events)
    assert all("nodec" not in p["nodes"] for p in parts if p["role"] in ("array", "batch") and p is not runs_on_c[0]
               and int(p["id"]) > int(copy["id"])), parts  # later rounds avoid the drained node
    # The job trained exactly its steps: what the copies saved was averaged, nothing counted twice or lost.
    done = job_steps(read_progress(state_dir / "progress")).get(str(job_id), 0)
    assert done == FORK_STEPS, (done, events)


def test_a_node_failing_under_a_rounds_consolidation_runs_it_again_and_the_job_completes(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """The node fails while round 0's consolidation runs, and Slurm may not requeue it (Requeue=0, as on a site
    with JobRequeue=0): it ends NODE_FAIL. Before, that failed the whole job for one short CPU step; now replan
    runs the consolidation again on the copies' checkpoints and the job completes with exactly its steps."""
    job_id, env = _submit_forked(tmp_path, state_dir, leftovers)
    parts = status(state_dir, env=env)[job_id]["slurm"]
    [consolidation] = [p["id"] for p in parts if p["role"] == "consolidation"]
    assert len([p for p in parts if p["role"] == "array"]) >= 2, parts  # an idle dev cluster: forked
    subprocess.run(["scontrol", "update", f"JobId={consolidation}", "Requeue=0"], check=True, timeout=30)
    # The consolidation's last line is a replan; the store's write lock held here keeps that replan waiting
    # (SQLite's busy timeout, 60 s), so the consolidation is still running when its node fails.
    store = sqlite3.connect(state_dir / "slurmhet.db", isolation_level=None, timeout=60)
    try:
        store.execute("BEGIN IMMEDIATE")
        deadline = time.monotonic() + 120
        while not (node := subprocess.run(["squeue", "-h", "-j", consolidation, "-t", "RUNNING", "-o", "%N"],
                                          capture_output=True, text=True, timeout=30).stdout.strip()):
            assert time.monotonic() < deadline, "round 0's consolidation did not start"
            time.sleep(0.2)
        _node(node, "down")
    finally:
        store.rollback()
        store.close()
    row, events = _fail_node_and_replan(state_dir, job_id, node, env)
    assert row["state"] == "COMPLETED", (row, events)
    assert f"job {job_id} (forked): round 0's consolidation, Slurm job {consolidation}, ended NODE_FAIL (run 1)" \
        in events, events
    [again] = [e for e in events if e.startswith(f"job {job_id} (forked): round 0's consolidation, Slurm job "
                                                 f"{consolidation}, ended NODE_FAIL; run again as Slurm job ")]
    rerun = again.rsplit("Slurm job ", 1)[1].split()[0]
    by_id = {p["id"]: p for p in row["slurm"]}
    assert (by_id[consolidation]["role"], by_id[consolidation]["state"]) == ("retried", "FAILED"), row["slurm"]
    assert (by_id[rerun]["role"], by_id[rerun]["round"], by_id[rerun]["state"]) == ("consolidation", 0, "COMPLETED")
    # The job trained exactly its steps: round 0's copies were averaged once, nothing counted twice or lost.
    done = job_steps(read_progress(state_dir / "progress")).get(str(job_id), 0)
    assert done == FORK_STEPS, (done, events)
