"""Pure parsers of Slurm command output (22.05 formats), tested on recorded fixtures."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from slurmhet.cluster import Node
from slurmhet.errors import InputError, SystemFailure
from slurmhet.runtime.hostlist import expand_hostlist


class SlurmOutputError(SystemFailure):
    """Slurm printed something we cannot read; carries the command and the offending line."""


# --------------------------------------------------------------------------- node inventory


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses: ``gpu:v100:2(IDX:0,2),mps:0`` has two entries."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if current:
        parts.append("".join(current))
    return [p for p in (p.strip() for p in parts) if p and p != "(null)"]


@dataclass(frozen=True)
class GresEntry:
    name: str
    type: str | None
    count: int


def parse_gres(text: str) -> list[GresEntry]:
    """Parse a node's ``Gres=`` or a job's ``gres`` string: ``gpu:v100:4(S:0),mps:400``."""
    out = []
    for entry in split_top_level(text):
        bare = entry.split("(", 1)[0]
        fields = bare.split(":")
        if len(fields) == 1:
            out.append(GresEntry(fields[0], None, 1))
        elif len(fields) == 2:
            name, second = fields
            out.append(GresEntry(name, None, int(second)) if second.isdigit() else GresEntry(name, second, 1))
        else:
            name, gtype, count = fields[0], fields[1], fields[-1]
            if not count.isdigit():
                raise SlurmOutputError(f"cannot read GRES entry {entry!r}")
            out.append(GresEntry(name, gtype, int(count)))
    return out


def parse_oneliner(line: str) -> dict[str, str]:
    """``scontrol show ... --oneliner`` line -> dict; values may contain spaces only in known keys."""
    out: dict[str, str] = {}
    key = None
    for token in line.strip().split(" "):
        if "=" in token and re.match(r"^[A-Za-z][\w/:.]*=", token):
            key, _, value = token.partition("=")
            out[key] = value
        elif key is not None and token:
            out[key] += " " + token
    return out


def parse_scontrol_nodes(text: str) -> list[Node]:
    """Parse ``scontrol show nodes --oneliner`` into inventory nodes."""
    nodes = []
    for line in text.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        rec = parse_oneliner(line)
        gpus: dict[str, int] = {}
        mps = shards = 0
        for entry in parse_gres(rec.get("Gres", "")):
            if entry.name == "gpu":
                gpus[(entry.type or "gpu").lower()] = gpus.get((entry.type or "gpu").lower(), 0) + entry.count
            elif entry.name == "mps":
                mps += entry.count
            elif entry.name == "shard":
                shards += entry.count
        features = tuple(f for f in rec.get("AvailableFeatures", "").split(",") if f and f != "(null)")
        try:
            cpus = int(rec.get("CPUTot", "0"))
            memory = int(rec.get("RealMemory", "0"))
        except ValueError as exc:
            raise SlurmOutputError(f"cannot read node line: {line[:120]}") from exc
        addr = rec.get("NodeAddr", "")
        nodes.append(Node(rec["NodeName"], gpus, features, rec.get("State", "UNKNOWN").lower(), cpus, memory,
                          mps=mps, shards=shards, addr=addr if addr != rec["NodeName"] else ""))
    return nodes


# --------------------------------------------------------------------------- sbatch


def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``jobid`` or ``jobid;cluster``; return the id."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmOutputError(f"sbatch --parsable printed {stdout.strip()!r}, not a job id")
    return job_id


# --------------------------------------------------------------------------- job ids


@dataclass(frozen=True)
class SlurmJobId:
    """A sacct/squeue job id split into its parts: ``123``, ``123+1``, ``123_4``, ``123_4.batch``."""

    job: str
    het_offset: int | None = None
    array_task: int | None = None
    array_pending: str | None = None  # "[5-9%2]" for not-yet-split array tasks
    step: str | None = None

    @property
    def is_step(self) -> bool:
        return self.step is not None


_JOB_ID = re.compile(r"^(\d+)(?:\+(\d+))?(?:_(\d+|\[[^\]]*\]))?(?:\.(\w+))?$")


def parse_job_id(text: str) -> SlurmJobId:
    match = _JOB_ID.match(text.strip())
    if not match:
        raise SlurmOutputError(f"cannot read Slurm job id {text!r}")
    job, het, task, step = match.groups()
    array_task = int(task) if task and task.isdigit() else None
    pending = task if task and not task.isdigit() else None
    return SlurmJobId(job, int(het) if het is not None else None, array_task, pending, step)


# --------------------------------------------------------------------------- sacct

SACCT_FIELDS = (
    "JobID", "JobIDRaw", "JobName", "State", "ExitCode", "Submit", "Start", "End", "Elapsed",
    "AllocTRES", "NodeList", "Comment", "User", "Partition",
)


@dataclass(frozen=True)
class AccountingRecord:
    """One sacct row (job, het component, array task or step)."""

    id: SlurmJobId
    raw_id: str
    name: str
    state: str
    exit_code: str
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    elapsed_s: int
    alloc_tres: dict[str, float]
    nodes: str
    comment: str
    user: str
    partition: str

    def gpus_by_type(self) -> dict[str, int]:
        """``gres/gpu:t4=2`` entries of AllocTRES, as {type: count}."""
        return {k.split(":", 1)[1]: int(v) for k, v in self.alloc_tres.items() if k.startswith("gres/gpu:")}


def parse_slurm_time(text: str) -> datetime | None:
    text = text.strip()
    if text in ("", "Unknown", "None", "N/A"):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").astimezone(timezone.utc)
    except ValueError as exc:
        raise SlurmOutputError(f"cannot read Slurm time {text!r}") from exc


def parse_elapsed(text: str) -> int:
    """``[D-]HH:MM:SS`` or ``MM:SS`` -> seconds."""
    text = text.strip()
    if not text:
        return 0
    days = 0
    if "-" in text:
        day_text, text = text.split("-", 1)
        days = int(day_text)
    parts = [int(p) for p in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_tres(text: str) -> dict[str, float]:
    """``billing=1,cpu=1,gres/gpu:t4=2,gres/gpu=2,mem=250M,node=1`` -> dict (mem in MB)."""
    out: dict[str, float] = {}
    for item in split_top_level(text):
        key, _, value = item.partition("=")
        multiplier = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 ** 2}.get(value[-1:], None)
        try:
            out[key] = float(value[:-1]) * multiplier if multiplier else float(value)
        except ValueError as exc:
            raise SlurmOutputError(f"cannot read TRES entry {item!r}") from exc
    return out


def parse_sacct_parsable(stdout: str, fields: Iterable[str] = SACCT_FIELDS) -> list[AccountingRecord]:
    """Parse ``sacct --parsable2 --noheader --format=<SACCT_FIELDS>``."""
    names = list(fields)
    out = []
    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(names):
            raise SlurmOutputError(f"sacct line {number}: {len(cells)} fields, expected {len(names)}: {line[:120]!r}")
        row = dict(zip(names, cells))
        out.append(
            AccountingRecord(
                id=parse_job_id(row["JobID"]),
                raw_id=row["JobIDRaw"],
                name=row["JobName"],
                state=row["State"].split(" ", 1)[0],
                exit_code=row["ExitCode"],
                submit=parse_slurm_time(row["Submit"]),
                start=parse_slurm_time(row["Start"]),
                end=parse_slurm_time(row["End"]),
                elapsed_s=parse_elapsed(row["Elapsed"]),
                alloc_tres=parse_tres(row["AllocTRES"]),
                nodes=row["NodeList"],
                comment=row["Comment"],
                user=row["User"],
                partition=row["Partition"],
            )
        )
    return out


# --------------------------------------------------------------------------- squeue


@dataclass(frozen=True)
class QueueRecord:
    """One job as squeue sees it (live, not yet in or ahead of accounting)."""

    job_id: str
    het_job_id: str | None
    het_offset: int | None
    array_job_id: str | None
    array_task: int | None
    name: str
    state: str
    reason: str
    comment: str
    user: str
    nodes: str
    submit: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None  # for a live job, the projected end (time limit)
    alloc_tres: str = ""
    partition: str = ""
    account: str = ""
    qos: str = ""
    priority: int = 0
    time_limit_s: float | None = None  # None: unlimited
    #: (node, gpu type, count) held by a running job; untyped GPUs read as type "gpu".
    gpus: tuple[tuple[str, str, int], ...] = ()
    #: (gpu type or None for any, total count) the job asks for.
    gpu_request: tuple[tuple[str | None, int], ...] = ()
    #: ``code:signal`` as sacct prints it, once the job ended ("" before, or when squeue does not say).
    exit_code: str = ""
    #: Times Slurm requeued this job (preemption, a failed node, ``scontrol requeue``); one Slurm id throughout.
    restarts: int = 0
    #: The reservation the job runs in or asked for ("" for none): Slurm takes such jobs first, on its nodes only.
    reservation: str = ""
    #: Since when the job may start (its begin time: submit, ``--begin``, or a dependency met); None: not yet.
    eligible: datetime | None = None

    @property
    def root_id(self) -> str:
        """The id sbatch printed: the het leader or array master, else the job itself."""
        return self.het_job_id or self.array_job_id or self.job_id


def _num(value: Any) -> int | None:
    """squeue --json numbers: plain ints in 22.05; ``{set, infinite, number}`` from 23.02 (data_parser), as the
    24.11 and 26.05 recordings in tests/fixtures show."""
    if isinstance(value, dict):
        return int(value["number"]) if value.get("set", True) and not value.get("infinite") else None
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _exit_code(value: Any) -> str:
    """sacct's ``code:signal`` from squeue --json: a wait status in 22.05 (768 is exit 3), ``{status,
    return_code, signal: {id}}`` from 23.02 (the 24.11 and 26.05 recordings); "" when it says nothing."""
    if isinstance(value, dict):
        code = _num(value.get("return_code"))
        signal = value.get("signal")
        number = _num(signal.get("id")) if isinstance(signal, dict) else None
        return f"{code}:{number or 0}" if code is not None else ""
    status = _num(value)
    return f"{status >> 8}:{status & 0x7F}" if status is not None else ""


def _epoch(value: Any) -> datetime | None:
    number = _num(value)
    return datetime.fromtimestamp(number, timezone.utc) if number else None


_INFINITE32 = 0xFFFFFFFF
_NO_VAL32 = 0xFFFFFFFE
#: States in which a job holds its allocation (its gres_detail is what it holds).
_HOLDING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"})


def _time_limit_s(value: Any) -> float | None:
    """squeue's time_limit is minutes; 0, NO_VAL and INFINITE mean no limit."""
    minutes = _num(value)
    return None if not minutes or minutes in (_INFINITE32, _NO_VAL32) else minutes * 60.0


