"""Planners: pure functions ``PlanningInput -> Plan`` (see DESIGN.md, seeds 001 and 002); the
policies over time that the simulator runs (the papers' schedulers) live in :mod:`slurmhet.policies`.

Use ``POLICIES[key](planning_input, progress=None)``; ``DEFAULT_POLICY`` is
slurmhet's own planner. :func:`plan_job_from_spec` turns a user's JobSpec into
the :class:`PlanJob` planners read; :mod:`slurmhet.planner.render` formats plans.
"""

from slurmhet.planner.bound import Bound, lower_bound
from slurmhet.planner.colocation import ColocationGroup, speedup
from slurmhet.planner.model import (
    Allocation, ColocationSettings, JobPlan, Plan, PlanJob, PlanningInput, Progress, allreduce_seconds,
    epoch_seconds, is_overdue, jain_fairness, plan_job_from_spec, run_seconds, shard_weights,
)
from slurmhet.planner.pipeline import build_problem
from slurmhet.planner.registry import DEFAULT_POLICY, POLICIES, QUEUE_PREPARE

__all__ = [
    "Allocation", "Bound", "ColocationGroup", "ColocationSettings", "DEFAULT_POLICY", "JobPlan", "POLICIES", "Plan",
    "PlanJob", "PlanningInput", "Progress", "QUEUE_PREPARE", "allreduce_seconds", "build_problem", "epoch_seconds", "is_overdue",
    "jain_fairness",
    "lower_bound", "plan_job_from_spec", "run_seconds", "shard_weights", "speedup",
]
