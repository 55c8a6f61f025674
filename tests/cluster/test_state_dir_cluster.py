"""A full or read-only state directory: commands end with exit 1 and one line naming the path, the SQLite store
stays whole and readable once the directory is writable again, and no Slurm job is left without its record."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.helpers import cli, job, status, write
from tests.cluster.replan_helpers import live_tagged, store_tag

pytestmark = pytest.mark.usefixtures("slurm_cluster")


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    """A state directory on its own 4 MB file system (tmpfs), so the test can fill it."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(state)], check=True, timeout=30)
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], timeout=30)


def _one_line_failure(proc: subprocess.CompletedProcess[str], path: Path) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurmhet: failure: ") and "Traceback" not in proc.stderr, lines
    assert str(path) in lines[0], lines
    return lines[0]


def _intact(state: Path) -> None:
    with sqlite3.connect(state / "slurmhet.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _recorded_everything(state: Path) -> None:
    """Every live Slurm job tagged for this store has its record (the next replan adopts one cut off)."""
    cli("replan", "--once", state=state)
    recorded = {p["id"] for row in status(state).values() for p in row["slurm"]}
    assert set(live_tagged(store_tag(state))) <= recorded


def test_a_full_state_directory_fails_with_its_path_and_keeps_the_store(tmp_path: Path, small_state: Path,
                                                                       leftovers: list[str]) -> None:
    first = write(tmp_path / "a.yaml", job("before", ["sleep", "30"], "{min: 1, max: 1, types: [t4]}"))
    [a] = json.loads(cli("submit", "--json", str(first), state=small_state).stdout)["jobs"]
    leftovers.extend(a["slurm_job_ids"])
    filler = small_state / "filler"
    try:
        with open(filler, "wb", buffering=0) as out:  # fill the file system to the last block
            try:
                while True:
                    out.write(b"\0" * 65536)
            except OSError:
                pass
        second = write(tmp_path / "b.yaml", job("after", ["sleep", "30"], "{min: 1, max: 1, types: [t4]}"))
        for args in (("submit", str(second)), ("replan", "--once"), ("status",)):
            line = _one_line_failure(cli(*args, state=small_state, check=False), small_state)
            assert "read-only or full" in line or "No space left on device" in line, line
    finally:
        filler.unlink()
    _intact(small_state)
    rows = status(small_state)
    assert rows[a["job_id"]]["name"] == "before" and rows[a["job_id"]]["slurm"][0]["id"] == a["slurm_job_ids"][0]
    assert [r["name"] for r in rows.values()].count("after") <= 1  # cut off before its record, or recorded: once
    _recorded_everything(small_state)
    assert not list(small_state.rglob("*.tmp")), list(small_state.rglob("*"))  # nothing half-written left


def test_a_read_only_state_directory_fails_with_its_path_and_keeps_the_store(tmp_path: Path, small_state: Path,
                                                                            leftovers: list[str]) -> None:
    first = write(tmp_path / "a.yaml", job("before", ["sleep", "30"], "{min: 1, max: 1, types: [t4]}"))
    [a] = json.loads(cli("submit", "--json", str(first), state=small_state).stdout)["jobs"]
    leftovers.extend(a["slurm_job_ids"])
    # A read-only bind mount over it: the running job keeps writing its log through the mount below. One call,
    # not bind then remount: util-linux >= 2.39 (Debian trixie, sid) makes it read-only before attaching it, while a
    # separate remount fails "mount point is busy" if the job opened a file through the new mount in between.
    subprocess.run(["mount", "--bind", "-o", "ro", str(small_state), str(small_state)], check=True, timeout=30)
    try:
        second = write(tmp_path / "b.yaml", job("after", ["sleep", "30"], "{min: 1, max: 1, types: [t4]}"))
        for args in (("submit", str(second)), ("replan", "--once"), ("status",)):
            line = _one_line_failure(cli(*args, state=small_state, check=False), small_state)
            assert "read-only" in line.lower() or "readonly" in line.lower(), line
    finally:
        subprocess.run(["umount", str(small_state)], check=True, timeout=30)
    assert set(live_tagged(store_tag(small_state))) <= set(a["slurm_job_ids"])  # "after" never reached Slurm
    _intact(small_state)
    rows = status(small_state)
    assert [r["name"] for r in rows.values()] == ["before"], rows
    _recorded_everything(small_state)