def _gres_gpus(text: str, job_id: str) -> list[tuple[str | None, int]]:
    """GPU entries of a tres_per_* string: ``gres:gpu:v100:4`` (22.05), ``gres/gpu:v100:4`` (24.11, 26.05: the
    TRES name's slash from 23.02 on) or ``gres/gpu:v100=4``."""
    out: list[tuple[str | None, int]] = []
    for item in split_top_level(text or ""):
        if not item.startswith(("gres:", "gres/")):
            continue
        fields = item[5:].replace("=", ":").split(":")
        if fields[0] != "gpu":
            continue
        if len(fields) > 3 or (len(fields) == 3 and not fields[2].isdigit()):
            raise SlurmOutputError(f"squeue --json: cannot read GPU request {item!r} of job {job_id}")
        if len(fields) == 1:
            out.append((None, 1))
        elif len(fields) == 2:
            out.append((None, int(fields[1])) if fields[1].isdigit() else (fields[1].lower(), 1))
        else:
            out.append((fields[1].lower(), int(fields[2])))
    return out


def _tres_gpus(text: str, job_id: str) -> list[tuple[str | None, int]]:
    """``gres/gpu:v100=4`` entries of a TRES string; an untyped remainder of ``gres/gpu=N`` as (None, n)."""
    try:
        tres = parse_tres(text or "")
    except SlurmOutputError as exc:
        raise SlurmOutputError(f"squeue --json: {exc} of job {job_id}") from None
    typed: list[tuple[str | None, int]] = [(k.split(":", 1)[1].lower(), int(v)) for k, v in tres.items()
                                            if k.startswith("gres/gpu:") and v > 0]
    rest = int(tres.get("gres/gpu", 0)) - sum(c for _, c in typed)
    return typed + ([(None, rest)] if rest > 0 else [])


