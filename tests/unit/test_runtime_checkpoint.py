"""Checkpoint files, resume choice, timeout-vs-preemption, and stop-then-requeue through the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest
import torch

from slurmhet.errors import InputError, SystemFailure
from slurmhet.runtime.checkpoint import (CONSOLIDATED_NAME, StopRequest, TrainingCheckpoint, choose_resume,
                                         classify_stop, handle_stop, load_checkpoint, requeue_target, save_checkpoint,
                                         should_requeue, stop_reason)
from slurmhet.runtime.progress import read_progress
from slurmhet.slurm.parsers import StoppingJob
from tests.unit.recorded import FIXTURES

REPO = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000.0


def _ckpt(steps: int, start: int = 0) -> TrainingCheckpoint:
    return TrainingCheckpoint(model={"w": torch.ones(2) * steps}, optimizer=None, steps=steps, start_steps=start)


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path / "sub" / "checkpoint.pt", TrainingCheckpoint(
        model={"w": torch.arange(3.0)}, optimizer={"state": {}, "param_groups": []}, steps=9, start_steps=4,
        meta={"model": "mlp-small"}))
    loaded = load_checkpoint(path)
    assert torch.equal(loaded.model["w"], torch.arange(3.0))
    assert (loaded.steps, loaded.start_steps, loaded.meta) == (9, 4, {"model": "mlp-small"})
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]


@pytest.mark.parametrize(("data", "place"), [
    ({"format": "other/1", "model": {"w": torch.ones(1)}}, ":format"),
    ({"format": "slurmhet-checkpoint/1", "model": {"w": torch.ones(1)}, "steps": -1}, ":steps"),
    ({"format": "slurmhet-checkpoint/1", "model": {"w": torch.ones(1)}, "steps": 1, "start_steps": 2}, ":start_steps"),
    ({"format": "slurmhet-checkpoint/1", "model": {"w": [1.0]}}, ":model.w"),
    ({"format": "slurmhet-checkpoint/1", "model": {}}, ":model"),
])
def test_malformed_checkpoints_name_file_and_key(tmp_path: Path, data: dict, place: str) -> None:
    path = tmp_path / "bad.pt"
    torch.save(data, path)
    with pytest.raises(InputError) as info:
        load_checkpoint(path)
    assert info.value.place == f"{path}{place}"


def test_resume_prefers_own_checkpoint_only_within_the_current_round(tmp_path: Path) -> None:
    copy_env = {"SLURM_ARRAY_TASK_ID": "1", "SLURMHET_ARRAY_INDEX": "1"}
    assert choose_resume(tmp_path, copy_env) is None
    save_checkpoint(tmp_path / CONSOLIDATED_NAME, _ckpt(20, 20))
    save_checkpoint(tmp_path / "copy-1.pt", _ckpt(15, 10))  # last round's copy: consolidated is newer
    point = choose_resume(tmp_path, copy_env)
    assert point is not None and (point.path.name, point.start_steps) == (CONSOLIDATED_NAME, 20)
    save_checkpoint(tmp_path / "copy-1.pt", _ckpt(23, 20))  # requeued mid-round: continue own work, same round
    point = choose_resume(tmp_path, copy_env)
    assert point is not None and (point.path.name, point.checkpoint.steps, point.start_steps) == ("copy-1.pt", 23, 20)
    save_checkpoint(tmp_path / "checkpoint.pt", _ckpt(30, 20))  # a gang run: a new stretch starts at its steps
    point = choose_resume(tmp_path, {})
    assert point is not None and (point.path.name, point.start_steps) == ("checkpoint.pt", 30)


@pytest.mark.parametrize(("env", "signum", "reason"), [
    ({"SLURM_JOB_END_TIME": str(NOW + 100), "SLURMHET_SIGNAL_LEAD_S": "60"}, signal.SIGUSR2, "timeout"),
    ({"SLURM_JOB_END_TIME": str(NOW + 3600), "SLURMHET_SIGNAL_LEAD_S": "60"}, signal.SIGUSR2, "preempted"),
    ({"SLURM_JOB_END_TIME": str(NOW + 3600)}, signal.SIGTERM, "preempted"),
    ({"SLURMHET_TIME_LIMIT_S": "600", "SLURMHET_LAUNCH_TIME": str(NOW - 500)}, signal.SIGUSR2, "timeout"),
    ({"SLURMHET_TIME_LIMIT_S": "6000", "SLURMHET_LAUNCH_TIME": str(NOW - 500)}, signal.SIGUSR2, "preempted"),
    ({}, signal.SIGUSR2, "timeout"),
    ({}, signal.SIGTERM, "preempted"),
    ({}, None, "preempted"),
])
def test_classify_stop(env: dict, signum: int | None, reason: str) -> None:
    assert classify_stop(signum, env, NOW) == reason


def test_requeue_policy_and_target() -> None:
    assert should_requeue("preempted", {"SLURM_RESTART_COUNT": "50"})
    assert should_requeue("timeout", {"SLURM_RESTART_COUNT": "2"})
    assert not should_requeue("timeout", {"SLURM_RESTART_COUNT": "3"})
    assert not should_requeue("timeout", {"SLURMHET_MAX_TIMEOUT_REQUEUES": "0"})
    assert not should_requeue("preempted", {"SLURMHET_PROFILE_STEPS": "100"})  # stopped by its launcher: measured
    assert requeue_target({"SLURM_JOB_ID": "7003", "SLURM_ARRAY_JOB_ID": "7000", "SLURM_ARRAY_TASK_ID": "2"}) == "7000_2"
    assert requeue_target({"SLURM_JOB_ID": "6000", "SLURM_HET_SIZE": "2"}) == "6000"
    with pytest.raises(SystemFailure):
        requeue_target({})


RUNNING = StoppingJob(("RUNNING",), None)
PREEMPTED = StoppingJob(("RUNNING",), datetime(2026, 12, 6, 7, 19, 36, tzinfo=timezone.utc))
ENDING = StoppingJob(("COMPLETING",), None)
#: A preemption with no grace left: PreemptMode=CANCEL (Slurm has not requeued it) or REQUEUE (it has, and
#: shows no PreemptTime: tests/fixtures/slurm-*/scontrol_show_job_stop_preempt_*.txt).
PREEMPTED_ENDING = StoppingJob(("COMPLETING",), datetime(2026, 12, 6, 20, 49, 0, tzinfo=timezone.utc))
REQUEUED = StoppingJob(("COMPLETING",), None, restarts=1)


def _asked(view: StoppingJob, calls: list[str]) -> Callable[[object], StoppingJob]:
    def ask(_env: object) -> StoppingJob:
        calls.append("ask")
        return view
    return ask


def test_only_rank_zero_saves_asks_slurm_and_requeues() -> None:
    calls: list[str] = []
    stop = StopRequest(signal.SIGTERM, NOW)
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_END_TIME": str(NOW + 3600)}
    other = handle_stop(stop, rank=1, save=lambda: calls.append("save"), env=env,
                        requeue=lambda e: calls.append("requeue"), slurm=_asked(RUNNING, calls))
    assert (other.reason, other.requeued, calls) == ("preempted", False, [])
    first = handle_stop(stop, rank=0, save=lambda: calls.append("save"), env=env,
                        requeue=lambda e: calls.append("requeue"), slurm=_asked(RUNNING, calls))
    assert (first.reason, first.requeued, calls) == ("preempted", True, ["save", "ask", "requeue"])


@pytest.mark.parametrize(("signum", "end_in_s", "view", "reason"), [
    (signal.SIGTERM, 3600, ENDING, "cancelled"),      # scancel: Slurm is ending the run
    (signal.SIGUSR2, 100, ENDING, "cancelled"),       # cancelled near the limit: still a cancel
    (signal.SIGTERM, 3600, PREEMPTED, "preempted"),   # within the partition's GraceTime
    (signal.SIGUSR2, 100, PREEMPTED, "preempted"),    # preempted near the limit: Slurm's word wins
    (signal.SIGTERM, 3600, PREEMPTED_ENDING, "preempted"),  # past its grace or with none: still a preemption
    (signal.SIGTERM, 3600, REQUEUED, "cancelled"),    # Slurm is ending it and requeued it itself
    (signal.SIGTERM, 3600, RUNNING, "preempted"),     # only signalled, long before the limit: asked to vacate
    (signal.SIGUSR2, 100, RUNNING, "timeout"),        # Slurm's time-limit warning
    (signal.SIGUSR2, 100, None, "timeout"),           # Slurm not reachable: the signal and the time left decide
    (signal.SIGTERM, 3600, None, "preempted"),
])
def test_stop_reason_asks_slurm_first(signum: int, end_in_s: float, view: StoppingJob | None, reason: str) -> None:
    env = {"SLURM_JOB_END_TIME": str(NOW + end_in_s), "SLURMHET_SIGNAL_LEAD_S": "60"}
    assert stop_reason(signum, env, NOW, view) == reason


def test_a_run_slurm_is_ending_checkpoints_and_never_requeues_itself() -> None:
    """scancel (or replan's move) of a running job: the checkpoint is written, and the job stays cancelled."""
    calls: list[str] = []
    outcome = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: calls.append("save"),
                          env={"SLURM_JOB_ID": "1", "SLURM_JOB_END_TIME": str(NOW + 3600)},
                          requeue=lambda e: calls.append("requeue"), slurm=_asked(ENDING, calls))
    assert (outcome.reason, outcome.requeued, calls) == ("cancelled", False, ["save", "ask"])
    assert outcome.detail == "Slurm is ending this run (COMPLETING): not requeued by the job"
    assert not should_requeue("cancelled", {})


