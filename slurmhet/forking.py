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
  ``checkpoint_dir``) that the plan starts now or that wait. A copy is a gang on
  one node of one GPU type with the job's own per-copy GPU count (its planned
  count, or ``gpus.min`` for a waiting job); a job gets at most one copy per node
  (the paper's n copies for n nodes). A started job's first copy is its planned
  allocation. A job with fewer than two copies is not forked;
* ``offer_copies``: HadarE's rule for who gets the idle GPUs, one copy at a time
  to the job that would finish last (the simulator's slurmhet policy uses it too);
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
class CopyCandidate:
    """A job that may get copies: its own per-copy size, rates and progress, in any one consistent unit."""

    key: Any
    #: GPUs per copy (the job's own gang size).
    per_copy: int
    #: Work per second of one copy on each GPU type it may run on (absent or 0: not there).
    copy_rate: Mapping[str, float]
    #: Work left.
    remaining: float
    #: Work per second of what it already runs on (0 for a waiting job).
    rate: float = 0.0
    #: Nodes it already runs on (one copy per node).
    nodes: frozenset[str] = frozenset()


def offer_copies(candidates: Sequence[CopyCandidate], free: IdleGpus, limit: int) -> dict[Any, list[tuple[str, str]]]:
    """Give idle GPUs to candidates as copies, one copy at a time to the job predicted to finish last.

    HadarE (seed 003 V-A) forks so that no node idles while a job's copy is left, and its
    last rounds go to the job that runs longest; so each step picks the job with the
    latest finish (remaining / rate; a waiting job's is infinite), which takes a copy on
    its fastest type on a node it does not use yet (node names in order), until every
    job has ``limit`` copies (counting what it runs on) or nothing fits. Ties go to the
    larger gain, then to the earlier candidate. ``free`` is updated in place; returns
    the new copies per candidate key as ``(node, gpu type)``.
    """
    rate = [c.rate for c in candidates]
    nodes = [set(c.nodes) for c in candidates]
    out: dict[Any, list[tuple[str, str]]] = {}
    while True:
        best: tuple[tuple[float, float, int], int, tuple[str, str]] | None = None
        for i, cand in enumerate(candidates):
            if len(nodes[i]) >= limit:
                continue
            slot = next(((n, t) for t in sorted(cand.copy_rate, key=lambda t: -cand.copy_rate[t])
                         if cand.copy_rate[t] > 0
                         for (n, u), count in sorted(free.items())
                         if u == t and count >= cand.per_copy and n not in nodes[i]), None)
            if slot is None:
                continue
            finish = cand.remaining / rate[i] if rate[i] > 0 else math.inf
            score = (finish, cand.copy_rate[slot[1]], -i)
            if best is None or score > best[0]:
                best = (score, i, slot)
        if best is None:
            return out
        _, i, slot = best
        free[slot] -= candidates[i].per_copy
        rate[i] += candidates[i].copy_rate[slot[1]]
        nodes[i].add(slot[0])
        out.setdefault(candidates[i].key, []).append(slot)


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
    # Candidates in plan order, started jobs first (ties in offer_copies go to the earlier one).
    order = sorted((jid for jid in specs if jid in planned),
                   key=lambda jid: (planned[jid].allocation is None, planned[jid].order, jid))
    candidates, owned, job_rate, left = [], {}, {}, {}
    for jid in order:
        spec, job_plan = specs[jid], planned[jid]
        if not forkable(spec) or job_plan.colocation_group:
            continue
        remaining = spec.total_steps - steps_done.get(jid, 0)
        own = job_plan.allocation
        if remaining < 2 or (own is not None and len(own.slots) != 1):
            continue  # a gang spanning nodes or types stays a gang (a copy lives on one node of one type)
        try:
            rates, _ = job_rates(plan_job_from_spec(jid, spec, 0.0), table, usable.gpu_types)
        except InputError:
            continue
        per_copy = own.gpus if own is not None else spec.gpus.min
        owned[jid], job_rate[jid], left[jid] = own, rates, remaining
        candidates.append(CopyCandidate(  # samples and samples/s
            jid, per_copy, {t: r * per_copy for t, r in rates.items()}, remaining * spec.global_batch,
            rates[own.slots[0][1]] * per_copy if own is not None else 0.0,
            frozenset({own.slots[0][0]}) if own is not None else frozenset()))
    offered = offer_copies(candidates, dict(free), limit)
    out: dict[str, ForkedJob] = {}
    for cand in candidates:
        jid, own = cand.key, owned[cand.key]
        extra = [Allocation(((node, gpu_type, cand.per_copy),)) for node, gpu_type in offered.get(jid, [])]
        copies = ([own] if own is not None else []) + sorted(extra, key=lambda c: -job_rate[jid][c.slots[0][1]])
        fork = _steps_for(jid, specs[jid], copies, job_rate[jid], left[jid], round_s, rounds.get(jid, 0))
        if fork is not None:
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
