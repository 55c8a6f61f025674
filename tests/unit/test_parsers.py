"""Pure parsers on outputs recorded from the dev cluster of each Slurm series (tests/fixtures/slurm-*)."""

from __future__ import annotations

import json

import pytest

from slurmhet.slurm import parsers
from slurmhet.slurm.parsers import SlurmOutputError
from tests.unit.recorded import Recorded



def test_node_inventory_from_scontrol(rec: Recorded) -> None:
    nodes = {n.name: n for n in parsers.parse_scontrol_nodes(rec.read("scontrol_show_nodes_oneliner_busy.txt"))}
    assert {k: dict(v.gpus) for k, v in nodes.items()} == {"nodea": {"v100": 4}, "nodeb": {"t4": 4}, "nodec": {"k80": 2}}
    assert nodes["nodea"].mps == 400 and nodes["nodeb"].shards == 8
    assert nodes["nodea"].features == ("v100", "volta") and nodes["nodea"].cpus == 4
    assert nodes["nodeb"].state == "allocated" and nodes["nodeb"].available


def test_gres_strings() -> None:
    assert parsers.parse_gres("gpu:v100:2(IDX:0,2),mps:v100:400(S:0)") == [
        parsers.GresEntry("gpu", "v100", 2), parsers.GresEntry("mps", "v100", 400)]
    assert parsers.parse_gres("gpu:4,shard:8") == [parsers.GresEntry("gpu", None, 4), parsers.GresEntry("shard", None, 8)]
    assert parsers.parse_gres("(null)") == []
    with pytest.raises(SlurmOutputError):
        parsers.parse_gres("gpu:v100:x")


def test_sbatch_parsable(rec: Recorded) -> None:
    assert parsers.parse_sbatch_parsable(rec.read("sbatch_parsable_het.txt")) == str(rec.ids["het"])
    assert parsers.parse_sbatch_parsable("123;cluster\n") == "123"
    with pytest.raises(SlurmOutputError):
        parsers.parse_sbatch_parsable("Submitted batch job 12")


@pytest.mark.parametrize(("text", "expected"), [
    ("12", parsers.SlurmJobId("12")),
    ("9+1", parsers.SlurmJobId("9", het_offset=1)),
    ("9+0.batch", parsers.SlurmJobId("9", het_offset=0, step="batch")),
    ("11_3", parsers.SlurmJobId("11", array_task=3)),
    ("11_[2-5%2]", parsers.SlurmJobId("11", array_pending="[2-5%2]")),
    ("11_3.0", parsers.SlurmJobId("11", array_task=3, step="0")),
    ("5.extern", parsers.SlurmJobId("5", step="extern")),
])
def test_job_ids(text: str, expected: parsers.SlurmJobId) -> None:
    assert parsers.parse_job_id(text) == expected


def test_sacct_with_steps_het_and_arrays(rec: Recorded) -> None:
    records = parsers.parse_sacct_parsable(rec.read("sacct_parsable2_steps.txt"))
    by_id = {(r.id.job, r.id.het_offset, r.id.array_task, r.id.step): r for r in records}
    het = str(rec.ids["het"])
    assert by_id[(het, 0, None, None)].gpus_by_type() == {"t4": 1}
    assert by_id[(het, 1, None, None)].gpus_by_type() == {"v100": 1}
    assert by_id[(het, 1, None, None)].raw_id == str(rec.ids["het"] + 1)
    assert by_id[(het, 0, None, "batch")].id.is_step
    cancelled = by_id[(str(rec.ids["running_then_cancelled"]), None, None, None)]
    assert cancelled.state == "CANCELLED" and cancelled.gpus_by_type() == {"k80": 2}
    assert cancelled.comment == "slurmhet:fx-running"
    assert cancelled.end and cancelled.start and cancelled.elapsed_s == (cancelled.end - cancelled.start).total_seconds()
    assert by_id[(str(rec.ids["failed"]), None, None, None)].exit_code == "3:0"
    assert by_id[(str(rec.ids["timeout"]), None, None, None)].state == "TIMEOUT"
    pending = by_id[(str(rec.ids["pending_then_cancelled"]), None, None, None)]
    assert pending.start is None and pending.nodes == "None assigned"
    tasks = sorted(r.id.array_task for r in records if r.id.job == str(rec.ids["array"]) and not r.id.is_step)
    assert tasks == [0, 1, 2, 3]
    assert {r.id.step for r in records if r.id.job == str(rec.ids["steps"])} == {None, "batch", "extern", "0", "1"}
    assert by_id[(str(rec.ids["mps"]), None, None, None)].alloc_tres["gres/mps"] == 100


