"""The Slurm client protocol and its command-line adapter (the primary one).

Query and parse are split: this module runs commands through the runner and
hands their text to the pure parsers. The optional pyslurm adapter
(``slurmhet.slurm.pyslurm_client``) implements the same protocol.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Protocol, Sequence

from slurmhet.cluster import Node
from slurmhet.slurm import limits, parsers
from slurmhet.slurm.limits import AssocRecord, PartitionRecord, PendingStart, QosRecord, ReservationRecord, UsageRecord
from slurmhet.slurm.parsers import AccountingRecord, QueueRecord
from slurmhet.slurm.runner import SlurmCommandError, SlurmRunner

_SQUEUE_CHUNK = 500  # ids per query, so thousands of jobs stay within argv limits


class SlurmClient(Protocol):
    """What slurmhet needs from Slurm, whichever way it talks to it."""

    def version(self) -> tuple[int, int, int]: ...
    def config(self) -> dict[str, str]: ...
    def nodes(self) -> list[Node]: ...
    def submit(self, options: Sequence[str], script: str) -> str: ...
    def queue(self, job_ids: Sequence[str] | None = None) -> list[QueueRecord]: ...
    def accounting(self, job_ids: Sequence[str] | None = None, since: datetime | None = None,
                   user: str | None = None) -> list[AccountingRecord]: ...
    def cancel(self, job_ids: Sequence[str]) -> None: ...
    def release_requeue_hold(self, job_ids: Sequence[str]) -> None: ...
    def accounting_backlog(self) -> int | None: ...
    def sbatch_help(self) -> str: ...
    def partitions(self) -> list[PartitionRecord]: ...
    def reservations(self) -> list[ReservationRecord]: ...
    def associations(self, user: str) -> list[AssocRecord]: ...
    def default_account(self, user: str) -> str: ...
    def qos(self) -> list[QosRecord]: ...
    def pending_starts(self) -> list[PendingStart]: ...
    def usage_history(self, since: datetime) -> list[UsageRecord]: ...


#: What scancel and scontrol say of a job that has already ended (or left the controller).
_ENDED = re.compile(r"already (finished|completing|completed)|Invalid job id specified")
# scontrol's answer when a held job started between squeue and the release: the release's aim, no failure.
_STARTED = re.compile(r"no longer pending execution")


class SlurmCli:
    """Talks to Slurm through sbatch/squeue/sacct/scontrol/scancel, via one runner."""

    def __init__(self, runner: SlurmRunner, timeout: float = 30.0) -> None:
        self.runner = runner
        self.timeout = timeout

    def _run(self, argv: Sequence[str], stdin: str | None = None) -> str:
        return self.runner.run(argv, stdin=stdin, timeout=self.timeout).stdout

    def version(self) -> tuple[int, int, int]:
        return parsers.parse_version(self._run(["sinfo", "--version"]))

    def config(self) -> dict[str, str]:
        return parsers.parse_scontrol_config(self._run(["scontrol", "show", "config"]))

    def nodes(self) -> list[Node]:
        return parsers.parse_scontrol_nodes(self._run(["scontrol", "show", "nodes", "--oneliner"]))

    def submit(self, options: Sequence[str], script: str) -> str:
        """Submit ``script`` (read by sbatch from stdin) with ``options``; returns the job id."""
        return parsers.parse_sbatch_parsable(self._run(["sbatch", "--parsable", *options], stdin=script))

    def queue(self, job_ids: Sequence[str] | None = None) -> list[QueueRecord]:
        if job_ids is not None and not job_ids:
            return []
        # --states=all: 22.05's squeue --json lists finished jobs still in the controller (MinJobAge) as
        # well, 24.11's and 26.05's only active ones unless asked; an orphan that finished before the
        # next replan would be missed there (seen on 24.11: resubmitted instead of adopted).
        if job_ids is None:
            return parsers.parse_squeue_json(self._run(["squeue", "--all", "--json", "--states=all"]))
        out: list[QueueRecord] = []
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), _SQUEUE_CHUNK):
            chunk = ids[start:start + _SQUEUE_CHUNK]
            out += parsers.parse_squeue_json(self._run(["squeue", "--all", "--json", "--states=all", "--jobs",
                                                        ",".join(chunk)]))
        wanted = set(ids)
        return [r for r in out if {r.job_id, r.root_id} & wanted]

    def accounting(self, job_ids: Sequence[str] | None = None, since: datetime | None = None,
                   user: str | None = None) -> list[AccountingRecord]:
        base = ["sacct", "--parsable2", "--noheader", "--format=" + ",".join(parsers.SACCT_FIELDS)]
        if since is not None:
            base += ["--starttime", since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")]
        if user is not None:
            base += ["--user", user]
        else:
            base += ["--allusers"]
        if job_ids is None:
            if since is None:
                base += ["--starttime", "1970-01-01"]
            return parsers.parse_sacct_parsable(self._run(base))
        if not job_ids:
            return []
        out: list[AccountingRecord] = []
        ids = sorted(set(job_ids))
        for start in range(0, len(ids), _SQUEUE_CHUNK):
            out += parsers.parse_sacct_parsable(self._run([*base, "--jobs", ",".join(ids[start:start + _SQUEUE_CHUNK])]))
        return out

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._run_unless_ended(["scancel", *job_ids])

    def release_requeue_hold(self, job_ids: Sequence[str]) -> None:
        """Let requeued jobs start as soon as Slurm can place them, not after the BeginTime Slurm set at the
        requeue (a job's owner may move its own begin time)."""
        for job_id in dict.fromkeys(job_ids):
            self._run_unless_ended(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], also=_STARTED)

    def _run_unless_ended(self, argv: Sequence[str], also: re.Pattern[str] | None = None) -> None:
        """Run a command on jobs that may have ended (or, for ``also``, moved on) since squeue listed them: that
        alone is no failure."""
        try:
            self._run(argv)
        except SlurmCommandError as exc:
            lines = [line for line in exc.stderr.splitlines() if line.strip()]
            if not lines or not all(_ENDED.search(line) or (also and also.search(line)) for line in lines):
                raise

    def accounting_backlog(self) -> int | None:
        """How many records slurmctld has yet to hand slurmdbd (sdiag); None when sdiag cannot say (it failed,
        or does not print the figure): then sacct is taken as it stands, as before this was asked."""
        try:
            return parsers.parse_sdiag_dbd_backlog(self._run(["sdiag"]))
        except SlurmCommandError:
            return None

    def sbatch_help(self) -> str:
        return self._run(["sbatch", "--help"])

    # ------------------------------------------------------------------ the shared cluster's limits
    # sacctmgr fails when accounting is off; associations/qos/default_account let that
    # SlurmCommandError through so the caller decides what "no accounting" means.

    def partitions(self) -> list[PartitionRecord]:
        return limits.parse_partitions(self._run(["scontrol", "show", "partition", "--oneliner"]))

    def reservations(self) -> list[ReservationRecord]:
        return limits.parse_reservations(self._run(["scontrol", "show", "reservation", "--oneliner"]))

    def associations(self, user: str) -> list[AssocRecord]:
        return limits.parse_assocs(self._run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}",
                                              "format=" + ",".join(limits.ASSOC_FIELDS)]))

    def default_account(self, user: str) -> str:
        return limits.parse_default_account(self._run(["sacctmgr", "-n", "-P", "show", "user", user,
                                                       "format=" + ",".join(limits.USER_FIELDS)]))

    def qos(self) -> list[QosRecord]:
        return limits.parse_qos(self._run(["sacctmgr", "-n", "-P", "show", "qos",
                                           "format=" + ",".join(limits.QOS_FIELDS)]))

    def pending_starts(self) -> list[PendingStart]:
        return limits.parse_pending_starts(self._run(["squeue", "--all", "--start", "--noheader",
                                                      "--format=" + limits.START_FORMAT]))

    def usage_history(self, since: datetime) -> list[UsageRecord]:
        """Finished GPU jobs of every user since ``since``: how much of their time limit they used."""
        return limits.parse_usage(self._run(["sacct", "--allusers", "-X", "--parsable2", "--noheader",
                                             "--starttime", since.astimezone().strftime("%Y-%m-%dT%H:%M:%S"),
                                             "--format=" + ",".join(limits.USAGE_FIELDS)]))
