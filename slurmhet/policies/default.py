"""slurmhet's policy over time (key ``slurmhet``): the shipped planner, called at every decision.

What the simulator measures must be what ``slurmhet submit`` ships, so this policy
plans nothing itself: at every arrival and completion it turns the simulator's state
into a :class:`~slurmhet.planner.model.PlanningInput`, calls
``POLICIES["slurmhet"]`` (pipeline + ``hetero.allocate``) and turns the Plan back
into placements.

State -> PlanningInput
- Units: one *sample* is one worker-step (one task's per-GPU batch), so a job of
  scale ``k`` has ``global_batch = k`` samples per iteration (one all-reduce each)
  and ``samples_remaining`` = its remaining worker-steps.
- Throughputs: the table's cell for a job is ``type_rate(job_type, k, t) / k``
  = ``1 / tau_t``, the engine's own rate function at the job's scale, keyed per
  (job type, scale) as ``"<job type> @k"``. So Gavel's measured multi-GPU cells
  (and the engine's fallbacks, derived types, synthetic rates) enter the plan exactly
  as the engine uses them, and the planner's compute time (eq. 11,
  ``samples / sum of per-GPU rates``) equals the engine's proportional-sharding
  iteration time ``k / sum 1/tau`` times the iterations left.
- Communication: ``model_size_mb`` is the engine's gradient size, the inter-node link
  the cluster's; the intra-node link is infinite because the measured throughputs
  already include intra-node communication and the engine charges none. The planner
  does not model link contention between spread gangs nor the per-server latency
  (seed 004's f(alpha, k) and xi2); the engine charges both.
- GPUs: ``min_gpus = max_gpus`` = the trace's scale (``min_gpus = 1`` with ``elastic``); allowed types are those where the
  engine's rate is positive (e.g. no out-of-memory types); weight and arrival as traced.
- Ordering: the input goes through ``critical.with_critical_path`` first, as in ``slurmhet
  replan``: jobs on the critical path get priorities, longest first, so that no long job sets the
  makespan by starting last (``critical_share``; the rule and its numbers are in
  ``planner/critical.py`` and bench/README.md); when load sets the makespan, the other jobs keep
  to the types the fluid LP books for them (``load_bound``, ``planner/fluid.py``). Who runs, on
  which type, and which single-GPU jobs share a GPU is then one MILP over every job
  (``planner/joint.py``) where the decision is small and rigid, critical jobs forced in (their
  fastest GPUs only once arrivals stop); elsewhere the pipeline admits in priority, then weighted
  smallest-GPU-time (run time on the minimum GPUs times that minimum) order.
- Objective: with ``migrate`` the plan is revised at every decision, so the planner runs
  in its preemptive mode (``pin_running=False``): it maximises weighted progress now, each
  job's share of its best rate weighted by how little work it has left, which hands each
  GPU type to the jobs it speeds up most, the shorter ones first, and critical jobs first,
  instead of minimising ``sum w_j T_j`` as if every job kept its GPUs to the end (see
  ``planner.problem``).
- Moves: a round-based policy charges a moved job ``restart_s / round_s`` of its progress term
  (``move_penalty``), so the plan keeps a job where it is unless moving it pays for the restart.
- Start-up: a job that never ran is charged ``startup_s`` = the engine's ``start_s`` (what its
  first start costs), so the plan's run times are the engine's; a paused job's restart is not.
- Running jobs: ``current`` is their allocation and ``pin_running = not migrate``; see
  ``migrate`` for the choice and bench/README.md (Reproductions) for the numbers. The
  planner keeps a re-planned job on its current slots when its GPU counts are unchanged
  (``hetero.pack_in_place``), so a re-plan restarts only the jobs it really changes.
- Co-location: single-GPU jobs allow it. The simulator knows no per-job memory, but
  Gavel's pair measurements already encode whether a pair fits (an out-of-memory pair
  is measured as 0 and never offered), so every job declares ``NOMINAL_MEMORY_GB`` to
  pass the planner's memory check, and groups are pairs (``max_group = 2``) because
  only pairs are measured. The table carries the measured pairs as the engine prices
  them (``RateModel.colocated_rates``), so ``colocation.speedup`` predicts the rates
  the engine will apply; the joint MILP weighs every pair on every type against running
  its members alone (where it does not run, each waiting job joins the running job it
  pairs best with, ``colocation._join_best_pairs``).

Plan -> placements: a JobPlan with an allocation runs on exactly its Allocation slots
(node, type, count) as one gang; jobs without one wait (are paused). Jobs with the same
``colocation_group`` are returned as a shared group of the ``Decision``.
"""

from __future__ import annotations

import math
from collections import defaultdict

