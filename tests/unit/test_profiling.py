"""`slurmhet profile`'s pure parts: which runs, what they measured, the table, the wait."""

from __future__ import annotations

import pytest

from slurmhet.errors import InputError
from slurmhet.profiling import measured, profile_runs, rows, unmeasured, wait_until
from slurmhet.runtime.progress import ProgressRecord
from slurmhet.spec import load_text
from slurmhet.throughput import ThroughputTable

SPECS = load_text("""\
jobs:
  - name: a
    workload: {model: net, batch_size: 32}
    command: [python, train.py]
    work: {epochs: 3, dataset_size: 1000}
    global_batch: 64
    sync: local-sgd
    colocate: true
    checkpoint_dir: /ckpt/a
    gpus: {min: 2, max: 4, types: [v100, t4]}
  - name: b
    workload: {model: net, batch_size: 32}
    command: [python, train.py]
    work: {steps: 10}
  - name: c
    workload: {model: other, batch_size: 8}
    command: [python, train.py]
    work: {steps: 10}
""", "jobs.yaml")


def test_one_run_per_job_and_allowed_type_alone_on_one_gpu() -> None:
    runs = profile_runs(SPECS, ("k80", "t4", "v100"), steps=50, minutes=7)
    assert [(r.job, r.gpu_type) for r in runs] == [("a", "v100"), ("a", "t4"), ("b", "k80"), ("c", "k80"),
                                                    ("c", "t4"), ("c", "v100")]  # b shares a's workload
    run = runs[0].spec
    assert run.name == "a.profile-v100" and (run.gpus.min, run.gpus.max, run.gpus.types) == (1, 1, ("v100",))
    assert not run.colocate and run.sync == "allreduce" and run.checkpoint_dir is None  # no MPS, no fork, no ckpt
    assert run.steps == 50 and run.profile_steps == 50 and run.time_limit_min == 7 and run.global_batch == 64
    again = load_text(__import__("yaml").safe_dump(run.to_dict()), "stored")[0]
    assert again == run  # what the store keeps parses back to the same run


def test_types_filter_skip_and_unknown_type() -> None:
    only = profile_runs(SPECS, ("k80", "t4", "v100"), only=("t4",))
    assert {(r.job, r.gpu_type) for r in only} == {("a", "t4"), ("c", "t4")}
    table = ThroughputTable.from_rates({"net (batch size 32)": {"v100": 100.0}})
    todo = profile_runs(SPECS, ("t4", "v100"), skip=unmeasured(table))
    assert ("a", "v100") not in {(r.job, r.gpu_type) for r in todo} and ("a", "t4") in {(r.job, r.gpu_type) for r in todo}
    with pytest.raises(InputError, match="'a100' is not in the cluster") as err:
        profile_runs(SPECS, ("t4", "v100"), only=("a100",))
    assert err.value.place == "--types" and err.value.exit_code == 2


def _record(job: str, rank: int, rate: float, at: float) -> ProgressRecord:
    return ProgressRecord(job, "77", rank, "t4", "nodeb", 10, 320, rate, 0, at, True)


def test_measured_takes_each_runs_latest_rank0_rate_and_rows_give_ratios() -> None:
    runs = {str(i): r for i, r in enumerate(profile_runs(SPECS[:1], ("t4", "v100")), start=5)}  # 5: v100, 6: t4
    records = [_record("5", 0, 900.0, 1.0), _record("5", 0, 1000.0, 2.0), _record("5", 1, 5.0, 3.0),
               _record("6", 0, 400.0, 1.0), _record("9", 0, 1.0, 1.0), _record("6", 0, 0.0, 5.0)]
    rates = measured(records, runs)
    assert rates == {"5": 1000.0, "6": 400.0}
    table = rows(runs, rates, {"5": "COMPLETED", "6": "COMPLETED"}, {"5": ("101",)})
    assert [(r.gpu_type, r.samples_per_s, r.ratio, r.slurm_job_ids) for r in table] == [
        ("t4", 400.0, 0.4, ()), ("v100", 1000.0, 1.0, ("101",))]
    assert table[0].to_json()["workload"] == "net (batch size 32)"


def test_wait_until_stops_at_done_or_deadline() -> None:
    now = [0.0]
    ticks: list[float] = []

    def sleep(s: float) -> None:
        now[0] += s

    assert wait_until(lambda: len(ticks) >= 3, lambda: ticks.append(now[0]), 100.0, 5.0, lambda: now[0], sleep)
    assert ticks == [0.0, 5.0, 10.0]
    ticks.clear()
    assert not wait_until(lambda: False, lambda: ticks.append(now[0]), 12.0, 5.0, lambda: now[0], sleep)
    assert len(ticks) == 4  # 10, 15, 20, then 25 >= the deadline 22
