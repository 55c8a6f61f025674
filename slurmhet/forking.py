"""HadarE's Job Forker (seed 003 section V): fork a job into copies on otherwise idle nodes (pure).

Hadar places each job on its planned allocation; GPUs left idle after the
plan are wasted for the round. HadarE forks a job into copies, one per
available node, each training the job's model on its own data order for its
share of the round's steps; the Job Tracker then aggregates the steps and
weight-averages the copies' models (``slurmhet consolidate``) before the next
round is planned (``slurmhet replan``).

Here, after the plan's own allocations:

* ``idle_gpus``: what the plan leaves free on nodes no foreign job uses;
* ``job_forker``: offers those GPUs to forkable jobs (``sync: local-sgd`` with a
  ``checkpoint_dir``) that the plan starts now, then to those that wait. A copy
  is a gang on one node of one GPU type with the job's own per-copy GPU count
  (its planned count, or ``gpus.min`` for a waiting job); a job gets at most one
  copy per node (the paper's n copies for n nodes). A started job's first copy
  is its planned allocation. A job with fewer than two copies is not forked;
* ``round_steps``: the round's steps, a round length in seconds x the copies'
  aggregate throughput / global batch, capped by the steps left;
* ``divide_round_steps``: HadarE's throughput-proportional step assignment
  (largest remainder, so the portions sum to the round's steps exactly).

Nothing here talks to Slurm or the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from slurmhet.cluster import Inventory
from slurmhet.errors import InputError
from slurmhet.planner.model import Allocation, Plan, job_rates, plan_job_from_spec
from slurmhet.spec import JobSpec
from slurmhet.throughput import ThroughputTable

#: Seconds per round when nothing else is configured (the paper's best slot for large mixes is 360 s).
DEFAULT_ROUND_S = 360.0
#: GPUs free on (node, GPU type).
IdleGpus = dict[tuple[str, str], int]


@dataclass(frozen=True)
class ForkedJob:
    """One job's copies for one round: ``copies[i]`` trains ``round_steps[i]`` steps at ``rates[i]`` samples/s."""

    job_id: str
    round: int
    copies: tuple[Allocation, ...]
    round_steps: tuple[int, ...]
    rates: tuple[float, ...]

    @property
    def total_round_steps(self) -> int:
        return sum(self.round_steps)

    @property
    def slots(self) -> tuple[tuple[str, str, int], ...]:
        """All GPUs the copies hold, as one allocation's slots (what the store pins while the round runs)."""
        return tuple(s for c in self.copies for s in c.slots)

    def record(self) -> dict[str, Any]:
        return {"round": self.round, "copies": [list(c.slots[0]) for c in self.copies],
                "round_steps": list(self.round_steps), "rates": [round(r, 3) for r in self.rates]}


def idle_gpus(plan: Plan, inventory: Inventory, busy_nodes: Iterable[str] = ()) -> IdleGpus:
    """GPUs of usable nodes that no job of the plan holds; nodes in ``busy_nodes`` (foreign jobs) offer none."""
    busy = set(busy_nodes)
    free: IdleGpus = {}
    for node in inventory.usable().nodes:
        if node.name in busy:
            continue
        for gpu_type, count in node.gpus.items():
            if count > 0:
                free[(node.name, gpu_type)] = count
    for job_plan in plan.jobs:
        if job_plan.allocation is None:
            continue
        for node_name, gpu_type, count in job_plan.allocation.slots:
            key = (node_name, gpu_type)
            if key in free:
                free[key] = max(0, free[key] - count)
    return {k: v for k, v in free.items() if v > 0}


def round_steps(aggregate_samples_per_s: float, round_s: float, global_batch: int, remaining_steps: int) -> int:
    """The round's steps: what the copies together train in ``round_s`` seconds, at least 1, at most what is left."""
    if global_batch < 1 or round_s <= 0:
        raise InputError(f"round of {round_s:g} s at global batch {global_batch}", place="round_s",
                         hint="a positive round length and global batch")
    steps = math.floor(round_s * aggregate_samples_per_s / global_batch)
    return max(0, min(remaining_steps, max(1, steps)))


def divide_round_steps(total: int, rates: Sequence[float]) -> tuple[int, ...]:
    """Throughput-proportional step assignment (HadarE V-B): copy i gets total x rate_i / sum(rates).

    Largest remainder (ties to the earlier copy), so the portions sum to ``total``.
    """
    if not rates or any(r <= 0 for r in rates):
        raise InputError(f"copy throughputs {list(rates)}", place="rates", hint="every copy needs a rate > 0")
    whole = sum(rates)
    exact = [total * r / whole for r in rates]
    steps = [math.floor(e) for e in exact]
    left = total - sum(steps)
    for i in sorted(range(len(rates)), key=lambda i: (-(exact[i] - steps[i]), i))[:left]:
        steps[i] += 1
    return tuple(steps)


