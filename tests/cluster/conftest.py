"""Fixtures shared by the real-cluster tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.replan_helpers import live_tagged, scancel, store_tag


@pytest.fixture
def leftovers(state_dir: Path) -> Iterator[list[str]]:
    """Foreign Slurm ids a test appends; they, and this store's live jobs, are cancelled at teardown."""
    foreign: list[str] = []
    yield foreign
    scancel(foreign)
    if (state_dir / "slurmhet.db").exists():
        scancel(live_tagged(store_tag(state_dir)))

