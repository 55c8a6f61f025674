"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest

from tests.unit.recorded import SERIES, Recorded


@pytest.fixture(params=SERIES)
def rec(request: pytest.FixtureRequest) -> Recorded:
    """Each recorded Slurm series in turn (22.05, 24.11, 26.05): every parser test runs on each."""
    return Recorded(request.param)
