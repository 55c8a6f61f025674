"""The shared cluster around slurmhet's jobs: read once per command, turned into plain capacity facts.

:func:`read_world` asks Slurm (through the client, so through the one runner) for
every job of every user, the partitions, reservations, the caller's associations and
QOS limits, Slurm's expected starts of pending jobs, and how long recent jobs really
ran. Everything after that is pure: :func:`access_of` says what one user may use, and
:func:`open_world` turns the rest into the planner's :class:`~slurmhet.cluster.OpenWorld`.

What slurmhet assumes about jobs it did not submit:
- a running job holds its GPUs until its start plus its time limit (Slurm kills it
  then), or, when recent jobs of that user (else that partition) used a known median
  fraction of their limit, until start + that fraction of the limit, labelled an
  estimate; a job already past its estimate is expected to end within a minute;
- a pending job waiting for resources (reason Resources or Priority) starts ahead of
  ours: Slurm's multifactor priority grows with age, so a job queued before ours
  outranks ours on the same partition. Where Slurm gives an expected start and nodes
  (``squeue --start``), it holds those nodes from then; otherwise it takes the first
  GPUs of its kind that free up, after those of our jobs already in Slurm's queue
  (queued overdue) that Slurm ranks above it (in a reservation, then a higher
  partition PriorityTier, higher priority, earlier submission, as slurmctld sorts
  its queue) and that wait for every (node, GPU type) its partition lets it take,
  so that Slurm's backfill can start it only where it ends before them; a job of
  ours holds nothing back before Slurm reserves for it (``ReserveRule``: its age,
  its priority against ``bf_min_prio_reserve`` or its QOS's or association's
  MinPrioThreshold);
- pending jobs held for reasons of their own (dependencies, begin times, limits,
  holds) take nothing, nor do pending jobs bound to a reservation held against us
  (they start inside it);
- a reservation holds its nodes until it ends, whoever it admits: slurmhet's jobs
  name no reservation, and Slurm starts a job that names none on reserved nodes
  only when the reservation is MAGNETIC (and open to it).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Collection, Iterable, Mapping, Sequence

from slurmhet.cluster import Hold, Inventory, Node, OpenWorld, QueuedAhead
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.limits import (AssocRecord, PartitionRecord, PendingStart, QosRecord, ReservationRecord,
                                   ReserveRule, UsageRecord, parse_reserve_rule, prio_threshold)
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.runner import SlurmCommandError

#: Pending reasons under which a job competes for GPUs now: it starts as soon as they free up.
COMPETING_REASONS = frozenset({"Resources", "Priority", "None", "", "ReqNodeNotAvail"})
#: A job past its estimated end is expected to end within this many seconds.
OVERDUE_GRACE_S = 60.0
#: Jobs needed before a user's or partition's median fraction of time limit is trusted.
MIN_HISTORY = 5
_RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"})


@dataclass(frozen=True)
class SlurmWorld:
    """What one command read of the shared cluster."""

    nodes: tuple[Node, ...]
    queue: tuple[QueueRecord, ...]
    partitions: tuple[PartitionRecord, ...]
    reservations: tuple[ReservationRecord, ...] = ()
    assocs: tuple[AssocRecord, ...] = ()
    qos: tuple[QosRecord, ...] = ()
    starts: Mapping[str, PendingStart] = field(default_factory=dict)
    default_account: str = ""
    #: False when Slurm keeps no accounting (no associations, QOS or history to read).
    accounting: bool = True
    history: tuple[UsageRecord, ...] = ()
    #: Which of our blocked jobs Slurm holds nodes for (SchedulerParameters).
    reserve: ReserveRule = ReserveRule()

    @property
    def inventory(self) -> Inventory:
        return Inventory(self.nodes)


@dataclass(frozen=True)
class Access:
    """What one user (under one account and QOS) may use, and why not the rest."""

    user: str
    account: str
    qos: str
    partitions: tuple[str, ...]
    #: Partition -> why this user may not submit there.
    refused: Mapping[str, str]
    #: GPU types on the nodes of usable partitions (drained and down ones included).
    types: tuple[str, ...]
    #: Most GPUs the user may hold at once, and the limit that says so; None: no cap.
    gpu_cap: int | None = None
    cap_source: str = ""
    #: Most GPUs one job may have (MaxTRES per job), and the limit that says so.
    job_gpu_cap: int | None = None
    job_cap_source: str = ""

    def partition_for(self, gpu_type: str, world: SlurmWorld) -> str | None:
        """The partition to submit a job of ``gpu_type`` to: a usable one whose nodes all have that type
        (a site with a partition per type), else the default partition if usable and holding it, else
        the usable one with most GPUs of it; None when none holds it."""
        by_name = {p.name: p for p in world.partitions}
        nodes = {n.name: n for n in world.nodes}
        best: list[tuple[int, int, str]] = []
        for name in self.partitions:
            part = by_name[name]
            counts = [nodes[n].gpus.get(gpu_type, 0) for n in part.nodes if n in nodes]
            if not any(counts):
                continue
            dedicated = all(counts)
            best.append((0 if dedicated else 1 if part.default else 2, -sum(counts), name))
        return min(best)[2] if best else None


def read_world(client: SlurmClient, user: str, queue: Sequence[QueueRecord] | None = None,
               history_since: datetime | None = None) -> SlurmWorld:
    """Ask Slurm for everything :func:`open_world` and :func:`access_of` need (``queue``: reuse one already read)."""
    nodes = tuple(client.nodes())
    jobs = tuple(client.queue() if queue is None else queue)
    partitions = tuple(client.partitions())
    reservations = tuple(client.reservations())
    starts = {s.job_id: s for s in client.pending_starts()}
    reserve = parse_reserve_rule(client.config())
    try:
        assocs = tuple(client.associations(user))
        qos = tuple(client.qos())
        default_account = client.default_account(user)
        history = tuple(client.usage_history(history_since or datetime.now(timezone.utc) - timedelta(days=7)))
        accounting = True
    except SlurmCommandError:
        assocs, qos, default_account, history, accounting = (), (), "", (), False
    return SlurmWorld(nodes, jobs, partitions, reservations, assocs, qos, starts, default_account, accounting,
                      history, reserve)


def _tres_gpus(tres: Mapping[str, float]) -> int | None:
    value = tres.get("gres/gpu")
    return int(value) if value is not None else None


def access_of(world: SlurmWorld, user: str, groups: Collection[str], account: str | None = None,
              qos: str | None = None) -> Access:
    """What ``user`` may use under ``account`` (default: their default account) and ``qos`` (the
    association's default). Without accounting, every partition the groups allow and no caps."""
    account = account or world.default_account or ""
    assocs = [a for a in world.assocs if a.user == user and (not account or a.account == account)]
    qos = qos or next((a.default_qos for a in assocs if a.default_qos), "") or "normal"
    refused: dict[str, str] = {}
    if world.accounting and account and not assocs:
        refused = {p.name: f"user {user} has no association with account {account}" for p in world.partitions}
    restricted = {a.partition for a in assocs if a.partition}
    usable = []
    for part in world.partitions:
        if part.name in refused:
            continue
        why = part.usable_by(user, account, qos, groups)
        if why is None and part.state.upper() != "UP":
            why = f"partition {part.name} is {part.state}"
        if why is None and restricted and "" not in {a.partition for a in assocs} and part.name not in restricted:
            why = f"account {account} has no association on partition {part.name}"
        if why is None:
            usable.append(part.name)
        else:
            refused[part.name] = why
    nodes = {n.name: n for n in world.nodes}
    by_name = {p.name: p for p in world.partitions}
    # Drained and down nodes too: a node out for repair makes a job wait, not its type out of reach.
    types = sorted({t for name in usable for n in by_name[name].nodes if n in nodes
                    for t, c in nodes[n].gpus.items() if c > 0})
    cap, source, job_cap, job_source = None, "", None, ""
    limits: list[tuple[int | None, str]] = []
    job_limits: list[tuple[int | None, str]] = []
    for record in world.qos:
        if record.name == qos:
            limits.append((record.gpu_cap(), f"QOS {qos} MaxTRESPerUser=gres/gpu={record.gpu_cap()}"))
            gpus = _tres_gpus(record.max_tres_per_job)
            job_limits.append((gpus, f"QOS {qos} MaxTRES=gres/gpu={gpus}"))
    for a in assocs:
        gpus = _tres_gpus(a.grp_tres)
        limits.append((gpus, f"account {a.account} GrpTRES=gres/gpu={gpus}"))
        gpus = _tres_gpus(a.max_tres)
        job_limits.append((gpus, f"association {a.account}/{a.user} MaxTRES=gres/gpu={gpus}"))
    for value, why in limits:
        if value is not None and (cap is None or value < cap):
            cap, source = value, why
    for value, why in job_limits:
        if value is not None and (job_cap is None or value < job_cap):
            job_cap, job_source = value, why
    return Access(user, account, qos, tuple(usable), refused, tuple(types), cap, source, job_cap, job_source)


def limit_fractions(history: Iterable[UsageRecord]) -> dict[tuple[str, str], float]:
    """Median fraction of their time limit that finished jobs used, per ``(user, "")`` and ``("", partition)``,
    where at least :data:`MIN_HISTORY` jobs say so."""
    groups: dict[tuple[str, str], list[float]] = {}
    for record in history:
        if record.limit_s > 0 and record.elapsed_s >= 0:
            share = min(1.0, record.elapsed_s / record.limit_s)
            groups.setdefault((record.user, ""), []).append(share)
            groups.setdefault(("", record.partition), []).append(share)
    return {key: statistics.median(v) for key, v in groups.items() if len(v) >= MIN_HISTORY}


def used_share(record: QueueRecord, fractions: Mapping[tuple[str, str], float]) -> float | None:
    """The learned fraction of its limit a job will use: its user's, else its partition's; None when unknown."""
    return fractions.get((record.user, "")) or fractions.get(("", record.partition))


def is_ours(comment: str, store_tag: str) -> bool:
    """A job this store submitted: its comment carries ``slurmhet:<ids>@<store_tag>`` (another store's
    slurmhet jobs are foreign)."""
    return comment.startswith("slurmhet:") and comment.endswith(f"@{store_tag}")


def tagged_ids(comment: str) -> list[str]:
    """The slurmhet job ids a Slurm job's ``slurmhet:<ids>@<store_tag>`` comment names, as written."""
    return comment.partition("@")[0].removeprefix("slurmhet:").split(",")


def expected_end(record: QueueRecord, start_s: float, now_s: float,
                 fractions: Mapping[tuple[str, str], float]) -> tuple[float, bool]:
    """When a foreign job is expected to free its GPUs, and whether that is an estimate."""
    limit = record.time_limit_s
    if limit is None:
        return math.inf, False
    share = used_share(record, fractions)
    if share is None:
        return start_s + limit, False
    return min(max(start_s + share * limit, now_s + OVERDUE_GRACE_S), start_s + limit), True


def queue_rank(record: QueueRecord, tiers: Mapping[str, int]) -> tuple[float, ...]:
    """Where Slurm's scheduler takes a pending job (slurmctld's ``sort_job_queue2``): jobs in a reservation first,
    then by decreasing PriorityTier of the partition (``tiers``, 1 when unknown), decreasing priority,
    increasing submit time, increasing job id."""
    submit = record.submit.timestamp() if record.submit else math.inf
    return (0.0 if record.reservation else 1.0, -float(tiers.get(record.partition, 1)), -float(record.priority),
            submit, float(record.job_id) if record.job_id.isdigit() else math.inf)


def served_first(record: QueueRecord, slots: frozenset[tuple[str, str]],
                 queued: Sequence[tuple[QueueRecord, frozenset[tuple[str, str]]]],
                 tiers: Mapping[str, int]) -> tuple[str, ...]:
    """The slurmhet ids of our jobs pending in Slurm's queue (``queued``: those Slurm holds nodes for) that
    Slurm starts before the foreign pending job ``record``, which may run on ``slots``: ranked before it
    (:func:`queue_rank`) and waiting for every slot it may take. Slurm's main scheduler then keeps the nodes of
    our job's partition from every job after it, in any partition, and backfill starts the foreign job on them
    only where it ends before ours starts; with a slot ours cannot use, it could start there first."""
    ids: list[str] = []
    for ours, mine in queued:
        if queue_rank(ours, tiers) < queue_rank(record, tiers) and slots <= mine:
            ids += [i for i in tagged_ids(ours.comment) if i]
    return tuple(ids)


def job_prio_threshold(world: SlurmWorld, record: QueueRecord) -> int | None:
    """The MinPrioThreshold Slurm applies to one of the user's jobs (:func:`~slurmhet.slurm.limits.prio_threshold`):
    its QOS (as squeue names it, else its association's default), its partition's QOS, its association (the
    one of its partition if the user has one, else the account's)."""
    account = record.account or world.default_account
    rows = [a for a in world.assocs if a.account == account and a.user == record.user]
    association = next((a for a in rows if a.partition == record.partition), None) or next(
        (a for a in rows if not a.partition), None)
    job_qos = record.qos or (association.default_qos if association else "")
    part = next((p for p in world.partitions if p.name == record.partition), None)
    return prio_threshold({q.name: q for q in world.qos}, job_qos, part.qos if part else None, association)


def held_reservations(world: SlurmWorld, access: Access, now_s: float) -> list[ReservationRecord]:
    """The reservations whose nodes the caller's jobs may not use until they end: every one not over, since a
    job that does not name a reservation never starts on its nodes (slurmhet's jobs name none), except a
    MAGNETIC one open to the caller, which Slurm fills with eligible jobs that did not ask for it."""
    now = datetime.fromtimestamp(now_s, timezone.utc)
    return [res for res in world.reservations if res.end > now
            and not ("MAGNETIC" in res.flags and res.usable_by(access.user, {access.account}))]


def open_world(world: SlurmWorld, store_tag: str, access: Access, now_s: float,
               lookahead_s: float = 0.0) -> OpenWorld:
    """The planner's capacity facts for ``access.user``: holds of foreign jobs and reservations, Slurm's
    queue ahead of ours, and the user's GPU cap."""
    fractions = limit_fractions(world.history)
    nodes = {n.name: n for n in world.nodes}
    holds: list[Hold] = []
    ahead: list[QueuedAhead] = []
    by_partition = {p.name: p for p in world.partitions}
    tiers = {name: p.priority_tier for name, p in by_partition.items()}
    reserved = held_reservations(world, access, now_s)
    walled = {res.name for res in reserved}
    memo: dict[tuple[str, frozenset[str | None]], frozenset[tuple[str, str]]] = {}

    def slots_of(partition: str, kinds: Iterable[str | None]) -> frozenset[tuple[str, str]]:
        """The (node, GPU type) pairs a job of ``partition`` asking for ``kinds`` (None: any type) may run on; an
        unknown partition counts as every node."""
        wanted = frozenset(kinds)
        if (partition, wanted) not in memo:
            part = by_partition.get(partition)
            memo[(partition, wanted)] = frozenset(
                (n, t) for n in (part.nodes if part else nodes) if n in nodes
                for t, c in nodes[n].gpus.items() if c > 0 and (None in wanted or t in wanted))
        return memo[(partition, wanted)]

    # Our blocked jobs that Slurm holds nodes for: one too young or too low to reserve (world.reserve) lets
    # later jobs pass it.
    queued = [(r, slots_of(r.partition, (t for t, _ in r.gpu_request))) for r in world.queue
              if is_ours(r.comment, store_tag) and r.state == "PENDING" and r.reason in COMPETING_REASONS
              and r.gpu_request
              and world.reserve.reserves(r.eligible.timestamp() if r.eligible else None, r.priority, now_s,
                                         job_prio_threshold(world, r))]
    for record in world.queue:
        if is_ours(record.comment, store_tag):
            continue
        owner = f"job {record.job_id} ({record.user}, partition {record.partition})"
        if record.state in _RUNNING:
            start = record.start.timestamp() if record.start else now_s
            end, estimated = expected_end(record, start, now_s, fractions)
            for node, gpu_type, count in record.gpus:
                holds.append(Hold(node, gpu_type, count, min(start, now_s), max(end, now_s + 1.0), "job", owner,
                                  estimated))
        elif (record.state == "PENDING" and record.reason in COMPETING_REASONS and record.gpu_request
              and record.reservation not in walled):  # one bound to a held reservation starts inside its hold
            limit = record.time_limit_s
            share = used_share(record, fractions) or 1.0
            duration = share * limit if limit is not None else math.inf
            slated = world.starts.get(record.job_id)
            for gpu_type, count in record.gpu_request:
                slots = slots_of(record.partition, (gpu_type,))
                kinds = tuple(sorted({t for _, t in slots}))
                if not kinds:  # no such GPUs in its partition: it never starts
                    continue
                if slated and slated.expected_start and slated.sched_nodes and math.isfinite(duration):
                    start = slated.expected_start.timestamp()
                    left = count
                    for node in slated.sched_nodes:
                        have = [t for t in kinds if nodes.get(node) and nodes[node].gpus.get(t)]
                        if not have or left <= 0:
                            continue
                        take = min(left, nodes[node].gpus[have[0]])
                        holds.append(Hold(node, have[0], take, max(start, now_s), max(start, now_s) + duration,
                                          "pending", owner, True))
                        left -= take
                elif math.isfinite(duration):
                    ahead.append(QueuedAhead(kinds, count, duration, owner, served_first(record, slots, queued, tiers)))
    for res in reserved:
        for node in res.nodes:
            for gpu_type, count in (nodes[node].gpus.items() if node in nodes else ()):
                holds.append(Hold(node, gpu_type, count, max(res.start.timestamp(), now_s), res.end.timestamp(),
                                  "reservation", f"reservation {res.name}"))
    caps = {access.user: access.gpu_cap} if access.gpu_cap is not None else {}
    return OpenWorld(tuple(holds), tuple(ahead), caps, lookahead_s)


@dataclass(frozen=True)
class TypeUse:
    """GPUs of one type in one partition, as ``slurmhet cluster`` shows them."""

    partition: str
    gpu_type: str
    total: int
    slurmhet: int
    others: int
    reserved: int

    @property
    def free(self) -> int:
        return max(0, self.total - self.slurmhet - self.others - self.reserved)


def gpus_held(world: SlurmWorld, store_tag: str) -> dict[str, Counter[tuple[str, str]]]:
    """GPUs held now per (node, type) by running jobs: ``slurmhet`` (this store's) and ``others``."""
    held: dict[str, Counter[tuple[str, str]]] = {"slurmhet": Counter(), "others": Counter()}
    for record in world.queue:
        if record.state in _RUNNING:
            side = "slurmhet" if is_ours(record.comment, store_tag) else "others"
            for node, gpu_type, count in record.gpus:
                held[side][(node, gpu_type)] += count
    return held


def by_type(held: Counter[tuple[str, str]]) -> dict[str, int]:
    """(node, type) counts summed per type."""
    out: Counter[str] = Counter()
    for (_, gpu_type), count in held.items():
        out[gpu_type] += count
    return dict(out)


def gpu_use(world: SlurmWorld, store_tag: str, access: Access, now_s: float) -> list[TypeUse]:
    """Per partition and GPU type: total / held by this store's jobs / held by others / reserved now / free.

    A GPU counts under every partition that holds its node (partitions overlap on real sites). Reserved
    are the idle GPUs of the nodes of the reservations ``access.user`` may not use now, by the planner's
    rule (:func:`held_reservations`), each node once however many reservations cover it.
    """
    nodes = {n.name: n for n in world.nodes if n.available}
    held = {**gpus_held(world, store_tag), "reserved": Counter()}
    now = datetime.fromtimestamp(now_s, timezone.utc)
    walled = {node for res in held_reservations(world, access, now_s) if res.start <= now for node in res.nodes}
    for node in sorted(walled & nodes.keys()):
        for gpu_type, count in nodes[node].gpus.items():
            free = count - held["slurmhet"][(node, gpu_type)] - held["others"][(node, gpu_type)]
            held["reserved"][(node, gpu_type)] = max(0, free)
    out = []
    for part in world.partitions:
        totals: Counter[str] = Counter()
        sides: dict[str, Counter[str]] = {k: Counter() for k in held}
        for name in part.nodes:
            node = nodes.get(name)
            if node is None:
                continue
            for gpu_type, count in node.gpus.items():
                totals[gpu_type] += count
                for side, counter in held.items():
                    sides[side][gpu_type] += counter[(name, gpu_type)]
        for gpu_type in sorted(totals):
            out.append(TypeUse(part.name, gpu_type, totals[gpu_type], sides["slurmhet"][gpu_type],
                               sides["others"][gpu_type], sides["reserved"][gpu_type]))
    return out
