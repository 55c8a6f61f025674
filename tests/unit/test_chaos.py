"""The chaos bench's plan and judgement (pure): a seeded fault schedule and workload, overlapping runs, progress a
fault took back, and the invariants."""

from __future__ import annotations

from pathlib import Path

from bench.chaos import (CHECKPOINT_EVERY, FAULT_SHARE, KINDS, ProgressLog, Run, fault_schedule, invariants,
                         overlapping, workload)
from slurmhet.runtime.progress import ProgressRecord
from slurmhet.spec import load_text


def _rec(job: str, slurm: str, steps: int, start: int = 0, rank: int = 0, consolidation: bool = False,
         started: float = 0.0, at: float = 10.0) -> ProgressRecord:
    return ProgressRecord(job_id=job, slurm_job_id=slurm, rank=rank, gpu_type=None if consolidation else "t4",
                          node="" if consolidation else "nodeb", steps_done=steps, samples_done=0,
                          samples_per_second=0.0, epoch=0, updated_at=at, emulated=True,
                          state="done" if consolidation else "running", start_steps=start, started_at=started)


def test_the_fault_schedule_is_seeded_covers_every_kind_and_stops_at_its_share() -> None:
    faults = fault_schedule(3, 30)
    assert faults == fault_schedule(3, 30) and faults != fault_schedule(4, 30)
    assert {f.kind for f in faults} == set(KINDS)
    assert all(f.at_s < 30 * 60 * FAULT_SHARE for f in faults) and faults == sorted(faults, key=lambda f: f.at_s)
    assert all(f.node for f in faults if f.kind in ("node_down", "slurmd_restart"))


def test_the_workload_is_seeded_valid_and_mixed(tmp_path: Path) -> None:
    jobs = workload(1, 5, tmp_path)
    assert [j.name for j in jobs] == [j.name for j in workload(1, 5, tmp_path)]
    kinds = {j.name.rsplit("-", 1)[1] for j in jobs}
    assert kinds == {"single", "het", "forked", "colocate"}
    for job in jobs:
        (spec,) = load_text(job.spec, f"{job.name}.yaml")  # a spec slurmhet accepts
        assert spec.checkpoint_dir and "--checkpoint-every" in spec.command
    assert all(0 <= j.arrive_s <= 5 * 60 * 0.5 for j in jobs)
    assert len(workload(1, 30, tmp_path)) > len(jobs)


def test_runs_of_one_job_must_not_overlap_but_a_rounds_copies_may() -> None:
    assert overlapping([Run("10", "batch", 0, 50), Run("10", "batch", 60, 90), Run("11", "batch", 95, 120)]) == []
    assert overlapping([Run("10", "batch", 0, 50), Run("11", "batch", 40, 90)]) == [("10", "11")]
    copies = [Run("20_0", "array", 0, 30), Run("19_1", "array", 1, 28), Run("21", "consolidation", 30, 40),
              Run("22_0", "array", 35, 60, round=1)]  # round 1 starts while round 0's consolidation still runs
    assert overlapping(copies) == []  # round 0's copies: two arrays (two GPU types), one run
    assert overlapping([*copies, Run("23", "batch", 50, 70)]) == [("round 1", "23")]
    assert overlapping([Run("10", "batch", 0, None), Run("11", "het", 5, None)]) == [("10", "11")]  # still running


def test_progress_lost_is_what_was_reached_before_a_run_minus_where_it_resumed() -> None:
    log = ProgressLog()
    log.sample([_rec("1", "30", 27, started=0.0, at=13.5)], 10.0)  # the first run reached 27
    log.sample([_rec("1", "30", 31, start=20, started=40.0, at=45.5)], 50.0)  # requeued: resumed at its checkpoint 20
    assert log.lost_steps("1") == 7
    assert log.pace_s_per_step("1") == 0.5
    forked = ProgressLog()  # round 0 from 0: copies 25 + 30 steps; the average kept 50 (a copy lost 5)
    forked.sample([_rec("2", "40", 25), _rec("2", "41", 30)], 10.0)
    forked.sample([_rec("2", "42", 50, start=50, consolidation=True)], 20.0)
    forked.sample([_rec("2", "43", 60, start=50)], 30.0)
    assert forked.lost_steps("2") == 5
    clean = ProgressLog()
    clean.sample([_rec("3", "50", 40)], 10.0)
    clean.sample([_rec("3", "51", 40, start=40)], 20.0)  # resubmitted after a clean stop at 40: nothing lost
    assert clean.lost_steps("3") == 0


def test_invariants_say_which_promise_broke() -> None:
    stored = [{"name": "a", "state": "COMPLETED"}, {"name": "b", "state": "COMPLETED"}]
    good = invariants(["a", "b"], stored, {"1", "2"}, {"1", "2", "3"}, {"1", "2"},
                      {1: [Run("1", "batch", 0, 10)]}, {1: 3}, {1: CHECKPOINT_EVERY})
    assert all(good.values()), good
    bad = invariants(["a", "b", "c"], [*stored, {"name": "b", "state": "COMPLETED"}], {"1", "9"}, {"1"}, {"1", "2"},
                     {1: [Run("1", "batch", 0, 10), Run("2", "batch", 5, 12)]}, {1: CHECKPOINT_EVERY + 1},
                     {1: CHECKPOINT_EVERY})
    assert not any(bad.values()), bad  # c lost and b twice; 9 not recorded; 2 unknown; overlap; too much lost


def test_bad_chaos_flags_are_refused_with_exit_2_before_anything_runs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmhet.cli import main

    for args, field in ((["--minutes", "0"], "--minutes"), (["--minutes", "five"], "--minutes"),
                        (["--seed", "1.5"], "--seed")):
        result = CliRunner().invoke(main, ["bench", "chaos", *args], env={"SLURMHET_STATE_DIR": str(tmp_path)})
        assert result.exit_code == 2 and f"Invalid value for '{field}'" in result.output, result.output
    assert list(tmp_path.iterdir()) == []  # no store, no run directory: nothing was started