from slurmhet.cluster import Inventory, Node
from slurmhet.forking import CopyCandidate, offer_copies
from slurmhet.planner.critical import CRITICAL_SHARE, LOAD_BOUND, with_critical_path
from slurmhet.planner.model import Allocation, ColocationSettings, JobPlan, PlanJob, PlanningInput
from slurmhet.planner.registry import POLICIES
from slurmhet.policies.base import ClusterView, Decision, JobState, Placement, TimePolicy, make_gang
from slurmhet.throughput import ThroughputEntry, ThroughputTable, canonical_key

#: Memory every single-GPU job declares for the planner's co-location check (see the module doc).
NOMINAL_MEMORY_GB = 1.0


def never_started(job: JobState) -> bool:
    """Never started: the engine charges its next start ``start_s`` (a restarted job pays ``restart_s``)."""
    return not job.running and job.remaining >= job.total_steps


def workload_of(job: JobState) -> str:
    """The table key of a job: its type at its scale (per-GPU rates differ between scales)."""
    return canonical_key(f"{job.job_type} @{job.gpus}")


class SlurmhetOverTime(TimePolicy):
    key = "slurmhet"
    sharding = "proportional"
    colocates = True
    #: False: running jobs are pinned (``pin_running=True``), as ``slurmhet submit`` plans a live cluster.
    #: True: every decision re-plans every job, so the plan may preempt or move running jobs (each move
    #: pays the engine's checkpoint-restart).
    migrate = True
    #: A job whose remaining time is at least this share of the makespan lower bound is critical.
    critical_share = CRITICAL_SHARE
    #: Jobs keep to the fluid LP's types when its makespan is at least this many times the longest job's.
    load_bound = LOAD_BOUND
    colocation = ColocationSettings(max_group=2)
    #: Fork jobs into copies on the GPUs the plan leaves idle (HadarE's Job Forker, ``forking.job_forker``'s
    #: rules), as ``slurmhet submit`` does for ``sync: local-sgd`` jobs; a set-up whose jobs may all be
    #: forked uses :class:`SlurmhetForking` (``forks`` is the base class's flag).
    #: Jobs may run on fewer GPUs than their scale (``min_gpus = 1``), as a spec with ``gpus.min < gpus.max``
    #: does under slurmhet's proportional sharding; a set-up whose jobs all may uses :class:`SlurmhetRelaxed`.
    elastic = False
    #: Seconds a moved job loses (the papers' checkpoint-restart). A round-based policy knows the time to its
    #: next decision, so its plan charges a move ``restart_s / round_s`` of the job's progress
    #: (``PlanningInput.move_penalty``); one deciding at every arrival and completion does not.
    restart_s = 10.0

    def decide(self, view: ClusterView) -> Decision:
        if not view.jobs:
            return Decision()
        plan = POLICIES["slurmhet"](self.planning_input(view))
        placements, groups = {}, defaultdict(list)
        for job_plan in plan.jobs:
            if job_plan.allocation is None:
                continue
            job_id = int(job_plan.job_id)
            placements[job_id] = (make_gang({(n, t): c for n, t, c in job_plan.allocation.slots}),)
            if job_plan.colocation_group:
                groups[job_plan.colocation_group].append(job_id)
        if self.forks:
            fork_onto_idle(view, sorted(plan.jobs, key=lambda jp: (jp.allocation is None, jp.order, jp.job_id)),
                           placements)
        return Decision(placements, (tuple(sorted(g)) for g in groups.values()))

    def planning_input(self, view: ClusterView) -> PlanningInput:
        types = view.gpu_types()
        nodes = defaultdict(dict)
        for (node, gpu_type), count in view.capacity.items():
            nodes[node][gpu_type] = count
        inventory = Inventory(tuple(Node(n, nodes[n]) for n in view.node_order if n in nodes),
                              intra_node_gbps=math.inf, inter_node_gbps=view.inter_node_gbps)
        guests = {j for group in view.shared for j in group[1:]}  # pinned once: the GPU counts once
        jobs = []
        for job in view.jobs:
            allowed = tuple(t for t in types if view.rates.type_rate(job.job_type, job.gpus, t) > 0)
            current = None
            if job.running and job.job_id not in guests:
                current = Allocation(tuple(slot for gang in job.placement for slot in gang))
            jobs.append(PlanJob(
                id=str(job.job_id), workload=workload_of(job), samples_remaining=max(job.remaining, 1e-9),
                global_batch=job.gpus, model_size_mb=1000.0 * view.rates.model_gb(job.job_type),
                min_gpus=1 if self.elastic else job.gpus, max_gpus=job.gpus, allowed_types=allowed, weight=job.weight,
                colocate=job.gpus == 1,
                gpu_memory_gb=NOMINAL_MEMORY_GB if job.gpus == 1 else None, submitted_at=job.arrival,
                current=current, startup_s=view.start_s if never_started(job) else 0.0))
        penalty = min(self.restart_s / self.round_s, 0.5) if self.round_s and self.migrate else 0.0
        return with_critical_path(PlanningInput(tuple(jobs), inventory, self.throughput_table(view), view.now,
                                                pin_running=not self.migrate, colocation=self.colocation,
                                                seed=self.seed, move_penalty=penalty, max_wait_s=self.max_wait_s),
                                  self.critical_share, self.load_bound)

    @staticmethod
    def throughput_table(view: ClusterView) -> ThroughputTable:
        """Per-GPU samples/s from the engine's rate function, plus the measured pairs it prices co-location by."""
        entries: dict[tuple[str, str], ThroughputEntry] = {}
        singles: dict[str, str] = {}
        for job in view.jobs:
            key = workload_of(job)
            if job.gpus == 1:
                singles[key] = job.job_type
            for gpu_type in view.gpu_types():
                rate = view.rates.type_rate(job.job_type, job.gpus, gpu_type) / job.gpus
                if rate > 0:
                    entries[(key, gpu_type)] = ThroughputEntry(rate, "measured", "simulator rate model")
        pairs = {}
        for a, type_a in singles.items():
            for b, type_b in singles.items():
                for gpu_type in view.gpu_types():
                    both = view.rates.colocated_rates((type_a, type_b), gpu_type)
                    if both is not None:
                        pairs[(a, b, gpu_type)] = both
        return ThroughputTable(entries, pairs)


