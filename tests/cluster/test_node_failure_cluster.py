"""A node fails under a running job, on the dev cluster: the job restarts as a whole from its last checkpoint on
the nodes left, replan says which node failed under which job, no two runs of it overlap, and status and report
count the restart."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from slurmhet.runtime.progress import job_steps, read_progress
from tests.cluster.helpers import accounting, cli, status, train_spec
from tests.cluster.replan_helpers import events as stored_events, holding_every_v100

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


def _resumed_from(state_dir: Path, job_id: int, failed: str) -> int:
    """The step the restart resumed at, from its log; the failed run ``failed``'s progress record said it (rank 0
    saves), which is the step replan planned the restart's work from."""
    log = cli("logs", str(job_id), state=state_dir).stdout + cli("logs", "--stderr", str(job_id), state=state_dir).stdout
    resumed = [line for line in log.splitlines() if "resuming from" in line]
    assert resumed, log
    at = int(resumed[-1].rsplit("at step ", 1)[1].split()[0].rstrip(":,."))
    said = [r.saved_steps for r in read_progress(state_dir / "progress") if r.slurm_job_id == failed]
    assert [s for s in said if s is not None] == [at], (said, at)
    return at


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
        deadline = time.monotonic() + 420  # a hang, not load: the het job's whole test took 201 s in CI's 24.11 series
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

    # It resumed from its last checkpoint: at most one checkpoint interval of work lost. The last checkpoint: a
    # periodic one, or the one written on the kill signal the node's jobs got.
    at = _resumed_from(state_dir, job_id, first)
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


def _cut_off_consolidation(tmp_path: Path, state_dir: Path, leftovers: list[str]) -> tuple[int, str, str,
                                                                                         dict[str, str]]:
    """Submit the forked job and down the node under round 0's consolidation while it runs, with Requeue=0 on it
    (as on a site with JobRequeue=0), so that Slurm ends it NODE_FAIL. The job's id, the consolidation's Slurm
    id, the node, and the environment of the job's CLI calls."""
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
    return job_id, consolidation, node, env


def _ran_once_more(state_dir: Path, job_id: int, row: dict[str, Any], consolidation: str, rerun: str,
                   events: list[str]) -> None:
    """The lost run is retired, its one run again is the round's consolidation and completed, and the job
    trained exactly its steps: round 0's copies were averaged once, nothing counted twice or lost."""
    assert f"job {job_id} (forked): round 0's consolidation, Slurm job {consolidation}, ended NODE_FAIL (run 1)" \
        in events, events
    by_id = {p["id"]: p for p in row["slurm"]}
    assert (by_id[consolidation]["role"], by_id[consolidation]["state"]) == ("retried", "FAILED"), row["slurm"]
    assert (by_id[rerun]["role"], by_id[rerun]["round"], by_id[rerun]["state"]) == ("consolidation", 0, "COMPLETED")
    assert [(p["role"], p["round"]) for p in row["slurm"]].count(("consolidation", 0)) == 1, row["slurm"]
    done = job_steps(read_progress(state_dir / "progress")).get(str(job_id), 0)
    assert done == FORK_STEPS, (done, events)


def test_a_node_failing_under_a_rounds_consolidation_runs_it_again_and_the_job_completes(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """The node fails while round 0's consolidation runs, and Slurm does not requeue it: it ends NODE_FAIL.
    Before, that failed the whole job for one short CPU step; now replan runs the consolidation again on the
    copies' checkpoints and the job completes with exactly its steps."""
    job_id, consolidation, node, env = _cut_off_consolidation(tmp_path, state_dir, leftovers)
    row, events = _fail_node_and_replan(state_dir, job_id, node, env)
    assert row["state"] == "COMPLETED", (row, events)
    [again] = [e for e in events if e.startswith(f"job {job_id} (forked): round 0's consolidation, Slurm job "
                                                 f"{consolidation}, ended NODE_FAIL; run again as Slurm job ")]
    _ran_once_more(state_dir, job_id, row, consolidation, again.rsplit("Slurm job ", 1)[1].split()[0], events)


def _unanswered_sbatch(bin_dir: Path) -> dict[str, str]:
    """Stand-ins for sbatch and squeue, first on PATH: the first submission reaches Slurm but its answer never
    reaches the caller (the runner's timeout, 8 s here, ends the wait), and the caller's next squeue fails too,
    so slurmhet cannot tell whether the job exists. Every other call is the real command's. The environment
    that puts them first."""
    sbatch, squeue = shutil.which("sbatch"), shutil.which("squeue")
    assert sbatch and squeue
    mark = bin_dir / "unanswered"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"""#!/bin/sh
case " $* " in *" --parsable "*) ;; *) exec {sbatch} "$@" ;; esac
[ -e {mark} ] && exec {sbatch} "$@"
{sbatch} "$@" > /dev/null || exit $?
echo "$PPID" > {mark}
exec sleep 120
""")
    (bin_dir / "squeue").write_text(f"""#!/bin/sh
if [ -e {mark} ] && [ ! -e {mark}.squeue ] && [ "$(cat {mark})" = "$PPID" ]; then
    touch {mark}.squeue
    echo "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation" >&2
    exit 1
fi
exec {squeue} "$@"
""")
    for name in ("sbatch", "squeue"):
        (bin_dir / name).chmod(0o755)
    config = bin_dir / "config.yaml"
    config.write_text("slurm: {command_timeout_s: 8}\n")
    return {"PATH": f"{bin_dir}:{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", "SLURMHET_CONFIG": str(config)}


