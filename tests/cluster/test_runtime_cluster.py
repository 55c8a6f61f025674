"""The runtime on the real dev cluster: exact het training, forked rounds, packs, checkpoint on signal.

Every job is emitted the way the product emits it (the request dataclasses,
``MultiPartSubmitter``, the ``slurmhet run --`` launcher, ``job_environment``'s
variables) and runs ``examples/train.py``. The dev cluster's GPUs are fake, so
everything runs on the CPU; models and datasets are tiny.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from slurmhet.cluster import Inventory
from slurmhet.config import Settings
from slurmhet.emit.multipart import MultiPartSubmitter, Part
from slurmhet.emit.requests import (ArrayChunk, ArrayRequest, BatchRequest, Common, ConsolidationRequest, GpuShape,
                                    HetJobRequest, Launch, PackMember, PackRequest)
from slurmhet.runtime.checkpoint import load_checkpoint
from slurmhet.runtime.progress import ProgressRecord, job_steps, read_progress, read_record
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.parsers import AccountingRecord
from slurmhet.slurm.runner import SubprocessRunner
from slurmhet.submission import job_environment

pytestmark = pytest.mark.usefixtures("slurm_cluster")

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
PY = sys.executable
LAUNCHER = (PY, "-m", "slurmhet", "run", "--")
SLURMHET_CMD = (PY, "-m", "slurmhet")
#: A tiny problem: 8 steps per epoch of 32 samples, a 16-32-1 MLP.
SMALL = ("--dataset-size", "256", "--global-batch", "32")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


@pytest.fixture
def client() -> SlurmCli:
    return SlurmCli(SubprocessRunner(timeout=30))


def product_env(tmp_path: Path, client: SlurmCli) -> tuple[tuple[str, str], ...]:
    """What the product gives every launched program: submission.job_environment on the live inventory."""
    settings = Settings(state_dir=tmp_path / "state", database_url="sqlite://")
    env = job_environment(settings, Inventory(tuple(client.nodes())))
    assert dict(env)["SLURMHET_NODE_ADDRS"] == "nodea=127.0.0.1,nodeb=127.0.0.1,nodec=127.0.0.1"
    return env


def progress_dir(env: tuple[tuple[str, str], ...]) -> Path:
    return Path(dict(env)["SLURMHET_PROGRESS_DIR"])


def settled(client: SlurmCli, slurm_ids: list[str], rows: int, timeout: float = 150) -> list[AccountingRecord]:
    """Poll sacct until ``rows`` job-level rows (het components, array tasks, jobs) are final."""
    deadline = time.monotonic() + timeout
    while True:
        records = [r for r in client.accounting(slurm_ids) if not r.id.is_step]
        if len([r for r in records if r.state.split()[0] in FINAL]) >= rows:
            return records
        if time.monotonic() > deadline:
            client.cancel(slurm_ids)
            raise AssertionError(f"sacct: fewer than {rows} final rows for {slurm_ids} after {timeout}s: {records}")
        time.sleep(1)


def summaries(text: str) -> list[dict[str, object]]:
    """train.py's JSON summary lines (rank 0 prints one per run)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{") and "final_loss" in line:
            out.append(json.loads(line))
    return out