def test_sacct_bad_lines_are_reported(rec: Recorded) -> None:
    with pytest.raises(SlurmOutputError, match="sacct line 1: 2 fields"):
        parsers.parse_sacct_parsable("1|2\n")
    header = rec.read("sacct_parsable2_X_header.txt").splitlines()[0]
    assert header.split("|") == list(parsers.SACCT_FIELDS)


def test_squeue_json_het_array_pending(rec: Recorded) -> None:
    records = parsers.parse_squeue_json(rec.read("squeue_mixed.json"))
    by_job = {r.job_id: r for r in records}
    het_leader, het_member = by_job[str(rec.ids["het"])], by_job[str(rec.ids["het"] + 1)]
    assert (het_leader.het_offset, het_member.het_offset) == (0, 1)
    assert het_member.root_id == str(rec.ids["het"]) and het_member.state == "RUNNING"
    array_tasks = [r for r in records if r.array_job_id == str(rec.ids["array"])]
    assert {r.array_task for r in array_tasks} >= {0, 1} and all(r.root_id == str(rec.ids["array"]) for r in array_tasks)
    assert by_job[str(rec.ids["pending_then_cancelled"])].state == "PENDING"
    with pytest.raises(SlurmOutputError):
        parsers.parse_squeue_json("{not json")
    # Recorded with slurmctld unreachable. 22.05 and 24.11: squeue exits 0 and reports the failure inside the
    # JSON; 26.05: it exits 1 with the error on stderr (the runner's SlurmCommandError carries it).
    down = rec.read("squeue_json_controller_down.json")
    if (rec.path / "squeue_json_controller_down.rc.txt").is_file():
        assert rec.read("squeue_json_controller_down.rc.txt").strip() == "1" and not down
        assert "Unable to contact slurm controller" in rec.read("squeue_json_controller_down.stderr.txt")
    else:
        with pytest.raises(SlurmOutputError, match="Failed while looking for jobs|Unable to contact"):
            parsers.parse_squeue_json(down)


def test_config_version_and_times(rec: Recorded) -> None:
    config = parsers.parse_scontrol_config(rec.read("scontrol_show_config.txt"))
    assert config["MaxArraySize"] == "1001" and config["SelectType"] == "select/cons_tres"
    assert parsers.parse_version(rec.read("sinfo_version.txt"))[:2] == rec.version  # e.g. (22, 5, 8) for 22.05
    assert parsers.parse_elapsed("1-02:03:04") == 93784 and parsers.parse_elapsed("05:06") == 306
    assert parsers.parse_tres("cpu=1,mem=2G,gres/gpu:t4=2") == {"cpu": 1.0, "mem": 2048.0, "gres/gpu:t4": 2.0}
    with pytest.raises(SlurmOutputError):
        parsers.parse_slurm_time("yesterday")


# --------------------------------------------------------------------------- squeue: the open world

def foreign_queue(rec: Recorded) -> dict[str, parsers.QueueRecord]:
    return {r.job_id: r for r in parsers.parse_squeue_json(rec.read("squeue_json_foreign.json"))}


def test_squeue_reads_what_a_foreign_job_holds(rec: Recorded) -> None:
    foreign = foreign_queue(rec)[str(rec.ow_ids["foreign"])]
    assert foreign.user == "slurmhet-test" and foreign.state == "RUNNING"
    assert foreign.partition == "v100" and foreign.account == "slurmhet" and foreign.qos == "normal"
    assert foreign.gpus == (("nodea", "v100", 4),) and foreign.gpu_request == (("v100", 4),)
    assert foreign.time_limit_s == 600 and foreign.priority > 0 and foreign.start is not None


