"""Optional pyslurm adapter behind the ``SlurmClient`` protocol.

pyslurm binds one Slurm major version (pyslurm 25.11 needs Slurm 25.11), so it is
used only when it imports *and* its version matches the running Slurm; otherwise
``available()`` says why and slurmhet uses the command-line client. Submission
still goes through sbatch (the runner): sbatch's option parsing is the reference
behaviour, and pyslurm's submit API differs across majors.
"""

from __future__ import annotations

import importlib
from datetime import datetime
from types import ModuleType
from typing import Any, Sequence

from slurmhet.cluster import Node
from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.limits import AssocRecord, PartitionRecord, PendingStart, QosRecord, ReservationRecord, UsageRecord
from slurmhet.slurm.parsers import AccountingRecord, QueueRecord, SlurmJobId, parse_gres, parse_tres


def available(slurm_version: tuple[int, int, int]) -> tuple[ModuleType | None, str]:
    """(pyslurm, "") when usable with this Slurm, else (None, the reason)."""
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as exc:
        return None, f"pyslurm is not installed ({exc})"
    version = str(getattr(module, "__version__", "0.0"))
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    if major_minor != slurm_version[:2]:
        return None, f"pyslurm {version} does not match Slurm {'.'.join(map(str, slurm_version))}"
    return module, ""


class PyslurmClient:
    """Reads nodes and accounting through pyslurm's object API (pyslurm >= 23.2); the queue as the CLI does."""

    def __init__(self, module: ModuleType, cli: SlurmCli) -> None:
        self.pyslurm = module
        self.cli = cli  # submit/cancel/config keep using the runner

    def version(self) -> tuple[int, int, int]:
        return self.cli.version()

    def config(self) -> dict[str, str]:
        return self.cli.config()

    def sbatch_help(self) -> str:
        return self.cli.sbatch_help()

    # Partitions, reservations, associations, QOS and expected starts are read through the
    # runner too: one parsed format for both adapters, and pyslurm's APIs for them differ by major.

    def partitions(self) -> list[PartitionRecord]:
        return self.cli.partitions()

    def reservations(self) -> list[ReservationRecord]:
        return self.cli.reservations()

    def associations(self, user: str) -> list[AssocRecord]:
        return self.cli.associations(user)

    def default_account(self, user: str) -> str:
        return self.cli.default_account(user)

    def qos(self) -> list[QosRecord]:
        return self.cli.qos()

    def pending_starts(self) -> list[PendingStart]:
        return self.cli.pending_starts()

    def usage_history(self, since: datetime) -> list[UsageRecord]:
        return self.cli.usage_history(since)

    def nodes(self) -> list[Node]:
        out = []
        for name, node in self.pyslurm.Nodes.load().items():
            gpus: dict[str, int] = {}
            mps = shards = 0
            for entry in parse_gres(",".join(f"{k}:{v}" for k, v in (node.configured_gres or {}).items())):
                if entry.name == "gpu":
                    gpus[entry.type or "gpu"] = gpus.get(entry.type or "gpu", 0) + entry.count
                mps += entry.count if entry.name == "mps" else 0
                shards += entry.count if entry.name == "shard" else 0
            out.append(Node(name, gpus, tuple(node.available_features or ()), str(node.state).lower(),
                            int(node.total_cpus or 0), int(node.real_memory or 0), mps=mps, shards=shards))
        return out

    def submit(self, options: Sequence[str], script: str) -> str:
        return self.cli.submit(options, script)

    def cancel(self, job_ids: Sequence[str]) -> None:
        self.cli.cancel(job_ids)

    def release_requeue_hold(self, job_ids: Sequence[str]) -> None:
        self.cli.release_requeue_hold(job_ids)

    def accounting_backlog(self) -> int | None:
        return self.cli.accounting_backlog()

    def queue(self, job_ids: Sequence[str] | None = None) -> list[QueueRecord]:
        """squeue --json through the runner, as the command-line client reads it: the open world needs every
        field of a record (GPUs held per node, requests, partition, priority, time limit, reservation), which
        pyslurm's job objects name differently from one major to the next, and the parser is tested against
        recordings of each Slurm series slurmhet supports."""
        return self.cli.queue(job_ids)

    def accounting(self, job_ids: Sequence[str] | None = None, since: datetime | None = None,
                   user: str | None = None) -> list[AccountingRecord]:
        kwargs: dict[str, Any] = {}
        if job_ids is not None:
            kwargs["ids"] = list(job_ids)
        if since is not None:
            kwargs["start_time"] = since
        if user is not None:
            kwargs["users"] = [user]
        jobs = self.pyslurm.db.Jobs.load(self.pyslurm.db.JobFilter(**kwargs))
        return [
            AccountingRecord(
                id=SlurmJobId(str(job.het_job_id or job.array_id or job.id),
                              het_offset=job.het_job_offset if job.het_job_id else None,
                              array_task=job.array_task_id if job.array_id else None),
                raw_id=str(job.id), name=job.name or "", state=str(job.state).split(" ")[0],
                exit_code=f"{job.exit_code or 0}:{job.exit_code_signal or 0}",
                submit=job.submit_time and datetime.fromtimestamp(job.submit_time),
                start=job.start_time and datetime.fromtimestamp(job.start_time),
                end=job.end_time and datetime.fromtimestamp(job.end_time),
                elapsed_s=int(job.elapsed_time or 0), alloc_tres=parse_tres(job.allocated_tres_str or ""),
                nodes=job.nodelist or "", comment=(job.comment or {}).get("job", "") if isinstance(job.comment, dict)
                else (job.comment or ""), user=job.user_name or "", partition=job.partition or "",
            )
            for job in jobs.values()
        ]
