"""The store: migrations on open, one transaction per command, SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from slurmhet.spec import load_text
from slurmhet.store import Database, JobState, SlurmJob, add_event, create_job, get_job, list_jobs

SPEC = load_text("name: a\ncommand: [x]\nworkload: {model: m, batch_size: 2}\nwork: {steps: 3}\n", "f.yaml")[0]


def _exercise(db: Database) -> None:
    with db.transaction() as session:
        job = create_job(session, SPEC, "alice", "f.yaml")
        job.slurm_jobs.append(SlurmJob(slurm_job_id="17", role="het", het_offset=1, gpu_type="t4", gpu_count=2))
        job_id = job.id
    started = datetime(2026, 11, 25, 17, 0, 5, tzinfo=timezone(timedelta(hours=2)))
    with db.transaction() as session:
        part = get_job(session, job_id).slurm_jobs[0]  # type: ignore[union-attr]
        part.started_at = started
    with db.transaction() as session:
        again = get_job(session, job_id)
        assert again is not None and again.state is JobState.PENDING
        # Back as the same instant, aware and in UTC, on SQLite too (it drops offsets).
        back = again.slurm_jobs[0].started_at
        assert back == started and back is not None and back.utcoffset() == timedelta(0)
        assert again.created_at.tzinfo is not None
        assert min(back, datetime.now(timezone.utc)) == back  # comparable with what Slurm parsers return
        assert again.spec["name"] == "a" and again.slurm_jobs[0].het_offset == 1
        assert list(session.scalars(text("SELECT kind FROM events"))) == ["stored"]
    with pytest.raises(RuntimeError):
        with db.transaction() as session:
            create_job(session, SPEC, "bob", "f.yaml")
            raise RuntimeError("half-way")
    with db.transaction() as session:
        assert [j.owner for j in list_jobs(session)] == ["alice"]  # nothing half-written
        assert list_jobs(session, owner="bob") == []
        add_event(session, None, "replan", "ok")


def test_sqlite_store_migrates_and_rolls_back(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/s.db")
    assert {"jobs", "slurm_jobs", "events", "alembic_version"} <= set(inspect(db.engine).get_table_names())
    _exercise(db)
    Database(f"sqlite:///{tmp_path}/s.db")  # reopening at head is a no-op


def test_the_schema_check_on_open_matches_alembics_head_and_does_not_import_alembic(tmp_path: Path) -> None:
    """A command opening a store at head reads its revision with plain SQL (alembic's import is most of a command's
    start-up); a store behind head, or a head this code does not know, still goes through alembic."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from slurmhet.store import db as store_db

    cfg = Config()
    cfg.set_main_option("script_location", str(store_db.MIGRATIONS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == store_db.HEAD_REVISION  # bump it with a migration
    url = f"sqlite:///{tmp_path}/h.db"
    Database(url)
    reopen = ("import sys; from slurmhet.store import Database; Database(sys.argv[1]); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    out = subprocess.run([sys.executable, "-c", reopen, url], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out
    with sqlite3.connect(f"{tmp_path}/h.db") as conn:  # a store one migration behind is brought to head
        conn.execute("ALTER TABLE slurm_jobs DROP COLUMN restarts")
        conn.execute("UPDATE alembic_version SET version_num = '0004'")
    Database(url)
    with sqlite3.connect(f"{tmp_path}/h.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(store_db.HEAD_REVISION,)]
        assert "restarts" in [row[1] for row in conn.execute("PRAGMA table_info(slurm_jobs)")]


def _open_and_store(url: str) -> int:
    db = Database(url)
    with db.transaction() as session:
        return create_job(session, SPEC, "p", "f").id


def test_sqlite_concurrent_first_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/c.db"
    with multiprocessing.get_context("spawn").Pool(6) as pool:
        ids = pool.map(_open_and_store, [url] * 12)
    assert sorted(ids) == list(range(1, 13))


def test_sqlite_open_waits_for_a_writer_before_the_file_is_in_wal(tmp_path: Path) -> None:
    """SQLite refuses ``journal_mode=WAL`` at once, busy timeout or not, while another connection writes a
    file still in rollback mode (several commands opening a fresh store together); the open waits instead."""
    path = tmp_path / "fresh.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE other_tool (x)")
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO other_tool VALUES (1)")  # the write lock is held, the file is not in WAL
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # what the open used to fail on
        sqlite3.connect(path, timeout=5, isolation_level=None).execute("PRAGMA journal_mode=WAL")
    releaser = threading.Timer(0.5, other.execute, ("COMMIT",))
    releaser.start()
    start = time.monotonic()
    db = Database(f"sqlite:///{path}")
    releaser.join()
    assert time.monotonic() - start >= 0.4
    with db.snapshot() as session:
        assert session.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert list_jobs(session) == []
    other.close()


def _open_and_read(url: str) -> float:
    start = time.monotonic()
    db = Database(url)
    with db.snapshot() as session:
        assert [j.owner for j in list_jobs(session)] == ["writer"]
    return time.monotonic() - start


def test_sqlite_open_and_snapshot_do_not_wait_for_a_writer(tmp_path: Path) -> None:
    """A command holding the write lock (a long submit) keeps no other command from opening or reading."""
    url = f"sqlite:///{tmp_path}/w.db"
    db = Database(url)
    with db.transaction() as session:
        create_job(session, SPEC, "writer", "f")
    with db.transaction() as session:
        session.execute(text("UPDATE jobs SET reason = 'held'"))  # the write lock is held from here on
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            seconds = pool.map(_open_and_read, [url] * 2, chunksize=1)
    assert max(seconds) < 10, seconds  # a writer-blocked open waits out the 60 s busy timeout


def test_snapshot_refuses_writes(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/r.db")
    with pytest.raises(RuntimeError, match="use transaction"):
        with db.snapshot() as session:
            create_job(session, SPEC, "x", "f")
    with db.snapshot() as session:
        assert list_jobs(session) == []


@pytest.mark.postgres
def test_postgres_store(pg_url: str) -> None:
    db = Database(pg_url)
    with db.engine.begin() as conn:
        conn.execute(text("TRUNCATE jobs, slurm_jobs, events RESTART IDENTITY CASCADE"))
    _exercise(db)
    with db.snapshot() as session:
        assert [j.owner for j in list_jobs(session)] == ["alice"]
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        ids = pool.map(_open_and_store, [pg_url] * 8)
    assert len(set(ids)) == 8


def test_unreachable_database_is_a_system_failure() -> None:
    from slurmhet.errors import SystemFailure

    with pytest.raises(SystemFailure, match="cannot open the slurmhet database"):
        Database("postgresql+psycopg://nobody@127.0.0.1:1/none")
