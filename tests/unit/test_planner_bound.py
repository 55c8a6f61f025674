"""The Lagrangian lower bound: never above the exact optimum, close to it, and below every policy."""

from __future__ import annotations

import pytest

from slurmhet.planner import POLICIES, lower_bound
from slurmhet.planner.pipeline import build_problem
from tests.unit.test_planner_policies import random_instance


@pytest.mark.parametrize("seed", range(5))
def test_bound_is_below_the_optimum(seed: int) -> None:
    inp = random_instance(seed)
    problem = build_problem(inp)
    bound = lower_bound(problem)
    optimum = POLICIES["exhaustive"](inp)
    total = sum(jp.jct_s for jp in optimum.jobs)  # unit weights
    assert bound.value <= total * (1 + 1e-9)
    assert bound.value >= 0.5 * total  # a bound that says nothing would also pass the first check
    for key in ("slurmhet", "optimus-lb"):
        assert bound.value <= sum(jp.jct_s for jp in POLICIES[key](inp).jobs) * (1 + 1e-9)