def test_a_consolidation_run_again_whose_sbatch_gave_no_answer_is_found_by_its_tag_not_run_a_third_time(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """As above, but sbatch accepts the run again without answering, and the squeue that looks for it fails
    too. The next replan (or the run's own, as its last line) finds it by its comment tag and records it as the
    round's consolidation, instead of submitting a third run that would average the copies once more."""
    job_id, consolidation, node, env = _cut_off_consolidation(tmp_path, state_dir, leftovers)
    row, events = _fail_node_and_replan(state_dir, job_id, node, {**env, **_unanswered_sbatch(tmp_path / "bin")})
    assert row["state"] == "COMPLETED", (row, events)
    assert (tmp_path / "bin" / "unanswered.squeue").exists(), events  # both stand-ins did their part
    assert f"job {job_id}: round 0's consolidation not submitted again (timed out after 8 s)" in events, events
    assert not [e for e in events if "; run again as Slurm job " in e], events
    [(_, _, found)] = stored_events(state_dir, job_id, kind="consolidated_again")  # the one run again, found, not sent
    assert found.startswith(f"round 0's consolidation, Slurm job {consolidation}, ended NODE_FAIL; its run again, "
                            "Slurm job ") and found.endswith(", found by its comment tag"), found
    rerun = found.split("Slurm job ")[2].split(",")[0]
    _ran_once_more(state_dir, job_id, row, consolidation, rerun, events)
    # Slurm ran no job of this test that is not on record (earlier tests' jobs have lower ids).
    recorded = {p["id"] for p in row["slurm"]}
    ran = {i.split("_")[0] for i in subprocess.run(  # an array task's JobID is <array id>_<task>
        ["sacct", "-X", "-n", "-P", "-o", "JobID", "-S", "now-1hour", "--name", "forked"], capture_output=True,
        text=True, timeout=30, check=True).stdout.split()}
    assert {i for i in ran if int(i) >= min(map(int, recorded))} == recorded, (ran, row["slurm"])


def test_a_node_failing_while_another_users_job_holds_the_v100s_restarts_the_job_on_the_idle_k80(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """The same fault on a shared cluster: another user's job holds every V100 for up to 10 minutes. The job
    starts on the t4 node; that node fails; the re-plan sees the V100s held and restarts it on the idle K80
    node from its checkpoint. Planned as if the V100s were free, it would wait minutes behind that job."""
    blocker, _ = holding_every_v100(10, 600, leftovers)
    ckpt = tmp_path / "ckpt"
    spec = train_spec(tmp_path / "job.yaml", "shared-train", STEPS, 8, "{min: 1, max: 1, types: [v100, t4, k80]}",
                      ckpt, "--dataset-size", "480", "--checkpoint-every", str(EVERY))
    env = {**ENV, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    [out] = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"]
    leftovers.extend(out["slurm_job_ids"])
    job_id, (first,) = out["job_id"], out["slurm_job_ids"]
    assert out["allocation"].startswith("1xt4"), out  # not behind the other user's job on the V100s
    deadline = time.monotonic() + 120
    while _steps(state_dir, job_id) < 2 * EVERY + 2:
        assert time.monotonic() < deadline, status(state_dir)[job_id]
        time.sleep(0.5)
    row, events = _fail_node_and_replan(state_dir, job_id, "nodeb", env)
    assert row["state"] == "COMPLETED" and row["restarts"] == 1, (row, events)
    assert any(e.startswith(f"node nodeb failed under job {job_id} (shared-train)") for e in events), events
    runs = sorted({p["id"] for p in row["slurm"]}, key=int)
    assert len(runs) == 2 and runs[0] == first, row
    records = {r.id.job: r for r in accounting(runs) if not r.id.is_step}
    assert records[runs[1]].state == "COMPLETED" and records[runs[1]].gpus_by_type() == {"k80": 1}, records
    assert records[runs[1]].nodes == "nodec", records
    assert 0 < _resumed_from(state_dir, job_id, first) < STEPS
    # The other user's job was left alone throughout.
    assert subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True,
                          timeout=30).stdout.strip() == "RUNNING"
