"""From what Slurm said to the planner's capacity facts (slurmhet/slurm/world.py), on hand-made records."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from slurmhet.cluster import Node
from slurmhet.slurm.limits import (AssocRecord, PartitionRecord, PendingStart, QosRecord, ReservationRecord,
                                   ReserveRule, UsageRecord)
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.world import (
    MIN_HISTORY, SlurmWorld, access_of, gpu_use, is_ours, job_prio_threshold, limit_fractions, open_world,
    tagged_ids,
)

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=timezone.utc)
NOW = T0.timestamp()
NODES = (Node("nodea", {"v100": 4}), Node("nodeb", {"t4": 4}), Node("nodec", {"k80": 2}))
TAG = "store1"


def partition(name: str, nodes: tuple[str, ...], *, default: bool = False, allow_accounts: tuple[str, ...] | None = None,
              state: str = "UP", tier: int = 1) -> PartitionRecord:
    return PartitionRecord(name=name, nodes=nodes, state=state, default=default, max_time_s=None,
                           allow_accounts=allow_accounts, deny_accounts=(), allow_groups=None, allow_qos=None,
                           deny_qos=(), priority_tier=tier, root_only=False)


PARTS = (partition("gpu", ("nodea", "nodeb", "nodec"), default=True), partition("v100", ("nodea",)),
         partition("t4", ("nodeb",)), partition("k80", ("nodec",), allow_accounts=("ml",)))


def qos(name: str, per_user: float | None = None) -> QosRecord:
    return QosRecord(name=name, priority=0, max_tres_per_user={"gres/gpu": per_user} if per_user else {},
                     max_tres_per_job={}, grp_tres={}, max_jobs_per_user=None, max_wall_s=None)


def assoc(account: str, user: str, default_qos: str = "normal", partition: str = "") -> AssocRecord:
    return AssocRecord(account=account, user=user, partition=partition, qos=(default_qos,), default_qos=default_qos,
                       max_tres={}, grp_tres={}, max_jobs=None, max_wall_s=None)


def record(job_id: str, state: str, *, user: str = "alice", comment: str = "", gpus: tuple = (),
           request: tuple = (), start: datetime | None = None, limit_s: float | None = 3600.0,
           reason: str = "None", part: str = "gpu", priority: int = 0, submit: datetime | None = None,
           reservation: str = "", eligible: datetime | None = T0 - timedelta(hours=1)) -> QueueRecord:
    return QueueRecord(job_id=job_id, het_job_id=None, het_offset=None, array_job_id=None, array_task=None,
                       name="x", state=state, reason=reason, comment=comment, user=user, nodes="", start=start,
                       partition=part, time_limit_s=limit_s, gpus=gpus, gpu_request=request, priority=priority,
                       submit=submit, reservation=reservation, eligible=eligible)


def world(queue: tuple = (), **kw: object) -> SlurmWorld:
    base = dict(nodes=NODES, queue=queue, partitions=PARTS, assocs=(assoc("slurmhet", "root"),),
                qos=(qos("normal"), qos("gpu2", 2)), default_account="slurmhet")
    base.update(kw)
    return SlurmWorld(**base)  # type: ignore[arg-type]


def test_access_leaves_out_partitions_the_account_may_not_use_and_the_types_only_they_hold() -> None:
    w = world(partitions=(PARTS[1], PARTS[2], PARTS[3]))
    access = access_of(w, "root", ())
    assert access.partitions == ("v100", "t4") and access.types == ("t4", "v100")
    assert "AllowAccounts" in access.refused["k80"]
    assert access.gpu_cap is None


def test_access_takes_the_gpu_cap_of_the_users_default_qos_and_names_it() -> None:
    w = world(assocs=(assoc("capped", "bob", "gpu2"),), default_account="capped")
    access = access_of(w, "bob", ())
    assert access.gpu_cap == 2 and "QOS gpu2" in access.cap_source


def test_without_accounting_every_open_partition_is_usable_and_nothing_is_capped() -> None:
    w = world(assocs=(), qos=(), default_account="", accounting=False,
              partitions=(PARTS[0], partition("down", ("nodea",), state="DOWN")))
    access = access_of(w, "root", ())
    assert access.partitions == ("gpu",) and "DOWN" in access.refused["down"] and access.gpu_cap is None


def test_a_type_goes_to_its_own_partition_before_the_default_one() -> None:
    w = world()
    access = access_of(w, "root", ())
    assert access.partition_for("v100", w) == "v100"
    w = world(partitions=(PARTS[0],))
    assert access_of(w, "root", ()).partition_for("t4", w) == "gpu"


def test_a_running_foreign_job_holds_its_gpus_until_start_plus_time_limit() -> None:
    started = T0 - timedelta(minutes=10)
    w = world((record("7", "RUNNING", gpus=(("nodea", "v100", 4),), start=started),
               record("8", "RUNNING", comment=f"slurmhet:3@{TAG}", gpus=(("nodeb", "t4", 1),), start=started)))
    facts = open_world(w, TAG, access_of(w, "root", ()), NOW)
    (hold,) = facts.holds  # our own job is not a hold: the store pins it
    assert (hold.node, hold.gpu_type, hold.count, hold.kind) == ("nodea", "v100", 4, "job")
    assert hold.end_s == pytest.approx(started.timestamp() + 3600) and not hold.estimated
    assert "job 7 (alice" in hold.owner


def test_history_shortens_a_foreign_jobs_expected_end_as_a_labelled_estimate() -> None:
    started = T0 - timedelta(minutes=10)
    history = tuple(UsageRecord("alice", "gpu", 900.0, 3600.0) for _ in range(MIN_HISTORY))
    w = world((record("7", "RUNNING", gpus=(("nodea", "v100", 4),), start=started),), history=history)
    (hold,) = open_world(w, TAG, access_of(w, "root", ()), NOW).holds
    assert hold.estimated and hold.end_s == pytest.approx(started.timestamp() + 900)
    # Past its estimate, a job is expected to end within a minute, never after its limit.
    late = T0 - timedelta(minutes=59, seconds=30)
    w = world((record("7", "RUNNING", gpus=(("nodea", "v100", 4),), start=late),), history=history)
    (hold,) = open_world(w, TAG, access_of(w, "root", ()), NOW).holds
    assert hold.end_s == pytest.approx(late.timestamp() + 3600)
    assert limit_fractions(history[:-1]) == {}


def test_pending_foreign_jobs_queue_ahead_where_slurm_slated_them_or_first_in_line() -> None:
    w = world((record("9", "PENDING", request=(("v100", 2),), reason="Resources"),
               record("10", "PENDING", request=((None, 1),), reason="Priority", part="t4"),
               record("11", "PENDING", request=(("v100", 1),), reason="Dependency")),
              starts={"9": PendingStart("9", T0 + timedelta(minutes=5), ("nodea",), "Resources")})
    facts = open_world(w, TAG, access_of(w, "root", ()), NOW)
    (slated,) = facts.holds
    assert (slated.node, slated.gpu_type, slated.count, slated.kind) == ("nodea", "v100", 2, "pending")
    assert slated.start_s == pytest.approx(NOW + 300) and slated.end_s == pytest.approx(NOW + 300 + 3600)
    (ahead,) = facts.ahead  # job 11 waits for its dependency: it takes nothing
    assert ahead.gpu_types == ("t4",) and ahead.count == 1 and ahead.duration_s == pytest.approx(3600)


def test_a_foreign_pending_job_slurm_ranks_below_our_queued_job_on_its_slots_goes_after_it() -> None:
    ours = record("20", "PENDING", user="root", comment=f"slurmhet:7@{TAG}", request=(("v100", 4),),
                  reason="Resources", part="v100", priority=5_000, submit=T0)
    later, earlier = T0 + timedelta(seconds=30), T0 - timedelta(seconds=30)
    others = (record("21", "PENDING", request=(("v100", 2),), reason="Priority", part="v100", priority=4_000),
              record("22", "PENDING", request=(("v100", 2),), reason="Priority", part="v100", priority=6_000),
              record("23", "PENDING", request=((None, 2),), reason="Priority", part="gpu", priority=4_000),
              record("24", "PENDING", request=(("v100", 2),), reason="Priority", part="gpu", priority=4_000),
              record("25", "PENDING", request=(("v100", 1),), reason="Priority", part="v100", priority=5_000,
                     submit=later),
              record("26", "PENDING", request=(("v100", 1),), reason="Priority", part="v100", priority=5_000,
                     submit=earlier),
              record("27", "PENDING", request=(("v100", 1),), reason="Priority", part="urgent", priority=1_000),
              record("28", "PENDING", request=(("v100", 1),), reason="Priority", part="v100", priority=1_000,
                     reservation="open"))
    magnetic = ReservationRecord(name="open", nodes=("nodea",), start=T0 + timedelta(hours=5),
                                 end=T0 + timedelta(hours=6), users=("root", "alice"), accounts=(), flags=("MAGNETIC",),
                                 state="INACTIVE")
    w = world((ours, *others), partitions=(*PARTS, partition("urgent", ("nodea", "nodeb"), tier=2)),
              reservations=(magnetic,))
    facts = open_world(w, TAG, access_of(w, "root", ()), NOW)
    after = {a.owner.split()[1]: a.after for a in facts.ahead}
    # 21: lower priority, on our job's partition and type: Slurm starts it after ours; so 25, of equal priority
    # but submitted later, and 24, of lower priority in partition gpu, whose only v100s are those ours waits for.
    # 22: higher priority; 23: may take any type of partition gpu, so a slot ours does not wait for; 26: equal
    # priority, submitted earlier; 27: a partition of a higher PriorityTier; 28: in a reservation: all ahead.
    assert after == {"21": ("7",), "22": (), "23": (), "24": ("7",), "25": ("7",), "26": (), "27": (), "28": ()}
    # Another store's job, or one of ours Slurm already started or holds, outranks nothing.
    for mine in (record("20", "PENDING", user="root", comment="slurmhet:7@other", request=(("v100", 4),),
                        reason="Resources", part="v100", priority=5_000),
                 record("20", "PENDING", user="root", comment=f"slurmhet:7@{TAG}", request=(("v100", 4),),
                        reason="Dependency", part="v100", priority=5_000)):
        w = world((mine, others[0]))
        ahead = open_world(w, TAG, access_of(w, "root", ()), NOW).ahead
        assert [a.after for a in ahead if a.owner.startswith("job 21 ")] == [()]


def test_our_queued_job_in_a_higher_priority_tier_goes_before_a_foreign_job_of_higher_priority() -> None:
    ours = record("30", "PENDING", user="root", comment=f"slurmhet:9@{TAG}", request=(("t4", 2),),
                  reason="Resources", part="urgent", priority=10)
    theirs = record("31", "PENDING", request=(("t4", 1),), reason="Priority", part="t4", priority=9_000)
    parts = (*PARTS, partition("urgent", ("nodea", "nodeb"), tier=2))
    w = world((ours, theirs), partitions=parts)
    (ahead,) = open_world(w, TAG, access_of(w, "root", ()), NOW).ahead
    assert ahead.after == ("9",)
    # The same job in a partition reaching a node ours cannot use (nodec's k80s are not ours to wait for) with
    # an untyped request: Slurm could start it there first.
    anywhere = record("31", "PENDING", request=((None, 1),), reason="Priority", part="gpu", priority=9_000)
    w = world((ours, anywhere), partitions=parts)
    (ahead,) = open_world(w, TAG, access_of(w, "root", ()), NOW).ahead
    assert ahead.after == () and ahead.gpu_types == ("k80", "t4", "v100")


@pytest.mark.parametrize(("rule", "eligible", "goes_after"), [
    (ReserveRule(), T0 - timedelta(seconds=10), True),
    # bf_min_age_reserve=600: eligible 10 s ago (or not yet) holds nothing back; 700 s ago it does.
    (ReserveRule(min_age_s=600), T0 - timedelta(seconds=10), False),
    (ReserveRule(min_age_s=600), None, False),
    (ReserveRule(min_age_s=600), T0 - timedelta(seconds=700), True),
    # bf_min_prio_reserve above our job's priority (5,000): it holds nothing back, however old.
    (ReserveRule(min_priority=6_000), T0 - timedelta(hours=5), False),
    (ReserveRule(min_age_s=600, min_priority=5_000), T0 - timedelta(seconds=700), True),
])
def test_our_blocked_job_holds_back_later_foreign_jobs_only_when_slurm_reserves_for_it(
        rule: ReserveRule, eligible: datetime | None, goes_after: bool) -> None:
    ours = record("20", "PENDING", user="root", comment=f"slurmhet:7@{TAG}", request=(("v100", 4),),
                  reason="Resources", part="v100", priority=5_000, eligible=eligible)
    theirs = record("21", "PENDING", request=(("v100", 2),), reason="Priority", part="v100", priority=4_000)
    w = world((ours, theirs), reserve=rule)
    (ahead,) = open_world(w, TAG, access_of(w, "root", ()), NOW).ahead
    assert ahead.after == (("7",) if goes_after else ())


@pytest.mark.parametrize(("enforced", "qos_threshold", "assoc_threshold", "goes_after"), [
    (True, None, None, True),
    (True, 6_000, None, False),  # our QOS's MinPrioThreshold is above our job's priority (5,000)
    (True, None, 6_000, False),  # so is our association's
    (True, 4_000, 6_000, True),  # the QOS's comes first, and it is below
    (False, 6_000, None, True),  # Slurm does not enforce limits: the thresholds do nothing
])
def test_a_qos_or_association_min_prio_threshold_above_our_jobs_priority_lets_later_jobs_pass(
        enforced: bool, qos_threshold: int | None, assoc_threshold: int | None, goes_after: bool) -> None:
    ours = record("20", "PENDING", user="root", comment=f"slurmhet:7@{TAG}", request=(("v100", 4),),
                  reason="Resources", part="v100", priority=5_000)
    ours = replace(ours, account="slurmhet", qos="normal")
    theirs = record("21", "PENDING", request=(("v100", 2),), reason="Priority", part="v100", priority=4_000)
    w = world((ours, theirs), reserve=ReserveRule(enforce_limits=enforced),
              qos=(replace(qos("normal"), min_prio_threshold=qos_threshold),),
              assocs=(replace(assoc("slurmhet", "root"), min_prio_threshold=assoc_threshold),))
    (ahead,) = open_world(w, TAG, access_of(w, "root", ()), NOW).ahead
    assert ahead.after == (("7",) if goes_after else ())


def test_our_jobs_threshold_comes_from_its_partitions_qos_and_its_partitions_association() -> None:
    ours = replace(record("20", "PENDING", user="root", part="v100"), account="slurmhet", qos="")
    parts = (replace(PARTS[1], qos="part"),)
    w = world((ours,), partitions=parts, qos=(replace(qos("part"), min_prio_threshold=700),))
    assert job_prio_threshold(w, ours) == 700
    w = world((ours,), qos=(qos("normal"),), assocs=(
        replace(assoc("slurmhet", "root"), min_prio_threshold=300),
        replace(assoc("slurmhet", "root", partition="v100"), min_prio_threshold=400)))
    assert job_prio_threshold(w, ours) == 400  # the association of its partition, then the account's
    assert job_prio_threshold(w, replace(ours, partition="t4")) == 300


def test_a_reservation_holds_its_nodes_for_its_span_unless_it_is_magnetic_and_open_to_the_user() -> None:
    res = ReservationRecord(name="maint", nodes=("nodeb",), start=T0 - timedelta(minutes=1),
                            end=T0 + timedelta(hours=1), users=("alice",), accounts=(), flags=(), state="ACTIVE")
    w = world(reservations=(res,))
    (hold,) = open_world(w, TAG, access_of(w, "root", ()), NOW).holds
    assert (hold.node, hold.gpu_type, hold.count, hold.owner) == ("nodeb", "t4", 4, "reservation maint")
    assert hold.end_s == pytest.approx(NOW + 3600)
    # Open to alice, but her slurmhet jobs do not name it, and Slurm starts none of them there (checked on the
    # dev cluster: "ReqNodeNotAvail, May be reserved for other job"): it holds for her too.
    (hold,) = open_world(w, TAG, access_of(w, "alice", ()), NOW).holds
    assert hold.owner == "reservation maint"
    magnetic = replace(res, flags=("MAGNETIC", "SPEC_NODES"))
    w = world(reservations=(magnetic,))
    assert open_world(w, TAG, access_of(w, "alice", ()), NOW).holds == ()
    assert len(open_world(w, TAG, access_of(w, "root", ()), NOW).holds) == 1
    # A foreign job bound to a held reservation starts inside it: it takes nothing outside.
    bound = record("40", "PENDING", request=(("t4", 1),), reason="Resources", part="t4", reservation="maint")
    w = world((bound,), reservations=(res,))
    facts = open_world(w, TAG, access_of(w, "root", ()), NOW)
    assert facts.ahead == () and [h.owner for h in facts.holds] == ["reservation maint"]
    ended = replace(res, start=T0 - timedelta(hours=2), end=T0 - timedelta(hours=1))
    w = world(reservations=(ended,))
    assert open_world(w, TAG, access_of(w, "root", ()), NOW).holds == ()


def test_gpu_use_counts_ours_others_reserved_and_free_per_partition_and_type() -> None:
    res = ReservationRecord(name="maint", nodes=("nodec",), start=T0 - timedelta(minutes=1),
                            end=T0 + timedelta(hours=1), users=("alice",), accounts=(), flags=(), state="ACTIVE")
    w = world((record("7", "RUNNING", gpus=(("nodea", "v100", 3),), start=T0),
               record("8", "RUNNING", comment=f"slurmhet:3@{TAG}", gpus=(("nodea", "v100", 1),), start=T0)),
              reservations=(res,))
    use = {(u.partition, u.gpu_type): u for u in gpu_use(w, TAG, access_of(w, "root", ()), NOW)}
    v100 = use[("v100", "v100")]
    assert (v100.total, v100.slurmhet, v100.others, v100.reserved, v100.free) == (4, 1, 3, 0, 0)
    assert use[("gpu", "k80")].reserved == 2 and use[("gpu", "k80")].free == 0
    assert use[("gpu", "t4")].free == 4


def test_gpu_use_reserves_what_the_planner_may_not_use_each_node_once() -> None:
    """``slurmhet cluster`` shows the reservations as the planner reads them (:func:`held_reservations`)."""
    maint = ReservationRecord(name="maint", nodes=("nodeb",), start=T0 - timedelta(minutes=1),
                              end=T0 + timedelta(hours=1), users=("alice",), accounts=(), flags=(), state="ACTIVE")
    magnetic = replace(maint, name="open", flags=("MAGNETIC",))
    busy = record("7", "RUNNING", gpus=(("nodeb", "t4", 1),), start=T0)

    def reserved(*reservations: ReservationRecord, user: str = "alice") -> int:
        w = world((busy,), reservations=reservations)
        (t4,) = [u for u in gpu_use(w, TAG, access_of(w, user, ()), NOW) if u.partition == "t4"]
        assert t4.total == t4.others + t4.reserved + t4.free
        return t4.reserved

    assert reserved(maint) == 3  # the idle GPUs of its node, for alice too: her jobs do not name it
    assert reserved(magnetic) == 0  # Slurm starts alice's jobs in it unasked
    assert reserved(magnetic, user="root") == 3  # not open to root
    assert reserved(maint, replace(maint, name="maint2")) == 3  # two reservations on one node: its GPUs once
    assert reserved(replace(maint, start=T0 + timedelta(minutes=5))) == 0  # not begun


def test_a_foreign_job_without_a_time_limit_holds_with_no_known_end() -> None:
    w = world((record("7", "RUNNING", gpus=(("nodea", "v100", 4),), start=T0, limit_s=None),))
    (hold,) = open_world(w, TAG, access_of(w, "root", ()), NOW).holds
    assert math.isinf(hold.end_s)


def test_a_comment_is_ours_only_with_this_stores_tag_and_names_its_jobs_as_written() -> None:
    """The one tag check that planning, adoption of orphans (``sync.adopt_orphans``) and the report share."""
    assert is_ours(f"slurmhet:3,4@{TAG}", TAG) and tagged_ids(f"slurmhet:3,4@{TAG}") == ["3", "4"]
    assert not is_ours("slurmhet:3@other", TAG)  # another store's slurmhet job is foreign
    assert not is_ours(f"slurmhet:3@{TAG}x", TAG) and not is_ours(f"train@{TAG}", TAG)
    assert not is_ours("slurmhet:3", TAG)  # untagged: no store of this version writes it