def test_squeue_splits_a_two_node_job_per_node(rec: Recorded) -> None:
    two = foreign_queue(rec)[str(rec.ow_ids["two_node"])]
    assert two.nodes == "nodeb,nodec"
    assert two.gpus == (("nodeb", "t4", 1), ("nodec", "k80", 1))
    assert two.gpu_request == ((None, 2),)  # --gres=gpu:1 on each of 2 nodes


def test_squeue_reads_pending_requests_typed_and_untyped(rec: Recorded) -> None:
    queue = foreign_queue(rec)
    behind, waiting = queue[str(rec.ow_ids["behind"])], queue[str(rec.ow_ids["waiting"])]
    assert behind.state == "PENDING" and behind.gpus == () and behind.gpu_request == (("v100", 4),)
    assert behind.start is not None  # Slurm's expected start
    assert waiting.reason == "Dependency" and waiting.gpu_request == ((None, 2),)  # --gpus=2: tres_per_job
    assert waiting.time_limit_s == 300
    # Eligible since submission; a job waiting on a dependency is not eligible yet (Slurm's begin time 0).
    assert behind.eligible is not None and behind.submit is not None and behind.eligible >= behind.submit
    assert waiting.eligible is None


def test_squeue_reads_the_reservation_a_job_names(rec: Recorded) -> None:
    """Every recorded version prints ``resv_name`` ("" for none); a job in a reservation is ranked first by
    Slurm and runs only on its nodes (slurm/world.py)."""
    data = json.loads(rec.read("squeue_json_foreign.json"))
    assert all(job["resv_name"] == "" for job in data["jobs"])
    assert {r.reservation for r in parsers.parse_squeue_json(json.dumps(data))} == {""}
    data["jobs"][0]["resv_name"] = "maint"
    assert parsers.parse_squeue_json(json.dumps(data))[0].reservation == "maint"


def test_squeue_gpu_fallbacks_and_later_formats() -> None:
    job = {"job_id": {"set": True, "infinite": False, "number": 5}, "job_state": ["RUNNING"], "nodes": "nodeb",
           "gres_detail": [], "tres_alloc_str": "cpu=1,gres/gpu=3,gres/gpu:t4=2",
           "time_limit": {"set": True, "infinite": True, "number": 0},
           "priority": {"set": True, "infinite": False, "number": 7}, "tres_per_node": "",
           "tres_per_job": "", "tres_req_str": "gres/gpu=3,gres/gpu:t4=2"}
    (record,) = parsers.parse_squeue_json(json.dumps({"jobs": [job]}))
    assert record.gpus == (("nodeb", "t4", 2), ("nodeb", "gpu", 1)) and record.priority == 7
    assert record.time_limit_s is None and record.gpu_request == (("t4", 2), (None, 1))
    job.update(tres_per_node="gres/gpu:v100=2", node_count=3, time_limit=0)
    (record,) = parsers.parse_squeue_json(json.dumps({"jobs": [job]}))
    assert record.gpu_request == (("v100", 6),) and record.time_limit_s is None


