"""Report arithmetic on hand-made accounting rows: folding, GPU-hours by type, packs, window."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from slurmhet.report import GpuShares, StoredJob, build_report, foreign_report
from slurmhet.slurm.parsers import AccountingRecord, SlurmJobId, parse_sacct_parsable

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


def test_the_restart_decides_the_state_though_submitted_in_the_second_its_failed_run_was_requeued() -> None:
    """A node failed under run 4071; Slurm requeued it, slurmhet cancelled it and submitted 4073 within the same
    second (sacct's Submit of both reads alike). The job completed: 4073's state, not 4071's, is the job's."""
    requeue = T0 + timedelta(seconds=60)
    failed = AccountingRecord(SlurmJobId("4071"), "4071", "x", "CANCELLED", "0:0", requeue, None, requeue, 0, {},
                              "nodea", "", "root", "gpu")
    restart = AccountingRecord(SlurmJobId("4073"), "4073", "x", "COMPLETED", "0:0", requeue, requeue,
                               requeue + timedelta(seconds=40), 40, {"gres/gpu:v100": 1}, "nodea", "", "root", "gpu")
    for records in ([failed, restart], [restart, failed]):
        (job,) = build_report([StoredJob(1, "j", "root", 1.0, None, ("4071", "4073"))], records, {"v100": 4}).jobs
        assert job.state == "COMPLETED" and job.end == requeue + timedelta(seconds=40)


def test_the_stores_settled_state_overrules_sacct_once_the_run_ended() -> None:
    """A run that checkpointed at its time limit and stopped short exits 0: sacct says COMPLETED, the store
    (which read its progress) FAILED. A job still running in Slurm keeps Slurm's word."""
    records = [_row("60", 0, 120, {"gres/gpu:k80": 1}, "nodec")]
    (job,) = build_report([StoredJob(1, "j", "root", 1.0, None, ("60",), settled="FAILED")], records,
                          {"k80": 2}).jobs
    assert (job.state, job.run_s) == ("FAILED", 120.0)
    (job,) = build_report([StoredJob(1, "j", "root", 1.0, None, ("60",))], records, {"k80": 2}).jobs
    assert job.state == "COMPLETED"  # not settled (an unsynced store): sacct decides
    running = [AccountingRecord(SlurmJobId("61"), "61", "x", "RUNNING", "0:0", T0, T0, None, 0, {}, "nodec", "",
                                "root", "k80")]
    (job,) = build_report([StoredJob(1, "j", "root", 1.0, None, ("61",), settled="COMPLETED")], running,
                          {"k80": 2}).jobs
    assert job.state == "RUNNING"


# sacct --parsable2 --noheader --format=<SACCT_FIELDS> as the dev cluster prints it (slurmhet job 40 is this
# store's het job; the devcluster noise user's plain jobs and another store's job share the cluster with it).
SACCT_SHARED = """\
40+0|40|slurmhet-7-big|COMPLETED|0:0|2026-01-01T00:01:40|2026-01-01T00:01:40|2026-01-01T00:11:40|00:10:00|billing=1,cpu=1,gres/gpu:v100=2,gres/gpu=2,mem=250M,node=1|nodea|slurmhet:7@store-a|root|gpu
40+1|41|slurmhet-7-big|COMPLETED|0:0|2026-01-01T00:01:40|2026-01-01T00:01:40|2026-01-01T00:11:40|00:10:00|billing=1,cpu=1,gres/gpu:t4=1,gres/gpu=1,mem=250M,node=1|nodeb||root|gpu
40+0.batch|40.batch|batch|COMPLETED|0:0|2026-01-01T00:01:40|2026-01-01T00:01:40|2026-01-01T00:11:40|00:10:00|cpu=1,gres/gpu:v100=2,gres/gpu=2,mem=250M,node=1|nodea|||
38|38|devcluster-noise|COMPLETED|0:0|2026-01-01T00:00:00|2026-01-01T00:00:10|2026-01-01T00:03:40|00:03:30|billing=1,cpu=1,gres/gpu:v100=2,gres/gpu=2,mem=250M,node=1|nodea||slurmhet-noise|gpu
38.batch|38.batch|batch|COMPLETED|0:0|2026-01-01T00:00:10|2026-01-01T00:00:10|2026-01-01T00:03:40|00:03:30|cpu=1,gres/gpu:v100=2,gres/gpu=2,mem=250M,node=1|nodea|||
39|39|devcluster-noise|RUNNING|0:0|2026-01-01T00:05:00|2026-01-01T00:06:00|Unknown|00:07:30|billing=1,cpu=1,gres/gpu:k80=1,gres/gpu=1,mem=250M,node=1|nodec||slurmhet-noise|k80
42|42|devcluster-noise|PENDING|0:0|2026-01-01T00:09:00|Unknown|Unknown|00:00:00||None assigned||slurmhet-noise|gpu
43|43|slurmhet-1-a|CANCELLED by 0|0:0|2026-01-01T00:02:00|2026-01-01T00:04:00|2026-01-01T00:08:00|00:04:00|billing=1,cpu=1,gres/gpu:t4=1,gres/gpu=1,mem=250M,node=1|nodeb|slurmhet:1@store-b|alice|t4
30|30|old|COMPLETED|0:0|2025-12-31T23:00:00|2025-12-31T23:00:00|2025-12-31T23:30:00|00:30:00|billing=1,cpu=1,gres/gpu:v100=1,gres/gpu=1,mem=250M,node=1|nodea||alice|gpu
50|50|later|COMPLETED|0:0|2026-01-01T00:12:00|2026-01-01T00:12:00|2026-01-01T00:13:00|00:01:00|billing=1,cpu=1,gres/gpu:v100=1,gres/gpu=1,mem=250M,node=1|nodea||alice|gpu
"""


def test_other_users_jobs_in_the_window_beside_slurmhets() -> None:
    """Only jobs without this store's tag that overlap the window count; GPU-hours only inside it."""
    records = parse_sacct_parsable(SACCT_SHARED)
    ours = [r for r in records if r.id.job == "40"]
    report = build_report([StoredJob(7, "big", "root", 1.0, 600.0, ("40",), stored_at=_at(records, "38", 60))],
                          ours, {"v100": 4, "t4": 4, "k80": 2})
    start, end = report.window
    assert start is not None and end is not None and (end - start).total_seconds() == 640  # 00:01:00 .. 00:11:40
    report.foreign = foreign_report(records, "store-a", report.window, ["40"])
    foreign = report.foreign
    assert foreign is not None
    assert sorted(foreign.users) == ["alice", "slurmhet-noise"]  # 30 ended before, 50 came after the window
    noise, alice = foreign.users["slurmhet-noise"], foreign.users["alice"]
    assert noise.jobs == 3 and alice.jobs == 1 and foreign.total.jobs == 4  # another store's job is foreign
    # 38: 2 v100 from 00:01:00 (window start) to 00:03:40; 39 runs on: 1 k80 from 00:06:00 for 7.5 min
    # (started + elapsed), cut at 00:11:40; 42 is pending: no GPU-hours, no queueing yet.
    assert noise.gpu_hours == {"v100": pytest.approx(2 * 160 / 3600), "k80": pytest.approx(340 / 3600)}
    assert noise.avg_queue_s == pytest.approx((10 + 60) / 2)
    assert noise.avg_jct_s == pytest.approx(220)  # only 38 is over
    assert alice.gpu_hours == {"t4": pytest.approx(240 / 3600)}
    assert (alice.avg_queue_s, alice.avg_jct_s) == (120, 360)  # cancelled after it ran: a final JCT
    assert foreign.total.gpu_hours["v100"] == noise.gpu_hours["v100"]
    out = report.to_json()["foreign"]
    assert isinstance(out, dict) and out["jobs"] == 4 and out["users"]["alice"]["avg_jct_s"] == 360.0
    assert out["gpu_hours"] == {"k80": round(340 / 3600, 6), "t4": round(240 / 3600, 6), "v100": round(320 / 3600, 6)}


def test_foreign_is_none_without_a_window_and_this_stores_untagged_components_stay_ours() -> None:
    records = parse_sacct_parsable(SACCT_SHARED)
    assert foreign_report(records, "store-a", (None, None)) is None
    start = _at(records, "38", 0)
    # Without the id list, the tag on component 0 alone still marks the whole het job 40 as ours.
    out = foreign_report(records, "store-a", (start, start + timedelta(hours=1)))
    assert out is not None and "root" not in out.users and out.total.jobs == 5
    assert build_report([], [], {}).to_json()["foreign"] is None


def _at(records: list[AccountingRecord], job: str, seconds: float) -> datetime:
    """``seconds`` after job ``job``'s sacct Submit (sacct times are local: no fixed UTC value here)."""
    submit = next(r.submit for r in records if r.raw_id == job)
    assert submit is not None
    return submit + timedelta(seconds=seconds)
