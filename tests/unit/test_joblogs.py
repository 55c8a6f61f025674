"""`slurmhet logs` and `status ID`: which files, in what order, under which headers; the full job view."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

from slurmhet.joblogs import PartInfo, Tail, log_parts, numbered
from slurmhet.jobview import detail_lines, job_detail
from slurmhet.spec import load_text
from slurmhet.store import JobState
from slurmhet.throughput import ThroughputEntry

T0 = datetime(2026, 11, 25, 9, tzinfo=timezone.utc)


def at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


PARTS = [
    PartInfo("30", "het", at(40), "RUNNING", "t4", 1, "nodeb", het_offset=1),
    PartInfo("10", "batch", at(0), "REQUEUED", "v100", 2, "nodea"),
    PartInfo("12", "batch", at(10), "CANCELLED", "v100", 2, "nodea"),
    PartInfo("20", "array", at(20), "COMPLETED", "k80", 1, "nodec", array_task=1, round=0),
    PartInfo("20", "array", at(20), "COMPLETED", "k80", 1, "nodec", array_task=0, round=0),
    PartInfo("21", "consolidation", at(20), "COMPLETED", round=0),
    PartInfo("30", "het", at(40), "RUNNING", "v100", 2, "nodea", het_offset=0),
    PartInfo("11", "superseded", at(5), "CANCELLED", "v100", 2, "nodea"),
    PartInfo("44", "batch", at(50), "PENDING", "t4", 1, ""),
]
FILES = [Path("/l") / n for n in ("slurmhet-5-30.out", "slurmhet-5-21.out", "slurmhet-5-20_1.out", "slurmhet-5-20_0.out",
                                   "slurmhet-5-12.out", "slurmhet-5-10.out", "slurmhet-5-11.out", "slurmhet-6-99.out",
                                   "notes.txt", "submitit/77_0_log.out")]


def test_parts_come_in_submission_order_with_their_shapes() -> None:
    parts = log_parts(PARTS, FILES)
    assert [p.slurm_id for p in parts] == ["10", "12", "20_0", "20_1", "21", "30"]  # 44 wrote nothing yet
    headers = {p.slurm_id: p.header for p in parts}
    assert headers["10"] == "Slurm job 10 (batch; 2xv100 on nodea; REQUEUED)"
    assert headers["20_1"] == "Slurm job 20_1 (array, round 0; 1xk80 on nodec; COMPLETED)"
    assert headers["21"] == "Slurm job 21 (consolidation, round 0; COMPLETED)"
    assert headers["30"] == "Slurm job 30 (het; 2xv100 on nodea + 1xt4 on nodeb; RUNNING)"  # both components
    assert [n for n, _ in numbered(parts)] == [1, 2, 3, 4, 5, 6]


def test_submitit_and_pack_files_are_found_by_their_slurm_id() -> None:
    parts = [PartInfo("77", "batch", at(0), "RUNNING", "t4", 1, "nodeb"),
             PartInfo("88", "pack", at(1), "RUNNING", "t4", 1, "nodeb")]
    found = log_parts(parts, FILES + [Path("/l/slurmhet-4-88.out")])  # a pack's file names its first member
    assert [(p.slurm_id, p.path.name) for p in found] == [("77", "77_0_log.out"), ("88", "slurmhet-4-88.out")]


def test_a_pack_member_reads_its_own_files_and_an_older_pack_the_shared_ones() -> None:
    """run-pack copies each member's output to ``.member-<job id>`` files beside the pack's: a member's logs are
    its own. A pack from before has only the pack's files, which every member then shows."""
    parts = [PartInfo("88", "pack", at(1), "RUNNING", "t4", 1, "nodeb"),
             PartInfo("89", "retried", at(0), "FAILED", "t4", 1, "nodeb")]
    files = [Path("/l") / n for n in ("slurmhet-4-88.out", "slurmhet-4-88.err", "slurmhet-4-88.member-4.out",
                                      "slurmhet-4-88.member-4.err", "slurmhet-4-88.member-5.out",
                                      "slurmhet-4-88.member-5.err", "slurmhet-4-89.out", "slurmhet-4-89.err")]
    for job_id in (4, 5):
        mine, older = log_parts(parts, files, job_id)[::-1]
        assert (mine.path.name, mine.stderr.name) == (f"slurmhet-4-88.member-{job_id}.out",  # type: ignore[union-attr]
                                                      f"slurmhet-4-88.member-{job_id}.err")
        assert (older.path.name, older.stderr.name) == ("slurmhet-4-89.out", "slurmhet-4-89.err")  # type: ignore[union-attr]
    assert [p.path.name for p in log_parts(parts, files)] == ["slurmhet-4-89.out", "slurmhet-4-88.out"]  # no job: the pack's
    assert [p.path.name for p in log_parts(parts, files, 6)] == ["slurmhet-4-89.out", "slurmhet-4-88.out"]  # not a member