def _held_gpus(job: dict[str, Any], state: str, job_id: str) -> tuple[tuple[str, str, int], ...]:
    """(node, type, count) a job holding its allocation has: gres_detail lists one entry per node of the
    expanded ``nodes``; a one-node job without it falls back to tres_alloc_str."""
    if state not in _HOLDING:
        return ()
    nodes_text = str(job.get("nodes", "") or "")
    try:
        hosts = expand_hostlist(nodes_text) if nodes_text else []
    except InputError as exc:
        raise SlurmOutputError(f"squeue --json: cannot read the nodes {nodes_text!r} of job {job_id}: {exc}") from None
    details = [str(d or "") for d in job.get("gres_detail") or []]
    out: list[tuple[str, str, int]] = []
    if details:
        if len(details) != len(hosts):
            raise SlurmOutputError(f"squeue --json: job {job_id} has {len(details)} gres_detail entries "
                                   f"for {len(hosts)} nodes ({nodes_text})")
        for host, detail in zip(hosts, details):
            try:
                entries = parse_gres(detail)
            except (SlurmOutputError, ValueError):
                raise SlurmOutputError(f"squeue --json: cannot read gres_detail {detail!r} of job {job_id}") from None
            for entry in entries:
                if entry.name == "gpu" and entry.count > 0:
                    out.append((host, (entry.type or "gpu").lower(), entry.count))
    elif len(hosts) == 1:
        out = [(hosts[0], gpu_type or "gpu", count)
               for gpu_type, count in _tres_gpus(str(job.get("tres_alloc_str", "") or ""), job_id)]
    return tuple(out)


