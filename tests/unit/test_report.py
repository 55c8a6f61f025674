"""Report arithmetic on hand-made accounting rows: folding, GPU-hours by type, packs, window."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from slurmhet.report import GpuShares, StoredJob, build_report
from slurmhet.slurm.parsers import AccountingRecord, SlurmJobId

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _row(job: str, start_s: float, run_s: float, tres: dict[str, float], nodes: str, het: int | None = None,
         step: str | None = None) -> AccountingRecord:
    start = T0 + timedelta(seconds=start_s)
    return AccountingRecord(SlurmJobId(job, het_offset=het, step=step), job, "x", "COMPLETED", "0:0", T0, start,
                            start + timedelta(seconds=run_s), int(run_s), tres, nodes, "", "root", "gpu")


def test_het_components_fold_and_steps_are_dropped() -> None:
    records = [_row("10", 10, 3600, {"gres/gpu:v100": 2}, "nodea", het=0),
               _row("10", 10, 3600, {"gres/gpu:t4": 1}, "nodeb", het=1),
               _row("10", 10, 3600, {"gres/gpu:t4": 1}, "nodeb", het=1, step="batch")]
    report = build_report([StoredJob(1, "j", "root", 2.0, 3000.0, ("10",))], records, {"v100": 4, "t4": 4})
    (job,) = report.jobs
    assert job.gpu_hours == {"v100": 2.0, "t4": 1.0}
    assert (job.queue_s, job.run_s, job.jct_s) == (10.0, 3600.0, 3610.0)
    assert report.makespan_s == 3610.0 and report.weighted_jct_s == 3610.0
    assert abs(report.plan_error - 610 / 3610) < 1e-9  # type: ignore[operator]
    assert abs(report.utilization["v100"] - 2.0 / (4 * 3610 / 3600)) < 1e-9


def test_pack_gpu_hours_count_the_share_once_split_among_members() -> None:
    shares = {"nodeb": GpuShares("t4", mps_per_gpu=0, shards_per_gpu=2), "nodea": GpuShares("v100", 100, 0)}
    records = [_row("20", 0, 1800, {"gres/shard": 2}, "nodeb"), _row("21", 0, 3600, {"gres/mps": 50}, "nodea")]
    jobs = [StoredJob(1, "a", "root", 1.0, None, ("20",)), StoredJob(2, "b", "root", 1.0, None, ("20",)),
            StoredJob(3, "c", "root", 1.0, None, ("21",))]
    report = build_report(jobs, records, {"t4": 4, "v100": 4}, shares=shares)
    assert [j.gpu_hours for j in report.jobs] == [{"t4": 0.25}, {"t4": 0.25}, {"v100": 0.5}]
    assert report.gpu_hours == {"t4": 0.5, "v100": 0.5}


def test_jct_and_queueing_count_from_when_slurmhet_stored_the_job() -> None:
    """The job waited 100 s in slurmhet's store before its sbatch (sacct Submit = T0): the user waited
    110 s for it to start and 3,710 s for it to end. A naive store time (SQLite) is UTC."""
    records = [_row("30", 10, 3600, {"gres/gpu:v100": 1}, "nodea")]
    stored = (T0 - timedelta(seconds=100)).replace(tzinfo=None)
    report = build_report([StoredJob(1, "j", "root", 1.0, None, ("30",), stored_at=stored)], records, {"v100": 4})
    (job,) = report.jobs
    assert (job.queue_s, job.run_s, job.jct_s) == (110.0, 3600.0, 3710.0)
    assert report.makespan_s == 3710.0
