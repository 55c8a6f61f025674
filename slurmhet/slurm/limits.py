"""Pure parsers of what a shared cluster allows: partitions, reservations, associations, QOS, expected starts,
which blocked jobs the scheduler reserves nodes for.

slurmhet shares its cluster with other users, so before planning it reads who may use
which partition, what is reserved, how many GPUs the caller may hold and when Slurm
expects the jobs ahead to start. These parsers turn the 22.05 command outputs
(recorded in tests/fixtures/slurm-22.05) into value objects; every malformed line
raises ``SlurmOutputError`` naming the command, so a user sees what Slurm printed,
not a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Collection, Mapping

from slurmhet.errors import InputError
from slurmhet.runtime.hostlist import expand_hostlist
from slurmhet.slurm.parsers import SlurmOutputError, parse_oneliner, parse_slurm_time, parse_tres

PARTITION_CMD = "scontrol show partition"
RESERVATION_CMD = "scontrol show reservation"
ASSOC_CMD = "sacctmgr show assoc"
QOS_CMD = "sacctmgr show qos"
USER_CMD = "sacctmgr show user"
START_CMD = "squeue --start"
USAGE_CMD = "sacct --allusers -X"

#: ``format=`` of the sacctmgr queries, in the column order the parsers expect.
ASSOC_FIELDS = ("Account", "User", "Partition", "QOS", "DefaultQOS", "MaxTRES", "GrpTRES", "MaxJobs", "MaxWall",
                "MinPrioThreshold")
QOS_FIELDS = ("Name", "Priority", "MaxTRESPU", "MaxTRES", "GrpTRES", "MaxJobsPU", "MaxWall", "MinPrioThreshold",
              "Flags")
USER_FIELDS = ("User", "DefaultAccount")
#: ``--format=`` of ``squeue --start``: job id, expected start, scheduled nodes, reason.
START_FORMAT = "%A|%S|%Y|%r"
#: ``--format=`` of the sacct history that says how much of their time limit jobs really use.
USAGE_FIELDS = ("User", "Partition", "State", "ElapsedRaw", "TimelimitRaw", "AllocTRES")

_UNLIMITED = frozenset({"UNLIMITED", "INFINITE", "NONE", ""})


# --------------------------------------------------------------------------- shared readers


def parse_time_limit(text: str, command: str, key: str, owner: str) -> float | None:
    """A Slurm time limit in seconds; None when unlimited.

    Slurm writes limits as ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM`` or
    ``D-HH:MM:SS`` (a lone number is minutes, unlike an elapsed time).
    """
    text = text.strip()
    if text.upper() in _UNLIMITED:
        return None
    days_text, dash, clock = text.rpartition("-") if "-" in text else ("", "", text)
    try:
        days = int(days_text) if dash else 0
        parts = [int(p) for p in clock.split(":")]
    except ValueError:
        raise SlurmOutputError(f"{command}: cannot read {key} {text!r} of {owner}") from None
    if any(p < 0 for p in parts) or days < 0 or len(parts) > 3:
        raise SlurmOutputError(f"{command}: cannot read {key} {text!r} of {owner}")
    if dash:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = (parts + [0, 0])[:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _tres(text: str, command: str, key: str, owner: str) -> dict[str, float]:
    try:
        return parse_tres(text)
    except SlurmOutputError as exc:
        raise SlurmOutputError(f"{command}: {exc} in {key} of {owner}") from None


def _optional_int(text: str, command: str, key: str, owner: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SlurmOutputError(f"{command}: cannot read {key} {text!r} of {owner}") from None


def _hosts(text: str, command: str, what: str) -> tuple[str, ...]:
    text = text.strip()
    if text in ("", "(null)"):
        return ()
    try:
        return tuple(expand_hostlist(text))
    except InputError as exc:
        raise SlurmOutputError(f"{command}: cannot read the nodes {text!r} of {what}: {exc}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in (p.strip() for p in text.split(",")) if n and n != "(null)")


def _all_or_names(text: str) -> tuple[str, ...] | None:
    """``ALL`` -> None (no restriction), else the listed names."""
    return None if text.strip().upper() == "ALL" else _names(text)


def _pipe_rows(text: str, fields: tuple[str, ...], command: str) -> list[dict[str, str]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(fields):
            raise SlurmOutputError(f"{command}: line {number} has {len(cells)} fields, expected {len(fields)} "
                                   f"({','.join(fields)}): {line[:120]!r}")
        rows.append(dict(zip(fields, cells)))
    return rows


# --------------------------------------------------------------------------- partitions


@dataclass(frozen=True)
class PartitionRecord:
    """One partition of ``scontrol show partition --oneliner``: where jobs may go and who may send them."""

    name: str
    nodes: tuple[str, ...]
    state: str  # UP / DOWN / DRAIN / INACTIVE
    default: bool
    max_time_s: float | None  # None = UNLIMITED
    allow_accounts: tuple[str, ...] | None  # None = ALL
    deny_accounts: tuple[str, ...]
    allow_groups: tuple[str, ...] | None  # None = ALL
    allow_qos: tuple[str, ...] | None  # None = ALL
    deny_qos: tuple[str, ...]
    priority_tier: int
    root_only: bool
    #: The partition's QOS (``QoS=``), whose limits apply to every job in it; None for ``N/A``.
    qos: str | None = None

    def usable_by(self, user: str, account: str, qos: str, groups: Collection[str]) -> str | None:
        """None when this user/account/qos may submit here, else the reason in words.

        Mirrors slurmctld's partition checks so a plan never targets a partition that sbatch
        would refuse; root passes AllowGroups, as in Slurm.
        """
        if self.root_only and user != "root":
            return f"partition {self.name} is RootOnly"
        if self.allow_accounts is not None and account not in self.allow_accounts:
            return f"account {account} is not in AllowAccounts={','.join(self.allow_accounts)}"
        if account in self.deny_accounts:
            return f"account {account} is in DenyAccounts={','.join(self.deny_accounts)}"
        if self.allow_qos is not None and qos not in self.allow_qos:
            return f"QOS {qos} is not in AllowQos={','.join(self.allow_qos)}"
        if qos in self.deny_qos:
            return f"QOS {qos} is in DenyQos={','.join(self.deny_qos)}"
        if self.allow_groups is not None and user != "root" and not set(groups) & set(self.allow_groups):
            return f"user {user} is in none of AllowGroups={','.join(self.allow_groups)}"
        return None


def _yes_no(rec: dict[str, str], key: str, name: str) -> bool:
    value = rec.get(key, "NO").strip().upper()
    if value not in ("YES", "NO"):
        raise SlurmOutputError(f"{PARTITION_CMD}: cannot read {key} {value!r} of partition {name}")
    return value == "YES"


def parse_partitions(text: str) -> list[PartitionRecord]:
    """Parse ``scontrol show partition --oneliner`` (one ``PartitionName=`` line per partition)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith("PartitionName="):
            raise SlurmOutputError(f"{PARTITION_CMD}: unexpected line {line[:120]!r}")
        rec = parse_oneliner(line)
        name = rec["PartitionName"]
        missing = [k for k in ("Nodes", "State", "MaxTime") if k not in rec]
        if missing:
            raise SlurmOutputError(f"{PARTITION_CMD}: partition {name} has no {', '.join(missing)}: {line[:120]!r}")
        tier = _optional_int(rec.get("PriorityTier", "1"), PARTITION_CMD, "PriorityTier", f"partition {name}")
        out.append(PartitionRecord(
            name=name,
            nodes=_hosts(rec["Nodes"], PARTITION_CMD, f"partition {name}"),
            state=rec["State"].strip(),
            default=_yes_no(rec, "Default", name),
            max_time_s=parse_time_limit(rec["MaxTime"], PARTITION_CMD, "MaxTime", f"partition {name}"),
            allow_accounts=_all_or_names(rec.get("AllowAccounts", "ALL")),
            deny_accounts=_names(rec.get("DenyAccounts", "")),
            allow_groups=_all_or_names(rec.get("AllowGroups", "ALL")),
            allow_qos=_all_or_names(rec.get("AllowQos", "ALL")),
            deny_qos=_names(rec.get("DenyQos", "")),
            priority_tier=tier if tier is not None else 1,
            root_only=_yes_no(rec, "RootOnly", name),
            qos=None if rec.get("QoS", "N/A").strip() in ("N/A", "") else rec["QoS"].strip(),
        ))
    return out