class SlurmhetForking(SlurmhetOverTime):
    """``slurmhet`` where every job may be forked (seed 003 VI-B's set-up): it decides every round,
    because copies are consolidated at each round's end, as HadarE and the live replanner do.

    No critical-path priorities: the idle GPUs' copies go to the job that would finish last, which
    shortens the tail the priorities guard against, while a priority that lets unstarted long jobs
    preempt started ones every round makes the jobs take turns (``hadare`` avg JCT 8-24% above HadarE's
    with them, within 2% without; bench/README.md). Nor are its jobs' types narrowed to the fluid LP's
    booking: a forked job runs copies on whatever types are idle, and with the booking ``hadare`` avg JCT
    was 4-11% worse on M-3, M-8, M-10 and M-12.
    """

    round_based = True
    forks = True
    critical_share = math.inf
    load_bound = math.inf


class SlurmhetRelaxed(SlurmhetOverTime):
    """``slurmhet`` where every job may run on fewer GPUs than its scale (seed 000's set-up: Hare's relaxed
    scale-fixed synchronisation runs a round's k tasks on fewer GPUs). slurmhet does it with proportional
    sharding, a job's global batch split over the GPUs it has (``gpus.min < gpus.max`` in a spec), so the
    planner may start a job on the GPUs that are free instead of holding it until its full gang is."""

    elastic = True


class SlurmhetReplanned(SlurmhetOverTime):
    """``slurmhet`` as ``slurmhet replan`` runs it on a live cluster: it decides only at the replan
    ticks (every ``round_s``, cron) and never moves a running job."""

    round_based = True
    migrate = False


def fork_onto_idle(view: ClusterView, plan_order: list[JobPlan], placements: dict[int, Placement]) -> None:
    """Fork jobs onto the GPUs the plan leaves idle, by ``forking.offer_copies`` (HadarE's rule, as
    ``forking.job_forker`` applies it live): one copy at a time to the job that would finish last.

    As ``job_forker``: a copy is a gang on one node of one type of the job's own size, one per node; a
    gang spanning nodes or types and a co-located job stay as they are; fewer than two copies is no fork.
    """
    jobs = {j.job_id: j for j in view.jobs}
    candidates = []
    for job_plan in plan_order:
        job = jobs[int(job_plan.job_id)]
        own = placements.get(job.job_id, ())
        if job_plan.colocation_group or (own and len(own[0]) != 1):
            continue
        candidates.append(CopyCandidate(
            job.job_id, job.gpus, {t: view.rates.type_rate(job.job_type, job.gpus, t) for t in view.runnable_types(job)},
            job.remaining, view.rates.rate(job.job_type, job.gpus, own), frozenset(g[0][0] for g in own)))
    free = view.free(placements.values())
    offered = offer_copies(candidates, {k: c for k, c in free.counts.items() if c > 0},
                           len({n for n, _ in view.capacity}))
    for job_id, slots in offered.items():
        copies = placements.get(job_id, ()) + tuple(((node, gpu_type, jobs[job_id].gpus),) for node, gpu_type in slots)
        if len(copies) >= 2:
            placements[job_id] = copies
