"""Shared fixtures; the real-cluster gate lives here.

With SLURMHET_REQUIRE_CLUSTER=1 (set by `make test`, hence CI) a missing Slurm
cluster or PostgreSQL server fails the run instead of skipping, and any skipped
cluster/postgres test turns the session red.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
REQUIRED = os.environ.get("SLURMHET_REQUIRE_CLUSTER") == "1"


def _cluster_ready() -> str | None:
    """None when sinfo answers with three idle-able nodes, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo is not installed (run etc/devcluster/devcluster up)"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    if out.returncode != 0:
        return f"slurmctld is not answering: {out.stderr.strip()}"
    if len(out.stdout.split("\n")) < 3:
        return f"expected 3 nodes, sinfo says: {out.stdout.strip()}"
    return None


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"required real component unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    reason = _cluster_ready()
    if reason:
        _unavailable(reason)


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = os.environ.get("SLURMHET_TEST_PG_URL")
    if not url:
        _unavailable("SLURMHET_TEST_PG_URL is not set (run etc/devcluster/pgcluster up)")
    return url  # type: ignore[return-value]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(d in str(item.fspath).replace(os.sep, "/") for d in ("tests/cluster/", "tests/chaos/")):
            item.add_marker(pytest.mark.cluster)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not REQUIRED:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    gated = [r for r in skipped if "cluster" in r.keywords or "postgres" in r.keywords]
    if gated:
        print(f"\nslurmhet: {len(gated)} real-cluster/postgres test(s) were skipped; that is a failure here")
        session.exitstatus = 1


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state dir + SQLite DB per test, so tests never share a store."""
    state = tmp_path / "state"
    monkeypatch.setenv("SLURMHET_STATE_DIR", str(state))
    monkeypatch.delenv("SLURMHET_DB", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SLURMHET_THROUGHPUT_TABLE", str(REPO / "etc" / "throughput" / "devcluster.yaml"))
    return state
