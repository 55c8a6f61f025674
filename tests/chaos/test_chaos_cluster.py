"""A short chaos run on the dev cluster (5 minutes, seed 1): every fault kind injected into a mixed workload,
and the promise of the Failures section kept (bench/chaos.py says how each invariant is judged)."""

from __future__ import annotations

import json

import pytest

from bench import chaos

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def test_a_five_minute_chaos_run_loses_no_job_runs_none_twice_and_loses_at_most_a_checkpoint(pg_url: str) -> None:
    result = chaos.run(5, 1, pg_url)
    text = json.dumps(result, indent=2)
    assert all(result["faults"][kind] >= 1 for kind in chaos.KINDS), text
    assert result["invariants"] == {name: True for name in result["invariants"]}, text
    assert result["jobs"]["by_state"] == {"COMPLETED": result["jobs"]["workload"]}, text
    assert result["worst_progress_lost_steps"] <= chaos.CHECKPOINT_EVERY, text