def test_a_preemption_that_ends_the_run_requeues_it_unless_slurm_already_did() -> None:
    """PreemptMode=CANCEL with no grace left: COMPLETING, PreemptTime set, not requeued: the job requeues itself
    (Slurm accepts it while the job completes). PreemptMode=REQUEUE: Slurm's Restarts is past the run's own
    count, and a second requeue would be refused or, worse, run the job once more."""
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_END_TIME": str(NOW + 3600), "SLURM_RESTART_COUNT": "0"}
    calls: list[str] = []
    cancel_mode = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: calls.append("save"), env=env,
                              requeue=lambda e: calls.append("requeue"), slurm=_asked(PREEMPTED_ENDING, calls))
    assert (cancel_mode.reason, cancel_mode.requeued, calls) == ("preempted", True, ["save", "ask", "requeue"])
    calls.clear()
    requeue_mode = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: calls.append("save"), env=env,
                               requeue=lambda e: calls.append("requeue"), slurm=_asked(REQUEUED, calls))
    assert (requeue_mode.reason, requeue_mode.requeued, calls) == ("preempted", False, ["save", "ask"])
    assert requeue_mode.detail == "Slurm requeued this run itself (Restarts=1): not requeued by the job"
    calls.clear()
    # A CANCEL-mode preemption of a run that is itself a requeue: Restarts=1 is that run's own count.
    again = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: calls.append("save"),
                        env={**env, "SLURM_RESTART_COUNT": "1"}, requeue=lambda e: calls.append("requeue"),
                        slurm=_asked(StoppingJob(("COMPLETING",), PREEMPTED_ENDING.preempt_time, restarts=1), calls))
    assert (again.reason, again.requeued, calls) == ("preempted", True, ["save", "ask", "requeue"])