def _gpu_request(job: dict[str, Any], job_id: str) -> tuple[tuple[str | None, int], ...]:
    """What a job asks for in total: tres_per_node times its node count, else tres_per_job, else tres_req_str."""
    per_node = _gres_gpus(str(job.get("tres_per_node", "") or ""), job_id)
    if per_node:
        count = _num(job.get("node_count")) or 1
        return tuple((gpu_type, n * count) for gpu_type, n in per_node)
    per_job = _gres_gpus(str(job.get("tres_per_job", "") or ""), job_id)
    if per_job:
        return tuple(per_job)
    return tuple(_tres_gpus(str(job.get("tres_req_str", "") or ""), job_id))


def _job_state(value: Any) -> str:
    """squeue's ``job_state`` as one word, as 22.05 prints it.

    From 23.02 on (24.11, 26.05) it is a list: the base state, then flags. A run whose processes are still
    being killed carries the COMPLETING flag beside what comes next, and the base state already says it:
    PREEMPTED while a preempted job may still requeue itself, PENDING once Slurm requeued it. 22.05 says
    COMPLETING for both (measured, tests/fixtures/slurm-*/squeue_json_preempt_*.json), and so does this: such a
    job still holds its GPUs and its end is not final yet.
    """
    if isinstance(value, list):
        words = [str(v) for v in value if v]
        return "COMPLETING" if "COMPLETING" in words else (words[0] if words else "UNKNOWN")
    return str(value or "UNKNOWN")


def parse_squeue_json(stdout: str) -> list[QueueRecord]:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise SlurmOutputError(f"squeue --json printed invalid JSON: {exc}") from exc
    # 22.05 quirk: with slurmctld unreachable, squeue --json exits 0 and reports the failure here.
    errors = data.get("errors") or []
    if errors:
        first = errors[0]
        raise SlurmOutputError(f"squeue reported: {first.get('description') or first.get('error')} "
                               f"({first.get('source', 'squeue')})")
    out = []
    for job in data.get("jobs", []):
        state = _job_state(job.get("job_state"))
        het_id = _num(job.get("het_job_id"))
        array_id = _num(job.get("array_job_id"))
        array_task = _num(job.get("array_task_id"))
        job_id = str(_num(job.get("job_id")))
        out.append(
            QueueRecord(
                job_id=job_id,
                het_job_id=str(het_id) if het_id else None,
                het_offset=_num(job.get("het_job_offset")) if het_id else None,
                array_job_id=str(array_id) if array_id else None,
                array_task=array_task if array_id else None,
                name=str(job.get("name", "")),
                state=state,
                reason=str(job.get("state_reason", "")),
                comment=str(job.get("comment", "") or ""),
                user=str(job.get("user_name", "")),
                nodes=str(job.get("nodes", "") or ""),
                submit=_epoch(job.get("submit_time")),
                start=_epoch(job.get("start_time")),
                end=_epoch(job.get("end_time")),
                alloc_tres=str(job.get("tres_alloc_str", "") or ""),
                partition=str(job.get("partition", "") or ""),
                account=str(job.get("account", "") or ""),
                qos=str(job.get("qos", "") or ""),
                priority=_num(job.get("priority")) or 0,
                time_limit_s=_time_limit_s(job.get("time_limit")),
                gpus=_held_gpus(job, state, job_id),
                gpu_request=_gpu_request(job, job_id),
                exit_code=_exit_code(job.get("exit_code")),
                restarts=_num(job.get("restart_cnt")) or 0,
                reservation=str(job.get("resv_name", "") or ""),
                eligible=_epoch(job.get("eligible_time")),
            )
        )
    return out


