"""Policy keys -> planners. ``slurmhet plan --policy KEY`` and the benchmark use these keys.

Every planner has the signature ``(PlanningInput, progress=None) -> Plan``.
"""

from __future__ import annotations

from typing import Callable, Mapping

from slurmhet.planner import exact, has, hetero, jps, optimus
from slurmhet.planner.critical import with_critical_path
from slurmhet.planner.model import PlanningInput
from slurmhet.planner.pipeline import Policy, make_policy

DEFAULT_POLICY = "slurmhet"

POLICIES: Mapping[str, Policy] = {
    "slurmhet": make_policy("slurmhet", hetero.allocate, jointly=True),
    "has": make_policy("has", has.has),
    "jps-20": make_policy("jps-20", jps.jps_policy(20)),
    "jps-40": make_policy("jps-40", jps.jps_policy(40)),
    "jps-60": make_policy("jps-60", jps.jps_policy(60)),
    "optimus": make_policy("optimus", optimus.optimus, proportional=False),
    "optimus-lb": make_policy("optimus-lb", optimus.optimus_lb),
    "exhaustive": make_policy("exhaustive", exact.exact_milp),
    "brute-force": make_policy("brute-force", exact.brute_force),
}

#: What a policy does to a queue's input before planning it over time (``slurmhet submit``/``replan`` and the
#: simulator); the one-shot placement benchmarks of seed 001 plan the input as given.
QUEUE_PREPARE: Mapping[str, Callable[[PlanningInput], PlanningInput]] = {"slurmhet": with_critical_path}
