"""Progress files, emulated GPU speed, and the example job file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slurmhet.cluster import Inventory, Node
from slurmhet.errors import InputError
from slurmhet.runtime.emulation import DEFAULT_TABLE, StepPacer, emulated_samples_per_s, enabled, node_gpu_type, table_rate
from slurmhet.runtime.progress import (ProgressRecord, ProgressReporter, finished_steps, job_steps, progress_path,
                                       stopped_short,
                                       read_progress, write_progress)
from slurmhet.spec import load_file

REPO = Path(__file__).resolve().parents[2]
DEV_CLUSTER = Inventory((Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2})))


def _record(job: str, slurm: str, rank: int, steps: int, start: int = 0, state: str = "running") -> ProgressRecord:
    return ProgressRecord(job_id=job, slurm_job_id=slurm, rank=rank, gpu_type="t4", node="nodeb", steps_done=steps,
                          samples_done=steps * 64, samples_per_second=800.0, epoch=0, updated_at=1.0, emulated=False,
                          state=state, start_steps=start)


def test_records_round_trip_and_garbage_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = _record("5", "900", 1, 12)
    write_progress(progress_path(tmp_path, "5", "900", 1), record)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    assert read_progress(tmp_path) == [record]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["5.900.1.json", "broken.json", "other.json"]
    assert "broken.json" in capsys.readouterr().err
    assert read_progress(tmp_path / "missing") == []


def test_one_jobs_records_are_read_alone(tmp_path: Path) -> None:
    for job, slurm in (("1", "900"), ("1", "901"), ("12", "902"), ("21", "903")):
        write_progress(progress_path(tmp_path, job, slurm, 0), _record(job, slurm, 0, 5))
    assert [(r.job_id, r.slurm_job_id) for r in read_progress(tmp_path, "1")] == [("1", "900"), ("1", "901")]
    assert len(read_progress(tmp_path)) == 4 and read_progress(tmp_path, "7") == []


def test_finished_steps_counts_only_runs_whose_command_exited_0_done() -> None:
    done = replace(_record("a", "100", 0, 60, state="done"), exit_code=0)
    failed = replace(_record("b", "200", 0, 60, state="failed"), exit_code=1)
    running = _record("c", "300", 0, 60)  # all steps made, but the command has not exited (yet)
    killed = replace(_record("d", "400", 0, 60, state="done"), exit_code=None)
    earlier = replace(_record("a", "99", 0, 30, state="done"), exit_code=0)
    assert finished_steps([earlier, done, failed, running, killed]) == {"a": 60}


def test_stopped_short_is_the_last_run_when_it_stopped_on_a_signal_before_the_end() -> None:
    def run(slurm: str, steps: int, state: str, at: float, rank: int = 0, code: int | None = 0) -> ProgressRecord:
        return replace(_record("a", slurm, rank, steps, state=state), updated_at=at, exit_code=code)

    timed_out = run("100", 40, "timeout", 5.0)
    assert stopped_short([timed_out, run("100", 40, "timeout", 5.0, rank=1)], 60) == timed_out
    assert stopped_short([run("99", 20, "preempted", 1.0), timed_out], 60) == timed_out
    preempted = run("101", 45, "preempted", 9.0)
    assert stopped_short([timed_out, preempted], 60) == preempted  # the latest run speaks
    assert stopped_short([timed_out, run("101", 50, "running", 9.0, code=None)], 60) is None  # it went on
    assert stopped_short([timed_out, run("101", 60, "done", 9.0)], 60) is None  # a later run finished
    assert stopped_short([run("100", 60, "done", 2.0), timed_out], 60) is None  # a late requeue after the end
    assert stopped_short([run("100", 60, "timeout", 5.0)], 60) is None  # stopped at its very last step
    assert stopped_short([run("100", 40, "failed", 5.0, code=1)], 60) is None  # a failure is settle_failure's
    assert stopped_short([run("100", 40, "timeout", 5.0, rank=1)], 60) is None and stopped_short([], 60) is None


def test_job_steps_counts_ranks_once_and_adds_forked_copies() -> None:
    records = [
        _record("gang", "100", 0, 40), _record("gang", "100", 1, 40),  # one run, two ranks
        _record("gang", "101", 0, 70, start=40),  # the next run resumed at 40
        _record("fork", "200", 0, 25, start=20), _record("fork", "201", 0, 28, start=20),  # a round's copies
        _record("fork", "150", 0, 20, start=0),  # the previous round's single copy
    ]
    assert job_steps(records) == {"gang": 70, "fork": 33}


def test_job_steps_after_a_consolidation_count_what_it_averaged_not_a_lost_copys_steps() -> None:
    """Round 1 started at 20; copy 201's node died at step 35 with its checkpoint at 30; the consolidation
    averaged 25 (copy 200) and 30: 20 + 5 + 10 = 35, not the 40 the progress records add up to."""
    consolidation = ProgressRecord(job_id="fork", slurm_job_id="202", rank=0, gpu_type=None, node="", steps_done=35,
                                   samples_done=0, samples_per_second=0.0, epoch=0, updated_at=2.0, emulated=False,
                                   state="done", start_steps=35, exit_code=0)
    records = [_record("fork", "150", 0, 20), _record("fork", "200", 0, 25, start=20),
               _record("fork", "201", 0, 35, start=20), consolidation]
    assert job_steps(records[:3]) == {"fork": 40}  # before the consolidation: the copies' own counts
    assert job_steps(records) == {"fork": 35}
    # The next round's copies count on top of the consolidation.
    assert job_steps([*records, _record("fork", "300", 0, 41, start=35), _record("fork", "301", 0, 38, start=35)]) \
        == {"fork": 44}


def test_job_steps_saved_counts_each_runs_last_checkpoint_where_a_rank_says_it() -> None:
    """After a fault the next run resumes from the last checkpoint: rank 0 saved at 35 (rank 1 does not save and
    says nothing); a command that does not report its saves is taken at the step it reached; a run that saved
    nothing says its start. Forked copies add what they saved; a consolidation holds what it averaged."""
    def saving(job: str, slurm: str, rank: int, steps: int, saved: int | None, start: int = 0) -> ProgressRecord:
        return replace(_record(job, slurm, rank, steps, start=start), saved_steps=saved)

    records = [saving("gang", "100", 0, 37, 35), saving("gang", "100", 1, 38, None),
               _record("silent", "200", 0, 23),  # an older record, or a command that does not say
               saving("scratch", "300", 0, 50, 0),  # no checkpoint directory: it starts over
               saving("fork", "400", 0, 25, 24, start=20), saving("fork", "401", 0, 29, 26, start=20),
               saving("late", "500", 0, 40, 90)]  # a count past the steps reached is held to them
    assert job_steps(records) == {"gang": 38, "silent": 23, "scratch": 50, "fork": 34, "late": 40}
    assert job_steps(records, saved=True) == {"gang": 35, "silent": 23, "scratch": 0, "fork": 30, "late": 40}
    consolidation = replace(_record("fork", "402", 0, 30, start=30, state="done"), gpu_type=None, node="",
                            exit_code=0, saved_steps=30)
    assert job_steps([*records, consolidation], saved=True)["fork"] == 30


def test_a_saved_step_is_written_at_once_and_garbage_there_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    reporter = ProgressReporter(path, replace(_record("5", "900", 0, 0), saved_steps=0), interval_s=3600)
    reporter.update(steps_done=1, samples_done=64, epoch=0, rank_samples=32)
    reporter.update(steps_done=2, samples_done=128, epoch=0, rank_samples=64)  # throttled: not written
    reporter.saved(2)
    [record] = read_progress(tmp_path)
    assert (record.steps_done, record.saved_steps) == (2, 2)
    for bad in ("-1", '"7"', "1.5"):
        path.write_text(record.to_json().replace('"saved_steps": 2', f'"saved_steps": {bad}'))
        assert read_progress(tmp_path) == []
    older = json.loads(record.to_json())
    del older["saved_steps"]  # a record written before the field existed
    path.write_text(json.dumps(older))
    assert read_progress(tmp_path)[0].saved_steps is None


def test_reporter_throttles_but_always_writes_state_changes(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    reporter = ProgressReporter(path, _record("5", "900", 0, 0), interval_s=3600)
    reporter.update(steps_done=1, samples_done=64, epoch=0, rank_samples=32)
    reporter.update(steps_done=2, samples_done=128, epoch=0, rank_samples=64)
    assert read_progress(tmp_path)[0].steps_done == 1  # the second update fell inside the interval
    reporter.update(steps_done=3, samples_done=192, epoch=0, rank_samples=96, state="preempted")
    [record] = read_progress(tmp_path)
    assert (record.steps_done, record.state) == (3, "preempted")
    assert record.samples_per_second > 0


def test_node_gpu_type_sources_in_order(tmp_path: Path) -> None:
    assert node_gpu_type({"SLURMHET_GPU_TYPE": "V100", "SLURMD_NODENAME": "nodec"}) == "v100"
    mapping = "nodea=v100,nodeb=t4,nodec=k80"
    assert node_gpu_type({"SLURMD_NODENAME": "nodec", "SLURMHET_NODE_GPU_TYPES": mapping}) == "k80"
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("nodes:\n  - {name: nodeb, gpus: {t4: 4}}\n")
    assert node_gpu_type({"SLURMD_NODENAME": "nodeb", "SLURMHET_INVENTORY": str(inventory)}) == "t4"
    assert node_gpu_type({"SLURMD_NODENAME": "elsewhere", "SLURMHET_INVENTORY": str(inventory)}) is None
    with pytest.raises(InputError, match="bad entry"):
        node_gpu_type({"SLURMD_NODENAME": "nodea", "SLURMHET_NODE_GPU_TYPES": "nodea"})


def test_emulated_rates_follow_the_table_and_the_mps_share() -> None:
    assert enabled({"SLURMHET_EMULATE_THROUGHPUT": "1"}) and not enabled({})
    assert emulated_samples_per_s({}, "mlp-small", "k80") == 400.0  # etc/throughput/devcluster.yaml
    assert emulated_samples_per_s({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, "mlp-small", "v100") == 800.0
    assert emulated_samples_per_s({"SLURMHET_EMULATED_SAMPLES_PER_S": "123"}, "anything", None) == 123.0
    with pytest.raises(InputError, match="GPU type"):
        emulated_samples_per_s({}, "mlp-small", "a100")
    with pytest.raises(InputError, match="positive"):
        emulated_samples_per_s({"SLURMHET_EMULATED_SAMPLES_PER_S": "0"}, "mlp-small", "v100")


def test_pacer_holds_the_cumulative_rate() -> None:
    now = [100.0]
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now[0] += seconds

    pacer = StepPacer(100.0, clock=lambda: now[0], sleep=sleep)
    pacer.step(50)  # due at +0.5 s
    now[0] += 0.7  # a slow step overshoots ...
    pacer.step(50)  # ... so the next sleep is shorter: due at +1.0 s, now +1.2 s
    pacer.step(50)
    assert sleeps == pytest.approx([0.5, 0.3])
    assert now[0] == pytest.approx(101.5)


def _rate_sum(model: str, types: tuple[str, ...], count: int, fastest: bool) -> float:
    """Summed emulated rate of ``count`` GPUs of the allowed types, fastest or slowest first, within the cluster."""
    have = DEV_CLUSTER.gpus_by_type()
    pool = sorted((table_rate(DEFAULT_TABLE, model, t) for t in types for _ in range(have[t])), reverse=fastest)
    return sum(pool[:count])


def test_example_jobs_are_valid_varied_and_short_under_emulation() -> None:
    jobs = load_file(REPO / "examples" / "jobs.yaml")
    assert len(jobs) >= 12
    assert any(len(j.gpus.types) == 1 for j in jobs)
    assert any(len(j.gpus.types) > 1 and j.gpus.min > 1 for j in jobs)
    assert any(j.forkable for j in jobs) and any(j.colocate for j in jobs)
    assert any(j.global_batch // j.workload.batch_size > j.gpus.min for j in jobs)  # relaxed scale-fixed
    for job in jobs:
        assert job.command[:2] == ("python", "examples/train.py")
        model = job.command[job.command.index("--model") + 1]
        assert model == job.workload.model
        assert job.command[job.command.index("--steps") + 1] == str(job.steps)
        assert job.command[job.command.index("--global-batch") + 1] == str(job.global_batch)
        slowest = job.total_samples / _rate_sum(model, job.gpus.types, job.gpus.min, fastest=False)
        fastest = job.total_samples / _rate_sum(model, job.gpus.types, job.gpus.max, fastest=True)
        if job.colocate:
            slowest *= 2  # sharing the GPU at 50 %
        assert 40 <= fastest and slowest <= 200, (job.name, fastest, slowest)
