"""Fixtures shared by the real-cluster tests."""

from __future__ import annotations

import uuid
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


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[str]:
    """A private database on the PostgreSQL test server, dropped after."""
    import psycopg

    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"slurmhet_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