# --------------------------------------------------------------------------- reservations


def _allowed(names: tuple[str, ...], have: Collection[str]) -> bool | None:
    """None: no list; else whether ``have`` passes an allow list or a ``-``-prefixed deny list."""
    if not names:
        return None
    denied = {n[1:] for n in names if n.startswith("-")}
    if denied:
        return not denied & set(have)
    return bool(set(names) & set(have))


@dataclass(frozen=True)
class ReservationRecord:
    """One reservation of ``scontrol show reservation --oneliner``: nodes others may not use for a while."""

    name: str
    nodes: tuple[str, ...]
    start: datetime  # UTC aware
    end: datetime
    users: tuple[str, ...]  # as written; a leading '-' means denied
    accounts: tuple[str, ...]
    flags: tuple[str, ...]
    state: str
    groups: tuple[str, ...] = ()

    def usable_by(self, user: str, accounts: Collection[str], groups: Collection[str] | None = None) -> bool:
        """Whether a job of ``user`` under one of ``accounts`` may run in this reservation.

        As in Slurm, Users (or Groups) and Accounts must both admit the job when both are set.
        With ``groups`` unknown, a Groups reservation counts as not usable: better to plan
        around nodes we could have used than onto nodes we cannot.
        """
        checks = [_allowed(self.users, {user}), _allowed(self.accounts, accounts)]
        if self.groups:
            checks.append(bool(set(self.groups) & set(groups)) if groups is not None else False)
        decided = [c for c in checks if c is not None]
        return bool(decided) and all(decided)


