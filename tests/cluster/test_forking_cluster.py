"""HadarE on the real dev cluster: `slurmhet submit` forks a local-SGD job into copies on idle nodes,
the copies consolidate, `slurmhet replan` plans the next round, and the job ends with all its steps.

The cluster may be shared: the test asserts on what the plan decided (forked or not), not on idleness.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from slurmhet.runtime.checkpoint import CONSOLIDATED_NAME, load_checkpoint
from slurmhet.runtime.progress import job_steps, read_progress
from tests.cluster.helpers import accounting, cli, status, wait_until_empty
from tests.cluster.replan_helpers import (events, kill_group, slow_sbatch, slurm_jobs_of_store, start_cli, store_tag,
                                         wait_file_lines)

pytestmark = pytest.mark.usefixtures("slurm_cluster")

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
STEPS = 120
#: 2 s rounds at 1600 + 800 + 400 emulated samples/s and 64 per step: about 87 steps, so two rounds at least.
ROUND_S = "2"
FINAL = ("COMPLETED", "FAILED", "CANCELLED")


def _spec(path: Path, checkpoint_dir: Path) -> Path:
    command = [sys.executable, TRAIN, "--steps", str(STEPS), "--global-batch", "64", "--dataset-size", "1024"]
    path.write_text(textwrap.dedent(f"""\
        jobs:
          - name: forked-mlp
            command: {json.dumps(command)}
            workload: {{model: mlp-small, batch_size: 64}}
            global_batch: 64
            model_size_mb: 0.01
            sync: local-sgd
            work: {{steps: {STEPS}}}
            gpus: {{min: 1, max: 1}}
            checkpoint_dir: {json.dumps(str(checkpoint_dir))}
            time_limit: 5
        """))
    return path


def _replan_until_done(state_dir: Path, job_id: int, env: dict[str, str], timeout: float = 300
                       ) -> tuple[dict[str, Any], int, list[str]]:
    """cron's part: replan until the job and its parts are final with its steps all done (consolidations also
    replan on their own). Returns its status row, the steps its progress records count, and what replan said.
    ``timeout`` only catches a job that never ends: the whole test took 109 s of a 110 s window in CI's
    24.11 series, three series loading one machine."""
    progress = state_dir / "progress"
    deadline = time.monotonic() + timeout
    said: list[str] = []
    while True:
        result = json.loads(cli("replan", "--once", "--json", state=state_dir, env=env).stdout)
        said += result["events"] + result["actions"]
        row = status(state_dir, env=env)[job_id]
        done = job_steps(read_progress(progress)).get(str(job_id), 0)
        if row["state"] in FINAL and all(p["state"] in FINAL for p in row["slurm"]) and done >= STEPS:
            return row, done, said
        assert row["state"] not in ("FAILED", "CANCELLED"), row
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} not done: {done} steps, {row}, said {said}")
        time.sleep(1.0)


def test_local_sgd_job_forks_consolidates_and_finishes_over_rounds(tmp_path: Path, state_dir: Path) -> None:
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_FORK_ROUND_S": ROUND_S,
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    spec = _spec(tmp_path / "fork.yaml", checkpoints)
    out = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"][0]
    assert out["state"] == "SUBMITTED", out
    job_id = out["job_id"]
    first = status(state_dir, env=env)[job_id]["slurm"]
    forked = any(p["role"] == "array" for p in first)
    if forked:
        # Round 0's parts: its copies and its consolidation. With 2 s rounds the consolidation may already
        # have replanned and dispatched round 1 before this status ran (seen under CI load).
        roles = [p["role"] for p in first]
        assert "consolidation" in roles, first
        round0 = first[:roles.index("consolidation") + 1]
        copies = [p for p in round0 if p["role"] == "array"]
        assert len(copies) >= 2 and all(p["role"] in ("array", "consolidation") for p in round0), first
        assert len({p["nodes"] for p in copies if p["nodes"]}) == len(copies)  # one copy per node
        assert out["allocation"].count("@") == len(copies)

    row, done, _ = _replan_until_done(state_dir, job_id, env)
    assert row["state"] == "COMPLETED", row
    assert done == STEPS  # aggregated over the copies of every round, no more and no less
    parts = row["slurm"]
    arrays = [p for p in parts if p["role"] == "array"]
    if forked:
        consolidations = [p for p in parts if p["role"] == "consolidation"]
        later = parts[[p["id"] for p in parts].index(consolidations[0]["id"]) + 1:]
        # Round 0 consolidated, then replan dispatched the rest: forked again, or one gang when the cluster is busy.
        assert later and {p["role"] for p in later} in ({"array", "consolidation"}, {"batch"}), parts
        assert len(consolidations) >= 2 or [p["role"] for p in later] == ["batch"], parts
        assert load_checkpoint(checkpoints / CONSOLIDATED_NAME).steps == STEPS or \
            len([p for p in parts if p["role"] == "batch"]) == 1  # the last round may run unforked
        records = [r for r in accounting(sorted({p["id"] for p in arrays})) if not r.id.is_step]
        assert {r.state for r in records} == {"COMPLETED"}
        assert len([r for r in records if r.id.array_task is not None]) == len(arrays)  # arrays in sacct
        replan_again = json.loads(cli("replan", "--once", "--json", state=state_dir, env=env).stdout)
        assert not [a for a in replan_again["actions"] if f"job {job_id}" in a]  # idempotent: nothing more
    else:
        assert not arrays  # the cluster was busy: the plan ran the job as one gang


def _squeue(*args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=30, check=True).stdout.strip()


def test_a_round_consolidates_on_another_copy_type_when_the_first_ones_nodes_drain(tmp_path: Path, state_dir: Path,
                                                                                  leftovers: list[str]) -> None:
    """A node drained under a round's copies (Slurm drains one for "Kill task failed" across a controller
    restart, as a chaos run met) must not hold its consolidation: it goes to any of the copies' partitions."""
    wait_until_empty()  # the copies need a node of each type
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_FORK_ROUND_S": "8",
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    spec = _spec(tmp_path / "fork.yaml", checkpoints)
    spec.write_text(spec.read_text().replace(f"steps: {STEPS}}}", "steps: 5000}").replace(
        f'"--steps", "{STEPS}"', '"--steps", "5000"'))
    out = json.loads(cli("submit", "--json", str(spec), state=state_dir, env=env).stdout)["jobs"][0]
    leftovers.extend(out["slurm_job_ids"])
    parts = status(state_dir, env=env)[out["job_id"]]["slurm"]
    copies = [p["id"] for p in parts if p["role"] == "array"]
    [consolidation] = [p["id"] for p in parts if p["role"] == "consolidation"]
    assert len(copies) == 3, parts  # an idle cluster: one copy per node, each of its own type
    partitions = _squeue("-j", consolidation, "-o", "%P").split(",")
    assert len(partitions) == 3, partitions  # the copies' three types' partitions, the first copy's first
    first = subprocess.run(["sinfo", "-h", "-p", partitions[0], "-o", "%N"], capture_output=True, text=True,
                           timeout=30, check=True).stdout.strip()
    assert first in ("nodea", "nodeb", "nodec"), first  # one node per type's partition on the dev cluster
    deadline = time.monotonic() + 60
    while _squeue("-j", ",".join(copies), "-t", "PENDING", "-o", "%i"):  # drained, a pending copy would not start
        assert time.monotonic() < deadline, "the copies did not start"
        time.sleep(0.5)
    subprocess.run(["scontrol", "update", f"nodename={first}", "state=drain", "reason=slurmhet test"], check=True,
                   timeout=30)
    try:
        # Pinned to the first copy's partition, it would wait there for good (sacct would never have it final).
        [record] = [r for r in accounting([consolidation], timeout=150) if not r.id.is_step]
        assert record.state == "COMPLETED" and record.nodes and first not in record.nodes.split(","), record
    finally:
        subprocess.run(["scontrol", "update", f"nodename={first}", "state=resume"], timeout=30)
        cli("cancel", str(out["job_id"]), state=state_dir, env=env, check=False)