def forkable(spec: JobSpec) -> bool:
    """A job HadarE may fork: local SGD, a checkpoint dir to consolidate in, a command to run as an array."""
    return spec.forkable and bool(spec.checkpoint_dir) and bool(spec.command) and not spec.entrypoint


def job_forker(plan: Plan, inventory: Inventory, table: ThroughputTable, ready: Mapping[Any, JobSpec], *,
               steps_done: Mapping[Any, int] | None = None, rounds: Mapping[Any, int] | None = None,
               round_s: float = DEFAULT_ROUND_S, busy_nodes: Iterable[str] = (),
               max_copies: int | None = None) -> dict[str, ForkedJob]:
    """HadarE's Job Forker: which of the ``ready`` jobs run as copies this round, keyed by plan job id.

    ``ready`` maps job ids (as the plan names them, or ints) to specs of jobs about to be dispatched;
    ``steps_done``/``rounds`` give their progress and the round to emit (default 0). ``max_copies``
    defaults to the number of usable nodes (one copy per node).
    """
    steps_done = {str(k): v for k, v in (steps_done or {}).items()}
    rounds = {str(k): v for k, v in (rounds or {}).items()}
    usable = inventory.usable()
    limit = max_copies if max_copies is not None else len(usable.nodes)
    free = idle_gpus(plan, inventory, busy_nodes)
    planned = {jp.job_id: jp for jp in plan.jobs}
    specs = {str(k): v for k, v in ready.items()}
    # Jobs the plan starts now are offered idle GPUs first, then those that wait; each in plan order.
    order = sorted((jid for jid in specs if jid in planned),
                   key=lambda jid: (planned[jid].allocation is None, planned[jid].order, jid))
    out: dict[str, ForkedJob] = {}
    for jid in order:
        spec, job_plan = specs[jid], planned[jid]
        if not forkable(spec) or job_plan.colocation_group:
            continue
        remaining = spec.total_steps - steps_done.get(jid, 0)
        if remaining < 2:
            continue
        own = job_plan.allocation
        if own is not None and len(own.slots) != 1:
            continue  # a gang spanning nodes or types stays a gang (a copy lives on one node of one type)
        per_copy = own.gpus if own is not None else spec.gpus.min
        try:
            rates, _ = job_rates(plan_job_from_spec(jid, spec, 0.0), table, usable.gpu_types)
        except InputError:
            continue
        copies: list[Allocation] = [own] if own is not None else []
        used_nodes = {own.slots[0][0]} if own is not None else set()
        offers = sorted(((node, gpu_type) for (node, gpu_type), n in free.items()
                         if n >= per_copy and rates.get(gpu_type, 0) > 0),
                        key=lambda k: (-rates[k[1]], k[0], k[1]))
        for node, gpu_type in offers:
            if len(copies) >= limit:
                break
            if node in used_nodes or free.get((node, gpu_type), 0) < per_copy:
                continue
            copies.append(Allocation(((node, gpu_type, per_copy),)))
            used_nodes.add(node)
        if own is None:
            copies.sort(key=lambda c: -rates[c.slots[0][1]])
        fork = _steps_for(jid, spec, copies, rates, remaining, round_s, rounds.get(jid, 0))
        if fork is None:
            continue
        for copy in fork.copies:
            if copy is own:
                continue
            node, gpu_type, count = copy.slots[0]
            free[(node, gpu_type)] -= count
        out[jid] = fork
    return out


def _steps_for(jid: str, spec: JobSpec, copies: list[Allocation], rates: Mapping[str, float], remaining: int,
               round_s: float, round_no: int) -> ForkedJob | None:
    """Assign the round's steps; drop the slowest copies while one would get no step. None: fewer than 2 left."""
    # The planned allocation (first, if any) stays; extras are dropped slowest first.
    copies = copies[:1] + sorted(copies[1:], key=lambda c: -rates[c.slots[0][1]] * c.gpus) if copies else []
    while len(copies) >= 2:
        copy_rates = [rates[c.slots[0][1]] * c.gpus for c in copies]
        total = round_steps(sum(copy_rates), round_s, spec.global_batch, remaining)
        steps = divide_round_steps(total, copy_rates)
        if min(steps) >= 1:
            return ForkedJob(jid, round_no, tuple(copies), steps, tuple(copy_rates))
        copies = copies[:-1]
    return None