def reference_env() -> dict[str, str]:
    """The login node's plain environment: no Slurm job, no rank, no plan."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM", "SLURMHET_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}


def submit(client: SlurmCli, parts: list[Part]) -> list[str]:
    outcome = MultiPartSubmitter(client).submit(parts)
    assert outcome.ok, outcome.message
    return [p.slurm_job_id for p in outcome.submitted]


# --------------------------------------------------------------------------- 1. het job, exact gradients


def test_het_job_with_unequal_shards_matches_the_single_process_run(tmp_path: Path, client: SlurmCli) -> None:
    """t4 x1 (group 0) + v100 x2 (group 1), shards 0.2/0.4/0.4, relaxed accumulation: the full-batch loss."""
    env = product_env(tmp_path, client)
    args = ("--steps", "12", "--dtype", "float64", "--seed", "3", *SMALL)
    request = HetJobRequest(
        Common(9101, "runtime het t4+v100", str(tmp_path), time_limit_min=5),
        Launch((PY, TRAIN, *args), LAUNCHER, env),
        (GpuShape("t4", 1, 1, ("nodeb",)), GpuShape("v100", 2, 1, ("nodea",))),
        shard_weights=(0.2, 0.4, 0.4),
        # Sized for 5 nominal workers: ranks run 1, 2, 2 micro-batches per step (Hare's relaxed scale-fixed sync).
        plan_env=(("SLURMHET_NOMINAL_WORKERS", "5"),),
    )
    (slurm_id,) = submit(client, [Part(request)])
    # The reference runs on the login node while the job queues and runs.
    reference = subprocess.run([PY, TRAIN, *args], capture_output=True, text=True, env=reference_env(), timeout=150)
    assert reference.returncode == 0, reference.stderr
    (ref,) = summaries(reference.stdout)

    records = settled(client, [slurm_id], 2)
    by_offset = {r.id.het_offset: r for r in records}
    assert set(by_offset) == {0, 1}, records
    assert by_offset[0].gpus_by_type() == {"t4": 1} and by_offset[0].nodes == "nodeb"
    assert by_offset[1].gpus_by_type() == {"v100": 2} and by_offset[1].nodes == "nodea"
    log = _log(tmp_path / f"slurmhet-9101-{slurm_id}.out")
    assert all(r.state == "COMPLETED" for r in records), log
    (het,) = summaries(log)  # only rank 0 prints
    assert het["world_size"] == 3 and het["steps"] == 12 and het["state"] == "done"
    assert ref["world_size"] == 1 and ref["steps"] == 12
    # float64 and exact gradients: only the summation order differs (observed |diff| ~ 1e-16).
    assert abs(float(het["final_loss"]) - float(ref["final_loss"])) <= 1e-9, (het, ref)

    progress = {r.rank: r for r in read_progress(progress_dir(env)) if r.slurm_job_id == slurm_id}
    assert sorted(progress) == [0, 1, 2]
    assert [progress[k].gpu_type for k in range(3)] == ["t4", "v100", "v100"]
    assert [progress[k].node for k in range(3)] == ["nodeb", "nodea", "nodea"]
    assert all(progress[k].state == "done" and progress[k].exit_code == 0 and progress[k].steps_done == 12
               for k in range(3))
    assert job_steps(progress.values()) == {"9101": 12}


# --------------------------------------------------------------------------- 2. forked copies, two rounds


def test_forked_copies_consolidate_between_rounds(tmp_path: Path, client: SlurmCli) -> None:
    """Round 1: 2 copies x 7 steps -> consolidated at 14; round 2 resumes there -> 28."""
    env = product_env(tmp_path, client)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    common = Common(9201, "runtime forked", str(tmp_path), time_limit_min=5)
    launch = Launch((PY, TRAIN, "--steps", "100", "--dtype", "float64", *SMALL), LAUNCHER,
                    env + (("SLURMHET_CHECKPOINT_DIR", str(ckpt)),))
    # from_plan does not export the round length yet (see the report); the request's plan_env carries it.
    round_env = (("SLURMHET_ROUND_STEPS", "7"),)

    def round_parts(number: int, extra: tuple[tuple[str, str | None], ...]) -> list[Part]:
        array = ArrayRequest(replace(common, extra=extra), launch, GpuShape("k80", 1), ArrayChunk(0, 2), throttle=2,
                             round=number, plan_env=round_env)
        return [Part(array), Part(ConsolidationRequest(common, SLURMHET_CMD, str(ckpt), (0, 1), round=number),
                                  after=(0,))]

    array1, cons1 = submit(client, round_parts(1, ()))
    # The next round would be planned after the consolidation; here it simply waits for it.
    array2, cons2 = submit(client, round_parts(2, (("dependency", f"afterok:{cons1}"),)))
    records = settled(client, [array1, cons1, array2, cons2], 6, timeout=170)

    def tasks(array_id: str) -> list[AccountingRecord]:
        return sorted((r for r in records if r.id.job == array_id and r.id.array_task is not None),
                      key=lambda r: r.id.array_task or 0)

    def job(slurm_id: str) -> AccountingRecord:
        return next(r for r in records if r.id.job == slurm_id and r.id.array_task is None)

    assert [len(tasks(array1)), len(tasks(array2))] == [2, 2], records
    assert all(r.state == "COMPLETED" for r in records), records
    # Order: each consolidation starts only after all of its round's copies ended; round 2 after consolidation 1.
    c1, c2 = job(cons1), job(cons2)
    assert c1.start is not None and all(t.end is not None and c1.start >= t.end for t in tasks(array1))
    assert c1.end is not None and all(t.start is not None and t.start >= c1.end for t in tasks(array2))
    assert c2.start is not None and all(t.end is not None and c2.start >= t.end for t in tasks(array2))

    cons_logs = [_log(tmp_path / f"slurmhet-9201-{i}.out") for i in (cons1, cons2)]
    assert "job at step 14" in cons_logs[0] and "job at step 28" in cons_logs[1], cons_logs
    for task in (0, 1):
        first = _log(tmp_path / f"slurmhet-9201-{array1}_{task}.out")
        second = _log(tmp_path / f"slurmhet-9201-{array2}_{task}.out")
        assert [(s["start_steps"], s["steps"]) for s in summaries(first)] == [(0, 7)], first
        assert [(s["start_steps"], s["steps"]) for s in summaries(second)] == [(14, 21)], second
        assert f"resuming from {ckpt / 'consolidated.pt'} at step 14" in second

    merged = load_checkpoint(ckpt / "consolidated.pt")
    copies = [load_checkpoint(ckpt / f"copy-{t}.pt") for t in (0, 1)]
    assert [(c.start_steps, c.steps) for c in copies] == [(14, 21), (14, 21)]
    assert merged.steps == merged.start_steps == 14 + sum(c.steps - c.start_steps for c in copies) == 28
    assert merged.meta["round_steps"] == [7, 7]
    key = next(iter(merged.model))
    assert not torch.equal(copies[0].model[key], copies[1].model[key])  # the copies' data orders differ
    assert torch.allclose(merged.model[key], (copies[0].model[key] + copies[1].model[key]) / 2, rtol=0, atol=1e-12)

    # The replanner's view: copies of a round add up on top of the round's start.
    records_by_round: dict[int, list[ProgressRecord]] = {}
    for r in read_progress(progress_dir(env)):
        records_by_round.setdefault(r.start_steps, []).append(r)
    copies_r1 = [r for r in records_by_round[0] if r.slurm_job_id != "consolidate"]
    assert len(copies_r1) == 2 and all(r.state == "done" and r.steps_done == 7 for r in copies_r1)
    assert job_steps(copies_r1) == {"9201": 14}
    assert job_steps(read_progress(progress_dir(env))) == {"9201": merged.steps}


# --------------------------------------------------------------------------- 3. co-location pack


def _log(out: Path) -> str:
    """A part's stdout, then its stderr (Slurm writes them to ``.out`` and ``.err``)."""
    err = out.with_suffix(".err")
    return out.read_text() + (err.read_text() if err.exists() else "")


