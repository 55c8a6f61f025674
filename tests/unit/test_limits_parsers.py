"""Parsers of a shared cluster's limits (slurmhet/slurm/limits.py) on outputs recorded from each series' dev cluster."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Mapping, Sequence

import pytest

from slurmhet.slurm import limits
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.parsers import SlurmOutputError, parse_scontrol_config
from slurmhet.slurm.runner import CommandResult, SlurmCommandError
from tests.unit.recorded import Recorded

# --------------------------------------------------------------------------- partitions


def test_partitions_of_the_dev_cluster_and_a_private_one(rec: Recorded) -> None:
    parts = {p.name: p for p in limits.parse_partitions(rec.read("scontrol_show_partition_oneliner.txt"))}
    assert {"gpu", "v100", "t4", "k80", "fx-private"} <= set(parts)
    gpu = parts["gpu"]
    assert gpu.nodes == ("nodea", "nodeb", "nodec") and gpu.default and gpu.state == "UP"
    assert gpu.max_time_s is None and gpu.allow_accounts is None and gpu.allow_qos is None
    assert all(p.qos is None for p in parts.values())  # QoS=N/A: no partition QOS on the dev cluster
    assert gpu.usable_by("root", "slurmhet", "normal", ()) is None
    private = parts["fx-private"]
    assert private.nodes == ("nodec",) and not private.default and private.priority_tier == 2
    assert private.max_time_s == 36 * 3600  # MaxTime=1-12:00:00
    assert private.allow_accounts == ("fx-nobody",) and private.deny_qos == ("gpu2",) and private.allow_qos is None
    why = private.usable_by("root", "slurmhet", "normal", ())
    assert why is not None and "AllowAccounts=fx-nobody" in why and "slurmhet" in why
    assert private.usable_by("root", "fx-nobody", "normal", ()) is None
    assert "DenyQos=gpu2" in (private.usable_by("u", "fx-nobody", "gpu2", ()) or "")


def test_partition_groups_qos_and_root_only_rules() -> None:
    line = ("PartitionName=ml AllowGroups=ml,ops AllowAccounts=ALL AllowQos=high Default=NO MaxTime=90 "
            "Nodes=node[01-03] PriorityTier=3 RootOnly=NO State=DRAIN")
    (part,) = limits.parse_partitions(line)
    assert part.nodes == ("node01", "node02", "node03") and part.max_time_s == 90 * 60 and part.state == "DRAIN"
    assert "AllowGroups=ml,ops" in (part.usable_by("bob", "a", "high", ("users",)) or "")
    assert part.usable_by("bob", "a", "high", ("ops",)) is None
    assert part.usable_by("root", "a", "high", ()) is None  # root passes AllowGroups
    assert "AllowQos=high" in (part.usable_by("bob", "a", "normal", ("ml",)) or "")
    (root_only,) = limits.parse_partitions(line.replace("RootOnly=NO", "RootOnly=YES"))
    assert "RootOnly" in (root_only.usable_by("bob", "a", "high", ("ml",)) or "")
    assert part.qos is None
    (with_qos,) = limits.parse_partitions(line + " QoS=part-limits")
    assert with_qos.qos == "part-limits"


@pytest.mark.parametrize(("text", "seconds"), [
    ("UNLIMITED", None), ("30", 1800.0), ("05:30", 330.0), ("02:00:00", 7200.0),
    ("2-00", 2 * 86400.0), ("1-02:30", 86400.0 + 9000.0), ("1-00:00:01", 86401.0),
])
def test_slurm_time_limits(text: str, seconds: float | None) -> None:
    assert limits.parse_time_limit(text, "cmd", "MaxTime", "partition p") == seconds


@pytest.mark.parametrize("line", [
    "PartitionName=v100 AllowGroups=ALL Default=NO MaxTime=x Nodes=nodea State=UP",  # garbage time
    "PartitionName=v100 AllowGroups=ALL Default=NO",  # truncated
    "PartitionName=v100 Default=maybe MaxTime=UNLIMITED Nodes=nodea State=UP",
    "PartitionName=v100 Default=NO MaxTime=UNLIMITED Nodes=node[a State=UP",
    "PartitionName=v100 Default=NO MaxTime=UNLIMITED Nodes=nodea PriorityTier=high State=UP",
    "Partition v100 is weird",
])
def test_bad_partition_output_names_the_command(line: str) -> None:
    with pytest.raises(SlurmOutputError, match="scontrol show partition"):
        limits.parse_partitions(line)


def test_bad_max_time_names_the_partition() -> None:
    with pytest.raises(SlurmOutputError, match="cannot read MaxTime 'x' of partition v100"):
        limits.parse_partitions("PartitionName=v100 Default=NO MaxTime=x Nodes=nodea State=UP")


# --------------------------------------------------------------------------- reservations


def test_reservation_for_another_user_and_none(rec: Recorded) -> None:
    assert limits.parse_reservations(rec.read("scontrol_show_reservation_none.txt")) == []
    (res,) = limits.parse_reservations(rec.read("scontrol_show_reservation_oneliner.txt"))
    assert res.name == "fx-maint" and res.nodes == ("nodeb",) and res.state == "ACTIVE"
    assert res.users == ("slurmhet-test",) and res.accounts == () and "SPEC_NODES" in res.flags
    assert res.start.tzinfo == timezone.utc and res.end - res.start == timedelta(hours=1)
    assert res.usable_by("slurmhet-test", {"slurmhet"})
    assert not res.usable_by("root", {"slurmhet", "root"})


def test_reservation_deny_lists_accounts_and_groups() -> None:
    base = "ReservationName=r StartTime=2026-01-01T00:00:00 EndTime=2026-01-01T01:00:00 Nodes=nodea State=INACTIVE"
    (denied,) = limits.parse_reservations(base + " Users=-bob,-eve Accounts=(null)")
    assert denied.usable_by("alice", ()) and not denied.usable_by("bob", ())
    (both,) = limits.parse_reservations(base + " Users=alice Accounts=ml")
    assert both.usable_by("alice", {"ml"}) and not both.usable_by("alice", {"other"})
    (grouped,) = limits.parse_reservations(base + " Users=(null) Groups=ops Accounts=(null)")
    assert not grouped.usable_by("alice", ()) and grouped.usable_by("alice", (), groups={"ops"})


@pytest.mark.parametrize("line", [
    "ReservationName=r StartTime=soon EndTime=2026-01-01T01:00:00 Nodes=nodea State=ACTIVE",  # garbage time
    "ReservationName=r StartTime=2026-01-01T00:00:00",  # truncated
    "ReservationName=r StartTime=2026-01-01T00:00:00 EndTime=Unknown Nodes=nodea State=ACTIVE",
    "garbage",
])
def test_bad_reservation_output_names_the_command(line: str) -> None:
    with pytest.raises(SlurmOutputError, match="scontrol show reservation"):
        limits.parse_reservations(line)


# --------------------------------------------------------------------------- associations, QOS, user


def test_associations_of_root_and_the_capped_user(rec: Recorded) -> None:
    assocs = limits.parse_assocs(rec.read("sacctmgr_show_assoc.txt"))
    by_key = {(a.account, a.user): a for a in assocs}
    assert {("slurmhet", "root"), ("root", "root"), ("capped", "slurmhet-capped")} <= set(by_key)
    capped = by_key[("capped", "slurmhet-capped")]
    assert capped.qos == ("gpu2",) and capped.default_qos == "gpu2" and capped.partition == ""
    assert capped.max_tres == {} and capped.grp_tres == {} and capped.max_jobs is None and capped.max_wall_s is None
    # record.sh sets MinPrioThreshold=500 on slurmhet-capped while it records; root's rows have none.
    assert capped.min_prio_threshold == 500 and by_key[("root", "root")].min_prio_threshold is None


def test_association_limits_when_set() -> None:
    (a,) = limits.parse_assocs("ml|bob|v100|normal,high|normal|gres/gpu=4,cpu=8|gres/gpu=16|10|1-00:00:00|\n")
    assert a.partition == "v100" and a.qos == ("normal", "high")
    assert a.max_tres == {"gres/gpu": 4, "cpu": 8} and a.grp_tres == {"gres/gpu": 16}
    assert a.max_jobs == 10 and a.max_wall_s == 86400


@pytest.mark.parametrize(("text", "message"), [
    ("slurmhet|root||normal", "sacctmgr show assoc: line 1 has 4 fields"),  # truncated
    ("ml|bob||normal|normal|gres/gpu=four||| |\n", "sacctmgr show assoc: cannot read TRES entry 'gres/gpu=four'"),
    ("ml|bob||normal|normal|||ten||", "sacctmgr show assoc: cannot read MaxJobs 'ten' of association ml/bob"),
    ("ml|bob||normal|normal||||soon|", "sacctmgr show assoc: cannot read MaxWall 'soon'"),
    ("ml|bob||normal|normal|||||high", "sacctmgr show assoc: cannot read MinPrioThreshold 'high'"),
])
def test_bad_assoc_output_names_the_command(text: str, message: str) -> None:
    with pytest.raises(SlurmOutputError, match=message):
        limits.parse_assocs(text)


def test_qos_and_the_gpu2_cap(rec: Recorded) -> None:
    qos = {q.name: q for q in limits.parse_qos(rec.read("sacctmgr_show_qos.txt"))}
    assert qos["gpu2"].gpu_cap() == 2 and qos["gpu2"].max_tres_per_user == {"gres/gpu": 2}
    assert qos["normal"].gpu_cap() is None and qos["normal"].priority == 0
    assert qos["normal"].min_prio_threshold is None and qos["normal"].flags == ()
    # record.sh adds QOS fx-scavenger (MinPrioThresh=1000 Flags=OverPartQOS) for the recording only.
    assert qos["fx-scavenger"].min_prio_threshold == 1000 and qos["fx-scavenger"].flags == ("OverPartQOS",)
    (q,) = limits.parse_qos("high|100||gres/gpu=8|gres/gpu=32|5|02:00:00|2000|DenyOnLimit,OverPartQOS\n")
    assert q.priority == 100 and q.max_tres_per_job == {"gres/gpu": 8} and q.grp_tres == {"gres/gpu": 32}
    assert q.max_jobs_per_user == 5 and q.max_wall_s == 7200 and q.gpu_cap() is None
    assert q.min_prio_threshold == 2000 and q.flags == ("DenyOnLimit", "OverPartQOS")


@pytest.mark.parametrize("text", [
    "gpu2|0|gres/gpu=2",  # truncated
    "gpu2|0|gres/gpu=two||||||",  # non-numeric TRES
    "gpu2|high|gres/gpu=2||||||",
    "gpu2|0|gres/gpu=2|||||yesterday||",
    "gpu2|0|gres/gpu=2||||||lots|",
])
def test_bad_qos_output_names_the_command(text: str) -> None:
    with pytest.raises(SlurmOutputError, match="sacctmgr show qos"):
        limits.parse_qos(text)


def test_default_account(rec: Recorded) -> None:
    assert limits.parse_default_account(rec.read("sacctmgr_show_user.txt")) == "capped"
    assert limits.parse_default_account("") == ""
    with pytest.raises(SlurmOutputError, match="sacctmgr show user"):
        limits.parse_default_account("slurmhet-capped")  # truncated
    with pytest.raises(SlurmOutputError, match="sacctmgr show user"):
        limits.parse_default_account("a|x\nb|y\n")


# --------------------------------------------------------------------------- expected starts


def test_pending_starts_behind_a_foreign_job(rec: Recorded) -> None:
    starts = {s.job_id: s for s in limits.parse_pending_starts(rec.read("squeue_start.txt"))}
    behind = starts[str(rec.ow_ids["behind"])]
    assert behind.expected_start is not None and behind.expected_start.tzinfo == timezone.utc
    # squeue --start may word the reason at length ("Nodes required for job are DOWN, ...")
    # where --json says Resources; the recording holds whichever the scheduler wrote.
    assert behind.sched_nodes == ("nodea",)
    assert behind.reason == "Resources" or behind.reason.startswith("Nodes required for job")
    waiting = starts[str(rec.ow_ids["waiting"])]
    assert waiting.expected_start is None and waiting.sched_nodes == () and waiting.reason == "Dependency"
    assert str(rec.ow_ids["foreign"]) not in starts  # running jobs have no expected start


@pytest.mark.parametrize("text", [
    "42|N/A|(null)",  # truncated
    "42|tomorrow|(null)|None",  # garbage time
    "42|2026-01-01T00:00:00|node[a|None",
    "job|N/A|(null)|None",
])
def test_bad_pending_start_output_names_the_command(text: str) -> None:
    with pytest.raises(SlurmOutputError, match="squeue --start"):
        limits.parse_pending_starts(text)


# --------------------------------------------------------------------------- reservations for blocked jobs


def test_the_dev_clusters_config_sets_no_reserve_thresholds(rec: Recorded) -> None:
    config = parse_scontrol_config(rec.read("scontrol_show_config.txt"))
    assert "bf_interval=1" in config["SchedulerParameters"]
    # 22.05's fixture was recorded before the dev cluster enforced limits (AccountingStorageEnforce=associations).
    limited = "limits" in config["AccountingStorageEnforce"]
    assert limited is (rec.series != "22.05")
    assert limits.parse_reserve_rule(config) == limits.ReserveRule(0.0, 0, limited)


@pytest.mark.parametrize(("enforce", "limited"), [
    ("associations", False), ("associations,limits,qos", True), ("associations,limits,safe", True), ("none", False),
])
def test_qos_thresholds_count_only_where_slurm_enforces_limits(enforce: str, limited: bool) -> None:
    rule = limits.parse_reserve_rule({"AccountingStorageEnforce": enforce, "SchedulerParameters": "(null)"})
    assert rule.enforce_limits is limited
    assert rule.reserves(eligible_s=0.0, priority=10, now_s=1.0, threshold=20) is not limited


@pytest.mark.parametrize(("params", "rule"), [
    ("(null)", limits.ReserveRule(0.0, 0)),
    ("bf_continue, bf_min_age_reserve=10800,bf_interval=300", limits.ReserveRule(10800.0, 0)),
    ("bf_min_prio_reserve=2000,bf_min_age_reserve=60", limits.ReserveRule(60.0, 2000)),
    # slurmctld reads these with atoi and ignores a negative value.
    ("bf_min_age_reserve=abc,bf_min_prio_reserve=-5", limits.ReserveRule(0.0, 0)),
])
def test_reserve_thresholds_from_scheduler_parameters(params: str, rule: limits.ReserveRule) -> None:
    assert limits.parse_reserve_rule({"SchedulerParameters": params}) == rule
    assert limits.parse_reserve_rule({}) == limits.ReserveRule()


def test_a_blocked_job_reserves_once_eligible_long_enough_and_of_high_enough_priority() -> None:
    rule = limits.ReserveRule(min_age_s=600, min_priority=100)
    assert rule.reserves(eligible_s=1_000.0, priority=100, now_s=1_600.0)
    assert not rule.reserves(eligible_s=1_000.0, priority=100, now_s=1_599.0)
    assert not rule.reserves(eligible_s=None, priority=100, now_s=1_600.0)
    assert not rule.reserves(eligible_s=1_000.0, priority=99, now_s=9_999.0)
    assert limits.ReserveRule().reserves(eligible_s=None, priority=0, now_s=0.0)
    # A QOS or association MinPrioThreshold replaces bf_min_prio_reserve where limits are enforced.
    enforced = limits.ReserveRule(min_priority=100, enforce_limits=True)
    assert enforced.reserves(eligible_s=None, priority=150, now_s=0.0, threshold=None)
    assert not enforced.reserves(eligible_s=None, priority=150, now_s=0.0, threshold=200)
    assert enforced.reserves(eligible_s=None, priority=50, now_s=0.0, threshold=40)


def _qos(name: str, threshold: int | None, flags: tuple[str, ...] = ()) -> limits.QosRecord:
    return limits.QosRecord(name=name, priority=0, max_tres_per_user={}, max_tres_per_job={}, grp_tres={},
                            max_jobs_per_user=None, max_wall_s=None, min_prio_threshold=threshold, flags=flags)


def test_the_threshold_is_the_first_set_of_partition_qos_job_qos_and_association() -> None:
    """slurmctld's order (``acct_policy_set_qos_order``, ``acct_policy_get_prio_thresh``): the partition's QOS
    before the job's, unless the job's has OverPartQOS; then the association."""
    assoc = limits.AssocRecord(account="ml", user="bob", partition="", qos=("normal",), default_qos="normal",
                               max_tres={}, grp_tres={}, max_jobs=None, max_wall_s=None, min_prio_threshold=300)
    qos = {q.name: q for q in (_qos("job", 100), _qos("part", 200), _qos("over", 150, ("OverPartQOS",)),
                               _qos("unset", None))}
    assert limits.prio_threshold(qos, "job", "part", assoc) == 200
    assert limits.prio_threshold(qos, "over", "part", assoc) == 150
    assert limits.prio_threshold(qos, "job", None, assoc) == 100
    assert limits.prio_threshold(qos, "unset", "unset", assoc) == 300
    assert limits.prio_threshold(qos, "unset", None, None) is None
    assert limits.prio_threshold(qos, "unknown", "part", None) == 200


# --------------------------------------------------------------------------- usage history


def test_usage_history_keeps_finished_gpu_jobs_that_ran(rec: Recorded) -> None:
    usage = limits.parse_usage(rec.read("sacct_usage.txt"))
    # fx-foreign (slurmhet-test, v100, --time=10) and fx-two-node (root, gpu, --time=5) ran and were
    # cancelled; fx-behind and fx-waiting never started, so they say nothing about run lengths.
    by_user = {(u.user, u.partition): u for u in usage}
    foreign = by_user[("slurmhet-test", "v100")]
    assert foreign.limit_s == 600.0 and 0 < foreign.elapsed_s < 600.0
    assert len([u for u in usage if u.partition == "v100" and u.user == "root"]) == 0
    assert all(u.elapsed_s > 0 and u.limit_s > 0 for u in usage)


def test_usage_history_skips_what_says_nothing_about_run_length() -> None:
    text = "\n".join([
        "alice|gpu|COMPLETED|900|60|billing=1,cpu=1,gres/gpu:t4=1,gres/gpu=1,node=1",
        "alice|gpu|RUNNING|100|60|billing=1,cpu=1,gres/gpu=1,node=1",  # still running
        "alice|gpu|CANCELLED by 0|0|60|",  # never started
        "alice|gpu|COMPLETED|100|UNLIMITED|billing=1,cpu=1,gres/gpu=1,node=1",  # no finite limit
        "alice|cpu|COMPLETED|100|60|billing=1,cpu=1,node=1",  # no GPU
        "bob|gpu|TIMEOUT|3630|60|billing=1,cpu=1,gres/gpu=2,node=1",
    ])
    usage = limits.parse_usage(text)
    assert usage == [limits.UsageRecord("alice", "gpu", 900.0, 3600.0),
                     limits.UsageRecord("bob", "gpu", 3630.0, 3600.0)]


@pytest.mark.parametrize("text", [
    "alice|gpu|COMPLETED|900|60",  # truncated
    "alice|gpu|COMPLETED|soon|60|gres/gpu=1",
    "alice|gpu|COMPLETED|900|an hour|gres/gpu=1",
    "alice|gpu|COMPLETED|900|60|gres/gpu=lots",
])
def test_bad_usage_output_names_the_command(text: str) -> None:
    with pytest.raises(SlurmOutputError, match="sacct --allusers -X"):
        limits.parse_usage(text)


# --------------------------------------------------------------------------- the client's commands


class RecordedRunner:
    """Answers each Slurm command with its recorded output, keeping the argv lists it was given."""

    OUTPUTS = {
        ("scontrol", "show", "partition"): "scontrol_show_partition_oneliner.txt",
        ("scontrol", "show", "reservation"): "scontrol_show_reservation_oneliner.txt",
        ("sacctmgr", "-n", "-P", "show", "assoc"): "sacctmgr_show_assoc.txt",
        ("sacctmgr", "-n", "-P", "show", "qos"): "sacctmgr_show_qos.txt",
        ("sacctmgr", "-n", "-P", "show", "user"): "sacctmgr_show_user.txt",
        ("squeue", "--all", "--start"): "squeue_start.txt",
        ("sacct", "--allusers", "-X"): "sacct_usage.txt",
    }

    def __init__(self, rec: Recorded) -> None:
        self.rec = rec
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        self.calls.append(list(argv))
        name = next(v for k, v in self.OUTPUTS.items() if tuple(argv[:len(k)]) == k)
        return CommandResult(tuple(argv), self.rec.read(name), "")


def test_client_reads_the_shared_cluster_through_the_runner(rec: Recorded) -> None:
    runner = RecordedRunner(rec)
    cli = SlurmCli(runner)
    assert "fx-private" in {p.name for p in cli.partitions()}
    assert [r.name for r in cli.reservations()] == ["fx-maint"]
    # The recording holds two users' rows (in an order that differs between series).
    assert {(a.user, a.account) for a in cli.associations("slurmhet-capped")} == {
        ("root", "slurmhet"), ("root", "root"), ("slurmhet-capped", "capped")}
    assert cli.default_account("slurmhet-capped") == "capped"
    assert {q.name for q in cli.qos()} == {"normal", "gpu2", "fx-scavenger"}
    assert str(rec.ow_ids["behind"]) in {s.job_id for s in cli.pending_starts()}
    assert runner.calls[2] == ["sacctmgr", "-n", "-P", "show", "assoc", "user=slurmhet-capped",
                               "format=Account,User,Partition,QOS,DefaultQOS,MaxTRES,GrpTRES,MaxJobs,MaxWall,MinPrioThreshold"]
    assert runner.calls[5] == ["squeue", "--all", "--start", "--noheader", "--format=%A|%S|%Y|%r"]
    since = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert cli.usage_history(since)
    assert runner.calls[6][:5] == ["sacct", "--allusers", "-X", "--parsable2", "--noheader"]
    assert runner.calls[6][5:7] == ["--starttime", since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")]


def test_without_accounting_the_sacctmgr_failure_reaches_the_caller(rec: Recorded) -> None:
    class NoAccounting(RecordedRunner):
        def run(self, argv: Sequence[str], **kw: object) -> CommandResult:
            if argv[0] == "sacctmgr":
                raise SlurmCommandError(argv, 1, "", "sacctmgr: error: Problem talking to the database")
            return super().run(argv)

    cli = SlurmCli(NoAccounting(rec))
    with pytest.raises(SlurmCommandError, match="Problem talking to the database"):
        cli.associations("root")
    with pytest.raises(SlurmCommandError):
        cli.qos()
    assert cli.partitions()
