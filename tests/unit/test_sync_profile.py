"""Sync and site-profile logic over a fake runner that replays each series' recorded outputs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Sequence

import pytest

from slurmhet.config import SlurmOverrides
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.parsers import parse_version
from slurmhet.slurm.profile import load_profile
from slurmhet.slurm.runner import CommandResult, SlurmCommandError
from slurmhet.spec import load_text
from slurmhet.store import Database, JobState, SlurmJob, create_job
from slurmhet.sync import fetch_view, sync_jobs
from tests.unit.recorded import Recorded



class FakeRunner:
    """Answers Slurm commands from recorded files; records every argv it was given."""

    def __init__(self, answers: Mapping[str, str], fail: str | None = None) -> None:
        self.answers, self.fail, self.calls = answers, fail, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        self.calls.append(list(argv))
        key = " ".join(argv[:3])
        if self.fail and key.startswith(self.fail):
            raise SlurmCommandError(argv, 1, "", "slurm_load_jobs error: Unable to contact slurm controller")
        for prefix, text in self.answers.items():
            if key.startswith(prefix):
                return CommandResult(tuple(argv), text, "")
        raise AssertionError(f"unexpected command {argv}")


def _answers(rec: Recorded) -> dict[str, str]:
    return {
        "squeue --all": '{"jobs": []}',
        "sacct --parsable2": rec.read("sacct_parsable2_X.txt"),
        "sinfo --version": rec.read("sinfo_version.txt"),
        "scontrol show config": rec.read("scontrol_show_config.txt"),
        "scontrol show nodes": rec.read("scontrol_show_nodes_oneliner_idle.txt"),
        "sbatch --help": "Usage: sbatch [OPTIONS...] executable [args...]\n",
    }


SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml")[0]


def test_sync_reads_final_states_from_sacct(rec: Recorded, tmp_path: Path) -> None:
    het_id, failed_id, array_id = (str(rec.ids[k]) for k in ("het", "failed", "array"))
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        het = create_job(session, SPEC, "root", "f")
        het.state = JobState.SUBMITTED
        het.slurm_jobs += [SlurmJob(slurm_job_id=het_id, role="het", het_offset=0, state="PENDING"),
                           SlurmJob(slurm_job_id=het_id, role="het", het_offset=1, state="PENDING")]
        failed = create_job(session, SPEC, "root", "f")
        failed.state = JobState.SUBMITTED
        failed.slurm_jobs.append(SlurmJob(slurm_job_id=failed_id, state="PENDING"))
        array = create_job(session, SPEC, "root", "f")
        array.state = JobState.SUBMITTED
        array.slurm_jobs.append(SlurmJob(slurm_job_id=array_id, role="array", state="PENDING"))
    runner = FakeRunner(_answers(rec))
    with db.transaction() as session:
        from slurmhet.store import list_jobs

        jobs = list_jobs(session)
        assert sync_jobs(session, jobs, fetch_view(SlurmCli(runner), jobs), tmp_path) == 3
        states = {j.id: j.state for j in jobs}
        # The failed job failed at start-up: sync reads that and, by the failure rules, retries it once.
        assert states == {1: JobState.COMPLETED, 2: JobState.PENDING, 3: JobState.COMPLETED}
        assert jobs[1].reason.endswith("(exit 3:0); retried once") and jobs[1].slurm_jobs[0].role == "retried"
        assert "gres/gpu:v100=1" in jobs[0].slurm_jobs[1].alloc_tres and jobs[0].slurm_jobs[1].nodes == "nodea"
        assert jobs[1].slurm_jobs[0].exit_code == "3:0"
    # one batched squeue and one batched sacct for all three jobs
    assert [c[0] for c in runner.calls] == ["squeue", "sacct"]
    # --states=all: newer squeue --json lists only active jobs unless asked (22.05 listed finished ones too)
    assert runner.calls[0][:6] == ["squeue", "--all", "--json", "--states=all", "--jobs",
                                   ",".join(sorted((array_id, failed_id, het_id)))]


def test_sync_leaves_a_forked_round_open_for_the_job_tracker(rec: Recorded, tmp_path: Path) -> None:
    """A forked job whose round's consolidation ended is not COMPLETED yet: steps may be left (replan decides)."""
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        forked = create_job(session, SPEC, "root", "f")
        forked.state = JobState.RUNNING
        forked.slurm_jobs.append(SlurmJob(slurm_job_id=str(rec.ids["array"]), role="consolidation", round=0,
                                          state="RUNNING"))
        plain = create_job(session, SPEC, "root", "f")
        plain.state = JobState.RUNNING
        plain.slurm_jobs.append(SlurmJob(slurm_job_id=str(rec.ids["array"]), state="RUNNING"))
    with db.transaction() as session:
        from slurmhet.store import list_jobs

        jobs = list_jobs(session)
        assert sync_jobs(session, jobs, fetch_view(SlurmCli(FakeRunner(_answers(rec))), jobs), tmp_path) == 1
        assert [p.state for j in jobs for p in j.slurm_jobs] == ["COMPLETED", "COMPLETED"]
        assert [j.state for j in jobs] == [JobState.RUNNING, JobState.COMPLETED]