def test_the_stops_scontrol_calls_outlive_a_second_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm may send SIGTERM again while the stop asks and requeues (24.11, no grace): the real scontrol calls,
    here a stand-in that sends itself SIGTERM first, must still answer; only KillWait's SIGKILL ends them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    answer = FIXTURES / "slurm-24.11" / "scontrol_show_job_stop_preempt_cancel.txt"
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\nkill -TERM $$\necho \"$@\" >> {calls}\n[ \"$1\" = show ] && cat {answer}\n"
                        "exit 0\n")
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    before = signal.getsignal(signal.SIGTERM)
    outcome = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: None,
                          env={"SLURM_JOB_ID": "4022", "SLURM_JOB_END_TIME": str(NOW + 3600)})
    assert (outcome.reason, outcome.requeued, outcome.detail) == ("preempted", True, "requeued"), outcome
    assert calls.read_text().split("\n")[:2] == ["show job --oneliner 4022", "requeue 4022"]
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's own handler is back


def test_a_profiling_run_does_not_ask_slurm() -> None:
    calls: list[str] = []
    outcome = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: calls.append("save"),
                          env={"SLURM_JOB_ID": "1", "SLURMHET_PROFILE_STEPS": "40"},
                          requeue=lambda e: calls.append("requeue"), slurm=_asked(ENDING, calls))
    assert (outcome.requeued, outcome.detail, calls) == (False, "a profiling run is not requeued", ["save"])


def test_failed_requeue_or_query_is_reported_not_raised() -> None:
    def broken(_env: object) -> None:
        raise SystemFailure("scontrol requeue 1 exited 1")

    def unreachable(_env: object) -> StoppingJob:
        raise SystemFailure("scontrol show job exited 1: Unable to contact slurm controller")

    outcome = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: None,
                          env={"SLURM_JOB_ID": "1"}, requeue=broken, slurm=lambda _e: RUNNING)
    assert not outcome.requeued and "requeue failed" in outcome.detail
    calls: list[str] = []
    outcome = handle_stop(StopRequest(signal.SIGTERM, NOW), rank=0, save=lambda: None, env={"SLURM_JOB_ID": "1"},
                          requeue=lambda e: calls.append("requeue"), slurm=unreachable)
    assert (outcome.reason, outcome.requeued, calls) == ("preempted", True, ["requeue"])
    assert "Slurm's view unknown: scontrol show job exited 1" in outcome.detail