@pytest.mark.parametrize(("value", "expected"), [
    (768, "3:0"),  # 22.05: a wait status, exit 3
    (15, "0:15"),  # killed by SIGTERM
    ({"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 3},
      "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}, "3:0"),  # 23.02 on
    ({"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
      "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}, "0:9"),
    (None, ""),
])
def test_squeue_exit_codes_read_as_sacct_prints_them(value: object, expected: str) -> None:
    (record,) = parsers.parse_squeue_json(json.dumps({"jobs": [{"job_id": 5, "job_state": "FAILED",
                                                                "exit_code": value}]}))
    assert record.exit_code == expected


@pytest.mark.parametrize("change", [
    {"gres_detail": ["gpu:t4:1(IDX:0)"]},  # one entry for two nodes
    {"gres_detail": ["gpu:t4:x", "gpu:k80:1"]},
    {"nodes": "node[b"},
    {"tres_per_node": "gres:gpu:t4:many", "job_state": "PENDING"},
    {"tres_req_str": "gres/gpu=two", "tres_per_node": "", "job_state": "PENDING"},
])
def test_bad_squeue_json_names_the_command(change: dict[str, object]) -> None:
    job = {"job_id": 5, "job_state": "RUNNING", "nodes": "nodeb,nodec", "gres_detail": ["gpu:t4:1", "gpu:k80:1"],
           "tres_per_node": "gres:gpu:1", "node_count": 2, **change}
    with pytest.raises(SlurmOutputError, match="squeue --json"):
        parsers.parse_squeue_json(json.dumps({"jobs": [job]}))


def test_a_stopping_job_tells_a_cancel_from_a_preemption_from_a_signal(rec: Recorded) -> None:
    """runtime/checkpoint requeues on these: a job Slurm is ending must never requeue itself."""
    running = parsers.parse_scontrol_job_stopping(rec.read("scontrol_show_job_stop_running.txt"))
    assert (running.states, running.preempt_time, running.ending, running.preempted) == (("RUNNING",), None, False,
                                                                                           False)
    preempted = parsers.parse_scontrol_job_stopping(rec.read("scontrol_show_job_stop_preempted.txt"))
    assert preempted.states == ("RUNNING",) and preempted.preempt_time is not None
    assert preempted.preempted and not preempted.ending
    cancelled = parsers.parse_scontrol_job_stopping(rec.read("scontrol_show_job_stop_cancelled.txt"))
    assert cancelled.states == ("COMPLETING",) and cancelled.ending and not cancelled.preempted


def test_a_preemption_with_no_grace_tells_whether_slurm_requeued_the_job(rec: Recorded) -> None:
    """A preemption ends the run (COMPLETING): under PreemptMode=CANCEL Slurm has not requeued the job (PreemptTime
    set, Restarts 0, the run's own count) and the job may requeue itself; under REQUEUE Slurm already has."""
    cancel = parsers.parse_scontrol_job_stopping(rec.read("scontrol_show_job_stop_preempt_cancel.txt"))
    assert cancel.states == ("COMPLETING",) and cancel.ending and cancel.preempted, cancel
    assert cancel.restarts == 0 and not cancel.requeued_since(0)
    requeue = parsers.parse_scontrol_job_stopping(rec.read("scontrol_show_job_stop_preempt_requeue.txt"))
    assert requeue.ending and requeue.restarts == 1 and requeue.requeued_since(0), requeue
    assert not requeue.requeued_since(1)  # the run after that requeue asking the same


def _victim(rec: Recorded, name: str) -> parsers.QueueRecord:
    """The preempted job of a recording (22.05's ``squeue --json --jobs`` lists every job)."""
    job_name = "fx-preempt-" + name.split("_")[3]
    (record,) = [r for r in parsers.parse_squeue_json(rec.read(name)) if r.name == job_name]
    return record


def test_a_preempted_job_is_completing_until_its_end_is_final(rec: Recorded) -> None:
    """24.11 and 26.05 list [PREEMPTED, COMPLETING] while a job a PreemptMode=CANCEL preemption ends may still
    requeue itself, and [PENDING, COMPLETING] once Slurm requeued it; 22.05 says COMPLETING for both. Read as a
    final PREEMPTED, the first would have the job re-planned while it requeues itself: two runs."""
    for name in ("squeue_json_preempt_cancel_completing.json", "squeue_json_preempt_requeue_completing.json"):
        record = _victim(rec, name)
        assert record.state == "COMPLETING" and record.gpus, (name, record)  # it still holds both k80s
    assert _victim(rec, "squeue_json_preempt_cancel_final.json").state == "PREEMPTED"
    assert _victim(rec, "squeue_json_preempt_requeue_final.json").state == "PENDING"


def test_a_stopping_het_job_is_ending_when_any_component_is() -> None:
    from tests.unit.recorded import FIXTURES
    text = (FIXTURES / "slurm-22.05" / "scontrol_show_job_het_oneliner.txt").read_text()
    het = parsers.parse_scontrol_job_stopping(text)
    assert het.states == ("RUNNING", "RUNNING") and not het.ending
    first, second = text.splitlines()
    assert parsers.parse_scontrol_job_stopping(f"{first}\n{second.replace('JobState=RUNNING', 'JobState=COMPLETING')}").ending


@pytest.mark.parametrize("text", ["", "slurm_load_jobs error: Invalid job id specified\n", "JobId=5 Name=x\n"])
def test_a_stopping_job_without_a_state_is_refused(text: str) -> None:
    with pytest.raises(SlurmOutputError, match="cannot read JobState"):
        parsers.parse_scontrol_job_stopping(text)