def _reservation_time(rec: dict[str, str], key: str, name: str) -> datetime:
    try:
        value = parse_slurm_time(rec.get(key, ""))
    except SlurmOutputError:
        value = None
    if value is None:
        raise SlurmOutputError(f"{RESERVATION_CMD}: cannot read {key} {rec.get(key, '')!r} of reservation {name}")
    return value


def parse_reservations(text: str) -> list[ReservationRecord]:
    """Parse ``scontrol show reservation --oneliner``; ``No reservations in the system`` gives []."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.strip() == "No reservations in the system":
            continue
        if not line.startswith("ReservationName="):
            raise SlurmOutputError(f"{RESERVATION_CMD}: unexpected line {line[:120]!r}")
        rec = parse_oneliner(line)
        name = rec["ReservationName"]
        if "State" not in rec or "Nodes" not in rec:
            raise SlurmOutputError(f"{RESERVATION_CMD}: reservation {name} has no Nodes or State: {line[:120]!r}")
        out.append(ReservationRecord(
            name=name,
            nodes=_hosts(rec["Nodes"], RESERVATION_CMD, f"reservation {name}"),
            start=_reservation_time(rec, "StartTime", name),
            end=_reservation_time(rec, "EndTime", name),
            users=_names(rec.get("Users", "")),
            accounts=_names(rec.get("Accounts", "")),
            flags=_names(rec.get("Flags", "")),
            state=rec["State"].strip(),
            groups=_names(rec.get("Groups", "")),
        ))
    return out


# --------------------------------------------------------------------------- associations and QOS


@dataclass(frozen=True)
class AssocRecord:
    """One association row: what ``user`` may do under ``account`` (and ``partition``, "" = every one)."""

    account: str
    user: str
    partition: str
    qos: tuple[str, ...]
    default_qos: str
    max_tres: Mapping[str, float]  # per job, e.g. {"gres/gpu": 4}
    grp_tres: Mapping[str, float]
    max_jobs: int | None
    max_wall_s: float | None
    #: MinPrioThreshold (inherited from the parent accounts as sacctmgr shows it); None when unset.
    min_prio_threshold: int | None = None


def parse_assocs(text: str) -> list[AssocRecord]:
    """Parse ``sacctmgr -n -P show assoc user=U format=<ASSOC_FIELDS>``."""
    out = []
    for row in _pipe_rows(text, ASSOC_FIELDS, ASSOC_CMD):
        where = f"association {row['Account']}/{row['User']}"
        out.append(AssocRecord(
            account=row["Account"],
            user=row["User"],
            partition=row["Partition"],
            qos=_names(row["QOS"]),
            default_qos=row["DefaultQOS"],
            max_tres=_tres(row["MaxTRES"], ASSOC_CMD, "MaxTRES", where),
            grp_tres=_tres(row["GrpTRES"], ASSOC_CMD, "GrpTRES", where),
            max_jobs=_optional_int(row["MaxJobs"], ASSOC_CMD, "MaxJobs", where),
            max_wall_s=parse_time_limit(row["MaxWall"], ASSOC_CMD, "MaxWall", where),
            min_prio_threshold=_optional_int(row["MinPrioThreshold"], ASSOC_CMD, "MinPrioThreshold", where),
        ))
    return out


@dataclass(frozen=True)
class QosRecord:
    """One QOS of ``sacctmgr show qos``: the per-user and per-job limits it imposes."""

    name: str
    priority: int
    max_tres_per_user: Mapping[str, float]
    max_tres_per_job: Mapping[str, float]
    grp_tres: Mapping[str, float]
    max_jobs_per_user: int | None
    max_wall_s: float | None
    #: MinPrioThreshold: a blocked job of lower priority holds no nodes for itself (see :class:`ReserveRule`).
    min_prio_threshold: int | None = None
    flags: tuple[str, ...] = ()

    def gpu_cap(self) -> int | None:
        """Most GPUs one user may hold at once under this QOS (MaxTRESPerUser gres/gpu), None if unlimited."""
        value = self.max_tres_per_user.get("gres/gpu")
        return int(value) if value is not None else None


def parse_qos(text: str) -> list[QosRecord]:
    """Parse ``sacctmgr -n -P show qos format=<QOS_FIELDS>``."""
    out = []
    for row in _pipe_rows(text, QOS_FIELDS, QOS_CMD):
        where = f"QOS {row['Name']}"
        priority = _optional_int(row["Priority"], QOS_CMD, "Priority", where)
        out.append(QosRecord(
            name=row["Name"],
            priority=priority or 0,
            max_tres_per_user=_tres(row["MaxTRESPU"], QOS_CMD, "MaxTRESPU", where),
            max_tres_per_job=_tres(row["MaxTRES"], QOS_CMD, "MaxTRES", where),
            grp_tres=_tres(row["GrpTRES"], QOS_CMD, "GrpTRES", where),
            max_jobs_per_user=_optional_int(row["MaxJobsPU"], QOS_CMD, "MaxJobsPU", where),
            max_wall_s=parse_time_limit(row["MaxWall"], QOS_CMD, "MaxWall", where),
            min_prio_threshold=_optional_int(row["MinPrioThreshold"], QOS_CMD, "MinPrioThreshold", where),
            flags=_names(row["Flags"]),
        ))
    return out


def parse_default_account(text: str) -> str:
    """The DefaultAccount of ``sacctmgr -n -P show user U format=User,DefaultAccount``; "" when U is unknown."""
    rows = _pipe_rows(text, USER_FIELDS, USER_CMD)
    if len(rows) > 1:
        raise SlurmOutputError(f"{USER_CMD}: {len(rows)} users listed, expected one")
    return rows[0]["DefaultAccount"] if rows else ""


# --------------------------------------------------------------------------- expected starts


@dataclass(frozen=True)
class PendingStart:
    """Slurm's backfill estimate for one pending job: when and where it is expected to start."""

    job_id: str
    expected_start: datetime | None  # N/A -> None
    sched_nodes: tuple[str, ...]
    reason: str