@dataclass(frozen=True)
class StoppingJob:
    """What ``scontrol show job --oneliner`` says of a job whose run was just told to stop.

    Measured on 22.05, 24.11 and 26.05 (tests/fixtures/slurm-*/scontrol_show_job_stop_*.txt): a job Slurm is
    cancelling, requeueing (``scontrol requeue``) or killing after a preemption's grace is COMPLETING from the
    moment its tasks get SIGTERM; one preempted within its partition's GraceTime is still RUNNING with its
    PreemptTime set; a job only signalled (``scancel --signal``) is RUNNING with PreemptTime None. A job a
    PreemptMode=CANCEL preemption ends is COMPLETING with its PreemptTime set and its Restarts unchanged: it
    can still requeue itself. One Slurm requeued (PreemptMode=REQUEUE, ``scontrol requeue``) is COMPLETING
    with Restarts one more than the run's SLURM_RESTART_COUNT and no PreemptTime; its next run starts with
    PreemptTime None.
    """

    #: JobState of each line: one per het component, else one.
    states: tuple[str, ...]
    preempt_time: datetime | None
    #: Slurm's requeue count of the job as it is now (the most over het components).
    restarts: int = 0

    @property
    def ending(self) -> bool:
        """Slurm itself is ending this run: whether the job runs again is Slurm's decision, not the job's."""
        return any(s != "RUNNING" for s in self.states)

    @property
    def preempted(self) -> bool:
        """A preemption stops this run, within its grace (RUNNING) or past it or with none (COMPLETING)."""
        return self.preempt_time is not None

    def requeued_since(self, run_restarts: int) -> bool:
        """Slurm already requeued the job since the run that asks began (its SLURM_RESTART_COUNT)."""
        return self.restarts > run_restarts


def parse_scontrol_job_stopping(text: str) -> StoppingJob:
    """``scontrol show job --oneliner ID`` of a running (or ending) job -> its ``StoppingJob``."""
    rows = [parse_oneliner(line) for line in text.splitlines() if line.strip()]
    states = tuple(row["JobState"] for row in rows if row.get("JobState"))
    if not states or len(states) != len(rows):
        raise SlurmOutputError(f"cannot read JobState from scontrol show job output {text.strip()[:200]!r}")
    preempt = [t for row in rows if (t := parse_slurm_time(row.get("PreemptTime", ""))) is not None]
    try:
        restarts = max(int(row.get("Restarts", "0") or 0) for row in rows)
    except ValueError:
        raise SlurmOutputError(f"cannot read Restarts from scontrol show job output {text.strip()[:200]!r}") from None
    return StoppingJob(states, min(preempt) if preempt else None, restarts)


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {Key: value}."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def parse_sdiag_dbd_backlog(text: str) -> int | None:
    """``sdiag``'s "DBD Agent queue size": records (job starts and ends among them) slurmctld holds for
    slurmdbd, which sacct does not show yet. None where sdiag does not say."""
    match = re.search(r"^DBD Agent queue size:\s*(\d+)\s*$", text, re.M)
    return int(match.group(1)) if match else None


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` -> (22, 5, 8)."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise SlurmOutputError(f"cannot read Slurm version from {text.strip()!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch)