def test_sync_failure_raises_and_changes_nothing(rec: Recorded, tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    with db.transaction() as session:
        job = create_job(session, SPEC, "root", "f")
        job.state = JobState.SUBMITTED
        job.slurm_jobs.append(SlurmJob(slurm_job_id=str(rec.ids["failed"]), state="PENDING"))
    with pytest.raises(SlurmCommandError):
        with db.snapshot() as session:
            from slurmhet.store import list_jobs

            fetch_view(SlurmCli(FakeRunner(_answers(rec), fail="squeue")), list_jobs(session))
    with db.transaction() as session:
        from slurmhet.store import get_job

        again = get_job(session, 1)
        assert again is not None and again.state is JobState.SUBMITTED and again.slurm_jobs[0].state == "PENDING"


def test_profile_probe_cache_and_overrides(rec: Recorded, tmp_path: Path) -> None:
    runner = FakeRunner(_answers(rec))
    cache = tmp_path / "profile.json"
    profile = load_profile(SlurmCli(runner), cache, SlurmOverrides())
    version = ".".join(map(str, parse_version(rec.read("sinfo_version.txt"))))
    assert version.startswith(f"{rec.version[0]}.{rec.version[1]}.")  # e.g. 22.5.8 for 22.05
    assert profile.slurm_version == version and profile.accounting and profile.major == rec.version[0]
    assert profile.max_array_size == 1001 and profile.gpu_request_style == "gpus-per-node"
    assert profile.has_mps and profile.has_shard and not profile.spank_plugin
    assert profile.job_comments is True  # the dev cluster's AccountingStoreFlags=job_comment
    config = rec.read("scontrol_show_config.txt")
    bare = {**_answers(rec), "scontrol show config": re.sub(r"(?m)^AccountingStoreFlags\s*=.*\n", "", config)}
    assert load_profile(SlurmCli(FakeRunner(bare)), tmp_path / "bare.json", SlurmOverrides()).job_comments is False
    calls = len(runner.calls)
    again = load_profile(SlurmCli(runner), cache, SlurmOverrides(gpu_request_style="gres", max_array_size=50))
    assert len(runner.calls) == calls  # served from the cache
    assert again.gpu_request_style == "gres" and again.max_array_size == 50


def test_concurrent_probes_each_write_the_cache_whole(rec: Recorded, tmp_path: Path) -> None:
    """Fifty `slurmhet submit`s on a fresh state dir all probe at once; each must write its own temporary
    file (a shared `profile.tmp` made one process's rename fail with FileNotFoundError in a cluster run)."""
    import json
    import threading

    cache = tmp_path / "profile.json"
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def probe_many() -> None:
        start.wait()
        for _ in range(20):
            try:
                load_profile(SlurmCli(FakeRunner(_answers(rec))), cache, SlurmOverrides(), refresh=True)
            except BaseException as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    threads = [threading.Thread(target=probe_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(cache.read_text())["slurm_version"] == ".".join(map(str, parse_version(rec.read("sinfo_version.txt"))))
    assert [p.name for p in tmp_path.iterdir()] == ["profile.json"]  # no temporary file left


def test_queue_times_count_only_once_they_happened() -> None:
    """squeue's start of a pending job is Slurm's guess, and a running job's end its time limit."""
    from datetime import datetime, timezone

    from slurmhet.slurm.parsers import QueueRecord
    from slurmhet.sync import status_from_queue

    t1, t2 = datetime(2026, 11, 25, 10, tzinfo=timezone.utc), datetime(2026, 11, 25, 11, tzinfo=timezone.utc)
    part = SlurmJob(slurm_job_id="7", role="batch")

    def record(state: str) -> QueueRecord:
        return QueueRecord("7", None, None, None, None, "j", state, "", "", "u", "nodea", start=t1, end=t2)

    pending, running, done = (status_from_queue(part, [record(s)]) for s in ("PENDING", "RUNNING", "COMPLETED"))
    assert pending is not None and (pending.start, pending.end) == (None, None)
    assert running is not None and (running.start, running.end) == (t1, None)
    assert done is not None and (done.start, done.end) == (t1, t2)