def parse_pending_starts(text: str) -> list[PendingStart]:
    """Parse ``squeue --all --start --noheader --format=%A|%S|%Y|%r``."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.strip().split("|", 3)
        if len(cells) != 4 or not cells[0].isdigit():
            raise SlurmOutputError(f"{START_CMD}: cannot read line {number} {line[:120]!r} (want {START_FORMAT})")
        job_id, start_text, nodes, reason = cells
        try:
            start = parse_slurm_time(start_text)
        except SlurmOutputError:
            raise SlurmOutputError(f"{START_CMD}: cannot read the start {start_text!r} of job {job_id}") from None
        out.append(PendingStart(job_id, start, _hosts(nodes, START_CMD, f"job {job_id}"), reason))
    return out


# --------------------------------------------------------------------------- reservations for blocked jobs


@dataclass(frozen=True)
class ReserveRule:
    """Which blocked pending jobs Slurm holds nodes for (``SchedulerParameters`` bf_min_age_reserve and
    bf_min_prio_reserve). When the job first in line cannot start, slurmctld's main scheduler keeps its
    partition's nodes from every later job and backfill books them for it, unless it has been eligible for less
    than ``min_age_s`` (or not at all) or its priority is below its threshold: then later jobs pass it. The
    threshold is the MinPrioThreshold of the job's QOS or association where Slurm enforces limits
    (``AccountingStorageEnforce`` with ``limits``; slurmctld's ``acct_policy_get_prio_thresh``), else
    ``min_priority``."""

    min_age_s: float = 0.0
    min_priority: int = 0
    enforce_limits: bool = False

    def reserves(self, eligible_s: float | None, priority: int, now_s: float, threshold: int | None = None) -> bool:
        """Whether a blocked job eligible since ``eligible_s`` (None: not yet) holds back the jobs after it;
        ``threshold``: its QOS's or association's MinPrioThreshold (:func:`prio_threshold`)."""
        if self.min_age_s > 0 and (eligible_s is None or now_s - eligible_s < self.min_age_s):
            return False
        least = (threshold if self.enforce_limits else None) or self.min_priority
        return not (least > 0 and priority < least)


def _leading_int(text: str) -> int:
    """C's atoi, as slurmctld reads these options: leading digits, else 0 (it ignores a negative value)."""
    match = re.match(r"\s*(\d+)", text)
    return int(match.group(1)) if match else 0


def parse_reserve_rule(config: Mapping[str, str]) -> ReserveRule:
    """``scontrol show config``'s SchedulerParameters -> :class:`ReserveRule` (the defaults when unset)."""
    options = dict(part.strip().partition("=")[::2] for part in config.get("SchedulerParameters", "").split(",")
                   if part.strip() and part.strip() != "(null)")
    enforce = {word.strip().lower() for word in config.get("AccountingStorageEnforce", "").split(",")}
    return ReserveRule(float(_leading_int(options.get("bf_min_age_reserve", "0"))),
                       _leading_int(options.get("bf_min_prio_reserve", "0")),
                       bool(enforce & {"limits", "safe", "all"}))


def prio_threshold(qos: Mapping[str, QosRecord], job_qos: str, partition_qos: str | None,
                   association: AssocRecord | None) -> int | None:
    """The MinPrioThreshold slurmctld applies to a job (``acct_policy_get_prio_thresh``): the first one set of
    the partition's QOS and the job's QOS (the job's first when it has the OverPartQOS flag), then of its
    association; None when none is set (``bf_min_prio_reserve`` applies)."""
    own, part = qos.get(job_qos), qos.get(partition_qos) if partition_qos else None
    order = [own, part] if own is not None and "OverPartQOS" in own.flags else [part, own]
    for record in order:
        if record is not None and record.min_prio_threshold:
            return record.min_prio_threshold
    return association.min_prio_threshold if association is not None and association.min_prio_threshold else None


# --------------------------------------------------------------------------- usage history


@dataclass(frozen=True)
class UsageRecord:
    """One finished GPU job from sacct history: how much of its time limit it used."""

    user: str
    partition: str
    elapsed_s: float
    limit_s: float


#: States of jobs that did not end by themselves or never ran; they say nothing about how long jobs run.
_NOT_ENDED = frozenset({"RUNNING", "PENDING", "REQUEUED", "RESIZING", "SUSPENDED", "REVOKED"})


def parse_usage(text: str) -> list[UsageRecord]:
    """Parse ``sacct --allusers -X --parsable2 --noheader --format=<USAGE_FIELDS>``.

    Keeps finished jobs that held GPUs, ran, and had a finite limit (TimelimitRaw is in
    minutes; ``UNLIMITED`` and ``Partition_Limit`` say nothing about a fraction).
    """
    out = []
    for number, row in enumerate(_pipe_rows(text, USAGE_FIELDS, USAGE_CMD), 1):
        state = row["State"].split()[0] if row["State"].strip() else ""
        where = f"job of {row['User'] or '?'} in row {number}"
        try:
            elapsed = float(row["ElapsedRaw"])
        except ValueError:
            raise SlurmOutputError(f"{USAGE_CMD}: cannot read ElapsedRaw {row['ElapsedRaw']!r} of {where}") from None
        limit_text = row["TimelimitRaw"].strip()
        if not limit_text.isdigit():
            if limit_text in ("UNLIMITED", "Partition_Limit", ""):
                continue
            raise SlurmOutputError(f"{USAGE_CMD}: cannot read TimelimitRaw {limit_text!r} of {where}")
        try:
            gpus = parse_tres(row["AllocTRES"]).get("gres/gpu", 0.0) if row["AllocTRES"].strip() else 0.0
        except SlurmOutputError as exc:
            raise SlurmOutputError(f"{USAGE_CMD}: {exc} in AllocTRES of {where}") from None
        if state in _NOT_ENDED or elapsed <= 0 or int(limit_text) == 0 or gpus <= 0:
            continue
        out.append(UsageRecord(row["User"], row["Partition"], elapsed, int(limit_text) * 60.0))
    return out