def test_each_part_pairs_its_stdout_with_its_stderr_file() -> None:
    parts = [PartInfo("77", "batch", at(0), "COMPLETED", "t4", 1, "nodeb"),
             PartInfo("88", "batch", at(1), "FAILED", "t4", 1, "nodeb"),
             PartInfo("90", "sweep", at(2), "RUNNING", "t4", 1, "nodeb", array_task=3)]
    files = FILES + [Path("/l/submitit/77_0_log.err"), Path("/l/slurmhet-4-88.err"), Path("/l/slurmhet-3-90_3.err"),
                     Path("/l/slurmhet-3-90_3.out"), Path("/l/slurmhet-3-90_2.err")]
    found = {p.slurm_id: p for p in log_parts(parts, files)}
    assert sorted(found) == ["77", "88", "90_3"]  # 90_2 is another variant's task
    assert (found["77"].path.name, found["77"].stderr.name) == ("77_0_log.out", "77_0_log.err")  # type: ignore[union-attr]
    # A part whose stdout file is not there yet is listed by its stderr; its stdout path is where it will be.
    assert (found["88"].path.name, found["88"].stderr.name) == ("slurmhet-4-88.out", "slurmhet-4-88.err")  # type: ignore[union-attr]
    assert found["90_3"].stderr == Path("/l/slurmhet-3-90_3.err")
    old = log_parts([PartInfo("10", "batch", at(0), "COMPLETED", "v100", 2, "nodea")], FILES)
    assert old[0].stderr is None  # submitted before the streams were split: one merged .out


def test_tail_reads_only_what_was_added(tmp_path: Path) -> None:
    path = tmp_path / "slurmhet-1-2.out"
    tail = Tail()
    assert tail.read_new(path) == b"" and tail.seen(path)  # not written yet
    path.write_text("one\n")
    assert tail.read_new(path) == b"one\n"
    with path.open("a") as handle:
        handle.write("two\n")
    assert tail.read_new(path) == b"two\n" and tail.read_new(path) == b""


def test_job_detail_says_what_was_asked_planned_measured_and_where_output_is() -> None:
    spec = load_text("name: r\ncommand: [python, t.py]\nworkload: {model: ResNet-18, batch_size: 64}\n"
                     "work: {steps: 100}\ngpus: {min: 1, max: 2, types: [v100, t4]}\n", "r.yaml")[0]
    part = SimpleNamespace(id=1, slurm_job_id="30", role="het", round=0, array_task=None, het_offset=0,
                           gpu_type="v100", gpu_count=2, nodes="nodea", state="COMPLETED", reason="",
                           exit_code="0:0", submitted_at=at(1), started_at=at(2), ended_at=at(12),
                           argv=["sbatch", "--dependency=afterok:29"], target="30", restarts=1)
    job = SimpleNamespace(id=5, name="r", owner="alice", state=JobState.COMPLETED, reason="", source="r.yaml",
                          attempts=1, plan={"policy": "slurmhet", "slots": [["nodea", "v100", 2]], "start_s": 0.0,
                                            "priors": ["t4"], "shard_weights": [0.5, 0.5]},
                          predicted_jct_s=600.0, created_at=at(0), started_at=at(2), ended_at=at(12),
                          slurm_jobs=[part])
    events = [SimpleNamespace(at=at(0), kind="stored", message="stored from r.yaml")]
    speeds = {"v100": ThroughputEntry(1500.0, "measured", "Gavel v100"),
              "t4": ThroughputEntry(640.0, "prior", "prior: catalog t4/v100")}
    detail = job_detail(job, spec, events, log_parts(PARTS[6:7], FILES), speeds, {})
    assert detail["restarts"] == 1  # Slurm requeued its run once (preempted, say)
    assert detail["times"]["actual_jct_s"] == 720.0 and detail["plan"]["throughput_priors"] == ["t4"]
    assert detail["throughput"]["t4"]["source"] == "prior" and detail["logs"][0]["path"] == "/l/slurmhet-5-30.out"
    text = "\n".join(detail_lines(detail))
    assert "speed on t4: 640.0 samples/s [PRIOR] prior: catalog t4/v100" in text
    assert "JCT 720 s; restarted 1 time(s)" in text
    assert "plan: nodea:v100x2 (slurmhet)" in text and "predicted JCT 600 s" in text
    assert "Slurm 30+0 [het] 2xv100 on nodea: COMPLETED, exit 0:0, starts after afterok:29" in text and "log: /l/slurmhet-5-30.out" in text


def test_follow_names_a_part_started_after_the_first_sync_as_started(tmp_path: Path, monkeypatch) -> None:
    """The race CI met on Slurm 26.05: the first sync reads PENDING, the job starts and writes its file at
    once; the part's header must still name its nodes and RUNNING, read by a sync after the file appeared."""
    from click.testing import CliRunner

    from slurmhet.cli import jobs as cli_jobs
    from slurmhet.cli import main

    logs = tmp_path / "logs"
    logs.mkdir()
    out = logs / "slurmhet-7-62.out"

    def job(state: JobState, part_state: str, nodes: str) -> SimpleNamespace:
        part = SimpleNamespace(slurm_job_id="62", role="het", submitted_at=at(0), state=part_state, gpu_type="v100",
                               gpu_count=4, nodes=nodes, array_task=None, het_offset=0, round=0)
        return SimpleNamespace(id=7, state=state, reason="", slurm_jobs=[part])

    syncs = [job(JobState.SUBMITTED, "PENDING", ""), job(JobState.RUNNING, "RUNNING", "nodea"),
             job(JobState.COMPLETED, "COMPLETED", "nodea")]

    def refresh(_obj: object, _job_id: int) -> SimpleNamespace:
        answer = syncs.pop(0)
        if answer.state is JobState.SUBMITTED:
            out.write_text("start\n")  # the job starts right after squeue said PENDING
        else:
            out.write_text("start\nend\n")
        return answer

    monkeypatch.setattr(cli_jobs, "_refresh", refresh)
    clock = [0.0]  # `--follow` waits a second between reads and syncs every 5 s: a clock the waits advance
    monkeypatch.setattr("time.sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    monkeypatch.setenv("SLURMHET_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(main, ["logs", "--follow", "7"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == ["==> part 1: Slurm job 62 (het; 4xv100 on nodea; RUNNING) <==", "start",
                                          "end", "==> job 7 COMPLETED <=="]
    assert not syncs