def _member_lines(log: str) -> dict[str, tuple[int, float]]:
    """run-pack's 'member NAME: exit status N after Ts' lines -> {name: (status, seconds)}."""
    found = re.findall(r"member (\S+): exit status (\d+) after ([\d.]+)s", log)
    return {name: (int(code), float(seconds)) for name, code, seconds in found}


def test_pack_runs_train_members_concurrently_under_private_mps(tmp_path: Path) -> None:
    runner_env = {**os.environ, "SLURMHET_MPS_STANDIN_LOG": str(tmp_path / "mps.log"),
                  "PATH": f"{REPO / 'tests' / 'standins'}:{os.environ['PATH']}"}
    client = SlurmCli(SubprocessRunner(timeout=30, base_env=runner_env))  # sbatch exports it to the job
    env = product_env(tmp_path, client) + (("SLURMHET_EMULATE_THROUGHPUT", "1"),
                                           ("SLURMHET_EMULATED_SAMPLES_PER_S", "128"))
    train = (PY, TRAIN, "--steps", "10", *SMALL)
    # Member b trains too, then fails: the pack must report it by name and fail.
    failing = ("bash", "-c", " ".join(train) + " && exit 3")
    pack = PackRequest(Common(9301, "runtime pack", str(tmp_path), time_limit_min=5, also=(9302,)), LAUNCHER,
                       SLURMHET_CMD, "v100",
                       (PackMember(9301, "a", train, env, 50), PackMember(9302, "b", failing, env, 50)),
                       sharing="mps", share_count=100, nodelist=("nodea",))
    (slurm_id,) = submit(client, [Part(pack)])
    (record,) = settled(client, [slurm_id], 1)
    log = _log(tmp_path / f"slurmhet-9301-{slurm_id}.out")
    assert record.state == "FAILED" and record.exit_code == "3:0", (record, log)
    assert record.alloc_tres.get("gres/mps") == 100 and record.nodes == "nodea"

    members = _member_lines(log)
    assert {n: c for n, (c, _) in members.items()} == {"9301-a": 0, "9302-b": 3}, log
    assert "(MPS)" in log and "MPS control daemon stopped (members finished)" in log
    assert [(s["steps"], s["state"]) for s in summaries(log)] == [(10, "done"), (10, "done")]

    # Each member is its own slurmhet job (own progress record); the launcher keeps its exit status.
    progress = {r.job_id: r for r in read_progress(progress_dir(env)) if r.slurm_job_id == slurm_id}
    assert sorted(progress) == ["9301", "9302"]
    assert (progress["9301"].state, progress["9301"].exit_code) == ("done", 0)
    assert (progress["9302"].state, progress["9302"].exit_code) == ("failed", 3)
    assert all(r.steps_done == 10 and r.emulated for r in progress.values())
    # Intervals: end = the launcher's last record, start = end - run-pack's measured duration.
    intervals = {job: (r.updated_at - members[f"{job}-{'a' if job == '9301' else 'b'}"][1], r.updated_at)
                 for job, r in progress.items()}
    (a0, a1), (b0, b1) = intervals["9301"], intervals["9302"]
    assert max(a0, b0) < min(a1, b1), intervals  # the members overlapped
    # 10 steps x 32 samples at 50% of 128 samples/s is >= 5 s each; run one after the other they would not overlap.
    assert a1 - a0 >= 5 and b1 - b0 >= 5

    events = (tmp_path / "mps.log").read_text().splitlines()
    start = next(float(e.split()[0]) for e in events if " start pid=" in e)
    quit_at = next(float(e.split()[0]) for e in events if e.split()[1:] == ["quit"])
    assert "pipe_mode=700" in next(e for e in events if " start pid=" in e)
    # The stand-in's `-d` returns once its pipe exists and logs "start" from the forked daemon a moment later,
    # so "start" only bounds the members' ends; "quit" comes after the last member's launcher wrote its record.
    assert start < min(a1, b1) and quit_at >= max(a1, b1), (events, intervals)
    assert log.index("MPS control daemon started") < log.index("member 9301-a:") < log.index("MPS control daemon stopped")


