"""The caller's place on a shared cluster: what they may use, refused before Slurm does, and the planner's facts.

slurmhet shares its cluster with users who never heard of it. Each command reads the
cluster once (:func:`read_shared`), refuses a spec its user cannot run there
(:func:`check_access`: partition, account, QOS, GPU types, GPU caps, exit 2 before
anything is stored), and keeps the user's jobs to the GPU types they may reach
(:func:`within_reach`, :func:`narrowed`).
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from slurmhet.cluster import Inventory, OpenWorld
from slurmhet.errors import InputError
from slurmhet.planner import PlanJob
from slurmhet.slurm.client import SlurmClient
from slurmhet.slurm.parsers import QueueRecord
from slurmhet.slurm.world import Access, SlurmWorld, access_of, open_world, read_world
from slurmhet.spec import JobSpec


#: Minutes a job without ``time_limit`` asks for (the submitit path's default as well).
DEFAULT_TIME_LIMIT_MIN = 60


def user_groups(user: str) -> tuple[str, ...]:
    """The unix groups of ``user`` (partitions may AllowGroups)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return ()
    return tuple(grp.getgrgid(g).gr_name for g in os.getgrouplist(user, entry.pw_gid) if _has_group(g))


def _has_group(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def spec_option(spec: JobSpec, *names: str) -> str | None:
    """The value of an sbatch option the spec sets itself (``--partition=x`` in its ``sbatch:`` list)."""
    for name, value in spec.sbatch:
        if name in names:
            return value
    return None


@dataclass(frozen=True)
class SharedCluster:
    """The shared cluster as one command sees it: what Slurm said, what the user may use, the planner's facts."""

    world: SlurmWorld
    access: Access
    facts: OpenWorld

    def partitions(self) -> dict[str, str]:
        """GPU type -> the partition its jobs are submitted to."""
        out = {}
        for gpu_type in self.access.types:
            name = self.access.partition_for(gpu_type, self.world)
            if name is not None:
                out[gpu_type] = name
        return out

    def with_queue(self, queue: Sequence[QueueRecord], store_tag: str, now: float) -> SharedCluster:
        """The same cluster seen with a fresher queue: partitions, limits, reservations and history
        change slowly, so a command that re-reads the queue under its lock need not re-read them."""
        world = replace(self.world, queue=tuple(queue))
        return replace(self, world=world, facts=open_world(world, store_tag, self.access, now,
                                                            self.facts.lookahead_s))


def read_shared(client: SlurmClient, queue: Sequence[QueueRecord], store_tag: str, user: str, now: float,
                specs: Sequence[JobSpec] = ()) -> SharedCluster:
    """Read the shared cluster once and derive the caller's access and the planner's capacity facts.

    Holds starting within the longest time limit of ``specs`` already count now: Slurm starts no
    job on nodes that a reservation claims before the job's limit ends.
    """
    world = read_world(client, user, queue)
    access = access_of(world, user, user_groups(user))
    lookahead = 60.0 * max((s.time_limit_min or DEFAULT_TIME_LIMIT_MIN for s in specs), default=DEFAULT_TIME_LIMIT_MIN)
    return SharedCluster(world, access, open_world(world, store_tag, access, now, lookahead))


def check_access(spec: JobSpec, shared: SharedCluster) -> None:
    """Refuse, before Slurm does, a spec the user cannot run here: a partition, account or QOS they may not
    use, GPU types none of their partitions hold, or more GPUs than their limits allow at once."""
    world, access = shared.world, shared.access
    account = spec_option(spec, "account", "A")
    qos = spec_option(spec, "qos", "q")
    if account or qos:
        access = access_of(world, access.user, user_groups(access.user), account, qos)
        if world.accounting and account and not any(a.account == account and a.user == access.user
                                                    for a in world.assocs):
            raise InputError(f"job {spec.name!r}: user {access.user} may not use account {account!r}",
                             place=spec.place("sbatch"), hint="sacctmgr show assoc user=$USER lists your accounts")
        # An association's QOS list (empty: inherited from its parent, which slurmhet does not read).
        allowed_qos = sorted({q for a in world.assocs if a.user == access.user and a.account == access.account
                              for q in a.qos if q})
        if world.accounting and qos and allowed_qos and qos not in allowed_qos:
            raise InputError(f"job {spec.name!r}: user {access.user} may not use QOS {qos!r} under account "
                             f"{access.account}", place=spec.place("sbatch"),
                             hint="allowed QOS: " + ", ".join(allowed_qos))
    partition = spec_option(spec, "partition", "p")
    if partition:
        if partition not in {p.name for p in world.partitions}:
            raise InputError(f"job {spec.name!r}: no partition {partition!r} in this cluster", place=spec.place("sbatch"),
                             hint="partitions: " + ", ".join(p.name for p in world.partitions))
        if partition in access.refused:
            raise InputError(f"job {spec.name!r}: partition {partition!r} is not open to you: "
                             f"{access.refused[partition]}", place=spec.place("sbatch"),
                             hint="usable partitions: " + (", ".join(access.partitions) or "none"))
    wanted = spec.gpus.types or tuple(world.inventory.gpus_by_type())
    reach = [t for t in wanted if t in access.types]
    if not reach:
        why = "; ".join(sorted(set(access.refused.values()))) or "no usable partition holds them"
        raise InputError(f"job {spec.name!r}: none of its GPU types ({', '.join(wanted)}) is in a partition you "
                         f"may use ({why})", place=spec.place("gpus"),
                         hint="usable GPU types: " + (", ".join(access.types) or "none"))
    for cap, source in ((access.gpu_cap, access.cap_source), (access.job_gpu_cap, access.job_cap_source)):
        if cap is not None and spec.gpus.min > cap:
            raise InputError(f"job {spec.name!r}: needs {spec.gpus.min} GPUs at once but {source} allows {cap}",
                             place=spec.place("gpus"), hint=f"lower gpus.min to {cap} or ask for a larger limit")


def within_reach(owners: Mapping[int, str], shared: SharedCluster | None,
                 only: Mapping[int, tuple[str, ...]] | None = None) -> dict[int, tuple[str, ...]]:
    """Job id -> the GPU types it may be planned onto: for the caller's own jobs (``owners``: id -> user),
    those the caller may reach (others' jobs are as stored), further kept to ``only`` where given."""
    reach = {} if shared is None else {job_id: shared.access.types for job_id, owner in owners.items()
                                       if owner == shared.access.user}
    for job_id, types in (only or {}).items():
        reach[job_id] = tuple(t for t in types if job_id not in reach or t in reach[job_id])
    return reach


def narrowed(job: PlanJob, reach: tuple[str, ...] | None, inventory: Inventory) -> PlanJob:
    """``job`` allowed only the types in ``reach`` (a running job keeps what it runs on)."""
    if reach is None or job.current is not None:
        return job
    types = tuple(t for t in (job.allowed_types or inventory.gpu_types) if t in reach)
    return replace(job, allowed_types=types) if types != job.allowed_types else job