def _signal_run(tmp_path: Path, end_in_s: float, restarts: int, shown: str = "scontrol_show_job_stop_running.txt",
                signum: int = signal.SIGUSR2) -> Path:
    """Run examples/train.py under the launcher, paced (emulation) so it is mid-run when ``signum`` arrives.

    A stand-in ``scontrol`` records its arguments and answers ``show job`` with ``shown``, a real 26.05 output.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    scontrol = bin_dir / "scontrol"
    answer = FIXTURES / "slurm-26.05" / shown
    scontrol.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n[ \"$1\" = show ] && cat {answer}\nexit 0\n")
    scontrol.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "SLURM_JOB_ID": "9800",
                "SLURM_RESTART_COUNT": str(restarts), "SLURM_JOB_END_TIME": str(time.time() + end_in_s),
                "SLURMHET_SIGNAL_LEAD_S": "60", "SLURMHET_JOB_ID": "51",
                "SLURMHET_PROGRESS_DIR": str(tmp_path / "progress"), "SLURMHET_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
                "SLURMHET_EMULATE_THROUGHPUT": "1", "SLURMHET_GPU_TYPE": "k80",
                "SLURMHET_EMULATED_SAMPLES_PER_S": "320", "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "100000", "--global-batch", "16",
            "--dataset-size", "256"]
    runner = f"import sys; from slurmhet.runtime.launcher import launch; sys.exit(launch({argv!r}))"
    proc = subprocess.Popen([sys.executable, "-c", runner], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            records = read_progress(tmp_path / "progress")
            if records and records[0].state == "running" and records[0].steps_done > 0:
                break
            time.sleep(0.05)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return calls


ASKED = ["show", "job", "--oneliner", "9800"]


def test_preemption_checkpoints_and_requeues(tmp_path: Path) -> None:
    calls = _signal_run(tmp_path, end_in_s=3600, restarts=0)
    [record] = read_progress(tmp_path / "progress")
    assert (record.state, record.exit_code, record.emulated, record.gpu_type) == ("preempted", 0, True, "k80")
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt")
    assert checkpoint.steps == record.steps_done == record.saved_steps > 0  # the save on the signal, reported
    assert calls.read_text().split() == [*ASKED, "requeue", "9800"]


def test_a_cancelled_run_checkpoints_and_stays_cancelled(tmp_path: Path) -> None:
    """scancel's SIGTERM long before the limit used to read as a preemption: the job requeued itself (26.05)."""
    calls = _signal_run(tmp_path, end_in_s=3600, restarts=0, shown="scontrol_show_job_stop_cancelled.txt",
                        signum=signal.SIGTERM)
    [record] = read_progress(tmp_path / "progress")
    assert (record.state, record.exit_code) == ("cancelled", 0)
    assert load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt").steps == record.steps_done > 0
    assert calls.read_text().split() == ASKED  # asked, and no requeue


def test_timeout_after_the_requeue_budget_ends_cleanly_with_a_checkpoint(tmp_path: Path) -> None:
    calls = _signal_run(tmp_path, end_in_s=100, restarts=3)
    [record] = read_progress(tmp_path / "progress")
    assert (record.state, record.exit_code) == ("timeout", 0)
    assert load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt").steps == record.steps_done
    assert calls.read_text().split() == ASKED


def test_the_last_two_checkpoints_are_kept_and_a_bad_latest_falls_back(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    for steps in (10, 20, 30):
        save_checkpoint(path, _ckpt(steps))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]
    assert load_checkpoint(tmp_path / "checkpoint.prev.pt").steps == 20
    path.write_bytes(path.read_bytes()[:100])  # cut off (a disk error, a copy gone wrong)
    warnings: list[str] = []
    point = choose_resume(tmp_path, {})
    assert point is not None and (point.path.name, point.start_steps) == ("checkpoint.prev.pt", 20)
    from slurmhet.runtime.checkpoint import load_latest_good
    found = load_latest_good(path, warnings.append)
    assert found is not None and found[1].steps == 20
    assert warnings and warnings[0].startswith(f"slurmhet: skipping checkpoint {path}: cannot load checkpoint")


def test_a_crash_between_the_renames_leaves_the_previous_one_to_resume_from(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "checkpoint.prev.pt", _ckpt(20))  # checkpoint.pt already moved aside, not replaced
    point = choose_resume(tmp_path, {})
    assert point is not None and point.start_steps == 20


def test_both_checkpoints_bad_is_an_error_not_a_silent_restart(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"junk")
    (tmp_path / "checkpoint.prev.pt").write_bytes(b"junk too")
    with pytest.raises(InputError, match="no checkpoint in .* loads") as info:
        choose_resume(tmp_path, {})
    assert info.value.exit_code == 2 and "move the files away" in info.value.hint