def test_a_submit_killed_as_sbatch_took_its_rounds_consolidation_is_adopted_as_the_round(
        tmp_path: Path, state_dir: Path, leftovers: list[str]) -> None:
    """`slurmhet submit` is killed while sbatch has taken round 0's consolidation but not yet answered: Slurm runs
    the copies and the consolidation, the store has none of them. The next replan adopts them as round 0 (arrays
    and a consolidation, the round's record), so the round's end is judged as a round's: the job goes on to its
    next round and ends with every step. Adopted as one plain job, it read COMPLETED when round 0 ended."""
    wait_until_empty()  # the copies need idle nodes
    since = datetime.now() - timedelta(seconds=10)
    env = {"SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_FORK_ROUND_S": ROUND_S,
           "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}"}
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    spec = _spec(tmp_path / "fork.yaml", checkpoints)
    slow_env, noted = slow_sbatch(tmp_path / "slowbin", 120, only="--dependency=", once=True)
    proc = start_cli(state_dir, "submit", str(spec), env={**env, "PATH": f"{slow_env['PATH']}:{env['PATH']}"})
    (consolidation,) = wait_file_lines(noted, 1, proc=proc)
    kill_group(proc)  # the submit and its stalled sbatch: Slurm has round 0, the store has no part of it
    leftovers.append(consolidation)
    [row] = status(state_dir, env=env).values()
    job_id = row["id"]
    assert row["state"] == "PENDING" and row["slurm"] == [], row

    row, done, said = _replan_until_done(state_dir, job_id, env)
    assert row["state"] == "COMPLETED" and done == STEPS, (row, done, said)
    parts = row["slurm"]
    round0 = [p for p in parts if p["round"] == 0]
    assert [p["role"] for p in round0][-1] == "consolidation" and round0[-1]["id"] == consolidation, parts
    assert len(round0) >= 3 and {p["role"] for p in round0[:-1]} == {"array"}, parts  # its copies, each task
    assert len(parts) > len(round0), parts  # round 0 did not end the job: replan dispatched the rest
    assert {e[0] for e in events(state_dir, kind="adopted")} == {job_id}
    assert [e for e in events(state_dir, job_id, kind="forked") if "(round 0," in e[2]], said
    # Nothing ran twice: every Slurm job tagged for it is on record, round 0's the ones sbatch took before the kill.
    in_slurm = slurm_jobs_of_store(store_tag(state_dir), since)[job_id]
    assert {p["id"] for p in parts} == set(in_slurm), (parts, in_slurm)