# --------------------------------------------------------------------------- 4. checkpoint on signal


def _wait_for_steps(path: Path, steps: int, timeout: float = 90) -> ProgressRecord:
    deadline = time.monotonic() + timeout
    while True:
        record = read_record(path)
        if record is not None and record.state == "running" and record.steps_done >= steps:
            return record
        assert time.monotonic() < deadline, f"no progress to step {steps} in {path}: {record}"
        time.sleep(0.3)


def _sacct_history(slurm_id: str) -> list[tuple[str, str]]:
    """Every run of a (requeued) job, oldest first: ``sacct --duplicates`` keeps the REQUEUED rows."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", slurm_id, "-o", "State,ExitCode"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def test_signal_checkpoints_then_ends_on_timeout_requeues_on_preemption_and_stays_cancelled(tmp_path: Path,
                                                                                           client: SlurmCli) -> None:
    """USR2 (Slurm's time-limit warning) -> timeout, clean end; SIGTERM (preemption) -> requeue and resume;
    scancel (Slurm ends the run) -> checkpoint, no requeue: the job stays cancelled."""
    env = product_env(tmp_path, client) + (("SLURMHET_EMULATE_THROUGHPUT", "1"),
                                           ("SLURMHET_EMULATED_SAMPLES_PER_S", "64"))  # 0.5 s per step
    jobs = {}
    # The timeout job's warning lead covers its whole 5-minute limit: newer Slurm (24.11 here, not 22.05) sets
    # SLURM_JOB_END_TIME, and a USR2 minutes before the end is then told apart from a time-limit warning
    # (runtime/checkpoint.classify_stop) and taken for a preemption; 22.05 has no end time and goes by the signal.
    for job_id, kind, steps, extra in ((9401, "timeout", 40, (("SLURMHET_MAX_TIMEOUT_REQUEUES", "0"),
                                                              ("SLURMHET_SIGNAL_LEAD_S", "600"))),
                                       (9402, "preempted", 20, ()), (9403, "cancelled", 200, ())):
        ckpt = tmp_path / f"ckpt-{kind}"
        launch = Launch((PY, TRAIN, "--steps", str(steps), *SMALL), LAUNCHER,
                        env + (("SLURMHET_CHECKPOINT_DIR", str(ckpt)),) + extra)
        request = BatchRequest(Common(job_id, f"runtime {kind}", str(tmp_path), time_limit_min=5), launch, "k80", 1)
        (slurm_id,) = submit(client, [Part(request)])
        jobs[kind] = (job_id, slurm_id, ckpt, steps)
    try:
        for kind, (job_id, slurm_id, _, _) in jobs.items():
            _wait_for_steps(progress_dir(env) / f"{job_id}.{slurm_id}.0.json", 3)
            if kind == "timeout":  # what --signal=B:USR2@N does: the batch shell (srun) gets it and forwards it
                subprocess.run(["scancel", "--signal=USR2", "--batch", slurm_id], check=True, timeout=30)
            elif kind == "preempted":  # a signal that ends nothing: the job's tasks get SIGTERM
                subprocess.run(["scancel", "--signal=TERM", slurm_id], check=True, timeout=30)
            else:  # its owner cancels it: every process of the job gets SIGTERM, SIGKILL after KillWait
                subprocess.run(["scancel", slurm_id], check=True, timeout=30)
        t_id, t_slurm, t_ckpt, t_steps = jobs["timeout"]
        p_id, p_slurm, p_ckpt, p_steps = jobs["preempted"]
        p_log, p_progress = tmp_path / f"slurmhet-{p_id}-{p_slurm}.out", progress_dir(env) / f"{p_id}.{p_slurm}.0.json"
        first_run: tuple[ProgressRecord | None, str] | None = None
        pending_since: float | None = None
        deadline = time.monotonic() + 120
        while (states := [s for s, _ in _sacct_history(p_slurm)])[-1:] != ["COMPLETED"]:
            assert time.monotonic() < deadline, states
            reason = subprocess.run(["squeue", "-h", "-j", p_slurm, "-o", "%r"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
            if reason == "BeginTime":
                if first_run is None:  # between the runs: what the preempted run left (sbatch truncates the log)
                    first_run = (read_record(p_progress), _log(p_log))
                    pending_since = time.monotonic()
                # Slurm holds a requeued batch job for 120 s (Reason=BeginTime) once it is pending again;
                # an operator's nudge keeps the test short. Not within the second of the requeue: slurmd
                # refuses a launch credential made no later than the second it revoked the job's last one
                # ("Job credential revoked", and the run FAILED on 24.11 once), so the nudge waits 3 s.
                if pending_since is not None and time.monotonic() - pending_since >= 3:
                    subprocess.run(["scontrol", "update", f"JobId={p_slurm}", "StartTime=now"], check=True,
                                   timeout=30)
            time.sleep(1)
        (t_record,) = settled(client, [t_slurm], 1)
        c_id, c_slurm, c_ckpt, _ = jobs["cancelled"]
        (c_record,) = settled(client, [c_slurm], 1)
    finally:
        client.cancel([s for _, s, _, _ in jobs.values()])

    # Timeout: rank 0 checkpointed at the step it stopped, the job ended cleanly, no requeue.
    log = _log(tmp_path / f"slurmhet-{t_id}-{t_slurm}.out")
    assert (t_record.state, t_record.exit_code) == ("COMPLETED", "0:0"), log
    (summary,) = summaries(log)
    stopped = int(summary["steps"])  # type: ignore[arg-type]
    assert 3 <= stopped < t_steps and summary["state"] == "timeout"
    assert f"stopping after step {stopped}: timeout; timeout requeue limit reached; ending cleanly" in log
    raw = torch.load(t_ckpt / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert raw["format"] == "slurmhet-checkpoint/1" and raw["steps"] == stopped
    assert load_checkpoint(t_ckpt / "checkpoint.pt").steps == stopped
    assert not list(t_ckpt.glob(".*.tmp"))  # atomic: no temporary file left behind
    record = read_record(progress_dir(env) / f"{t_id}.{t_slurm}.0.json")
    assert record is not None and (record.state, record.steps_done, record.exit_code) == ("timeout", stopped, 0)
    assert _sacct_history(t_slurm) == [("COMPLETED", "0:0")]

    # Preemption: checkpoint, scontrol requeue, and the second run resumes from the checkpoint to the end.
    history = _sacct_history(p_slurm)
    assert [s for s, _ in history] == ["REQUEUED", "COMPLETED"], history
    assert first_run is not None, "the requeued job was never seen pending"
    record, log = first_run
    (run,) = summaries(log)
    preempted_at = int(run["steps"])  # type: ignore[arg-type]
    assert run["state"] == "preempted" and 3 <= preempted_at < p_steps
    assert f"stopping after step {preempted_at}: preempted; requeued" in log
    assert record is not None
    assert (record.state, record.steps_done, record.exit_code) == ("preempted", preempted_at, 0)
    log = _log(p_log)  # --open-mode=append: the requeued run's output follows the first run's
    first, run = summaries(log)
    assert first["state"] == "preempted" and f"stopping after step {preempted_at}: preempted; requeued" in log
    assert f"resuming from {p_ckpt / 'checkpoint.pt'} at step {preempted_at}" in log
    assert (run["start_steps"], run["steps"], run["state"]) == (preempted_at, p_steps, "done")
    assert load_checkpoint(p_ckpt / "checkpoint.pt").steps == p_steps
    record = read_record(p_progress)
    assert record is not None
    assert (record.state, record.start_steps, record.steps_done, record.exit_code) == ("done", preempted_at, p_steps, 0)

    # Cancelled: Slurm was ending the run (COMPLETING), so the job checkpointed and did not requeue itself.
    # It once did (26.05 took the requeue), and a job its owner cancelled ran on.
    log = _log(tmp_path / f"slurmhet-{c_id}-{c_slurm}.out")
    assert c_record.state.split()[0] == "CANCELLED", (c_record, log)  # "CANCELLED by 0"
    assert [s.split()[0] for s, _ in _sacct_history(c_slurm)] == ["CANCELLED"], (_sacct_history(c_slurm), log)
    assert not subprocess.run(["squeue", "-h", "-j", c_slurm], capture_output=True, text=True, timeout=30).stdout.strip()
    (line,) = [x for x in log.splitlines() if "stopping after step" in x]
    cancelled_at = int(line.split("stopping after step ")[1].split(":")[0])
    assert line.endswith(f"stopping after step {cancelled_at}: cancelled; "
                         "Slurm is ending this run (COMPLETING): not requeued by the job"), line
    assert load_checkpoint(c_ckpt / "checkpoint.pt").steps == cancelled_at
    record = read_record(progress_dir(env) / f"{c_id}.{c_slurm}.0.json")
    assert record is not None and (record.state, record.steps_done) == ("cancelled", cancelled_at), record
