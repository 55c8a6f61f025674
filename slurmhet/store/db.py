"""Engine, migrations and the one-transaction-per-command session.

Migrations run automatically on open, under a lock (a file lock for SQLite, an
advisory lock for PostgreSQL) so fifty concurrent ``slurmhet submit`` processes
on a fresh database do not race each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from slurmhet.errors import SystemFailure

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
#: The newest migration's revision, the schema this code reads and writes (a unit test holds it to alembic's head).
HEAD_REVISION = "0005"
_PG_MIGRATION_LOCK = 0x51A7E7  # arbitrary, constant advisory-lock key


def _alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


#: Seconds a command waits for another process's lock on the SQLite store (its busy timeout).
SQLITE_BUSY_S = 60.0


def _sqlite_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
    # pysqlite must not open transactions itself: our BEGIN IMMEDIATE is the only BEGIN,
    # so a command's read-then-write cannot interleave with another process's.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_S * 1000)}")
    _enter_wal(cursor)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _enter_wal(cursor: sqlite3.Cursor) -> None:
    """Switch the file to WAL, waiting out other processes' locks as the busy timeout would.

    SQLite answers ``PRAGMA journal_mode=WAL`` with "database is locked" at once, without its busy
    handler, while another connection writes a file that is not in WAL yet: the race of several
    commands opening a fresh store together. Once the file is in WAL the pragma takes no lock.
    """
    deadline = time.monotonic() + SQLITE_BUSY_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


_READ_ONLY = "slurmhet_read_only"


def _sqlite_begin(conn) -> None:  # type: ignore[no-untyped-def]
    # A writer takes the write lock up front (no SQLITE_BUSY_SNAPSHOT on upgrade); a reader
    # begins deferred, which under WAL never waits for a writer.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_S})
    event.listen(engine, "connect", _sqlite_connect)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _reader(engine: Engine) -> Engine:
    return engine.execution_options(**{_READ_ONLY: True})


def _at_head(engine: Engine) -> bool:
    """Whether the store's schema is HEAD_REVISION, read with plain SQL: importing alembic cost every command about
    0.4 s of CPU, and the schema is at head on all but a store's first command."""
    with _reader(engine).connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return False
        return [row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))] == [HEAD_REVISION]


def _alembic_at_head(engine: Engine) -> bool:
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config(engine)).get_current_head()
    with _reader(engine).connect() as conn:
        return MigrationContext.configure(conn).get_current_revision() == head


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    if engine.dialect.name == "sqlite":
        db_path = engine.url.database
        lock_path = Path(db_path + ".migrate.lock") if db_path and db_path != ":memory:" else None
        if lock_path is None:
            yield
            return
        with open(lock_path, "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
            conn.commit()


def migrate(engine: Engine) -> None:
    """Bring the schema to head; cheap when it already is."""
    if _at_head(engine):
        return
    with _migration_lock(engine):
        if not _alembic_at_head(engine):
            from alembic import command

            command.upgrade(_alembic_config(engine), "head")


def _one_line(exc: BaseException | None) -> str:
    """A driver's message on one line (libpq adds "\n\tIs the server running on that host ...")."""
    return " ".join(str(exc).split())


#: SQLite's words for a database file it cannot write: a read-only or full file system.
_SQLITE_UNWRITABLE = ("readonly database", "disk is full", "unable to open database file", "disk I/O error")


def _cause(engine: Engine | None, exc: BaseException | None) -> str:
    """The driver's message, and for SQLite that cannot write, the directory to look at."""
    text = _one_line(exc)
    path = engine.url.database if engine is not None and engine.dialect.name == "sqlite" else None
    if path and path != ":memory:" and any(words in text for words in _SQLITE_UNWRITABLE):
        text += (f" (the store's directory {Path(path).parent} is read-only or full: free space there, or set "
                 "SLURMHET_STATE_DIR to a writable directory; the store itself is unchanged)")
    return text


class Database:
    """An opened, migrated database; ``transaction()`` gives the one session a command uses."""

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.engine = make_engine(url)
            migrate(self.engine)
            with _reader(self.engine).connect() as conn:
                #: This store's instance id (migration 0002): the ``@tag`` of its Slurm comments.
                self.instance = str(conn.execute(text("SELECT value FROM store_meta WHERE key = 'instance'")).scalar())
        except OperationalError as exc:
            raise SystemFailure(f"cannot open the slurmhet database {self.safe_url}: "
                                f"{_cause(getattr(self, 'engine', None), exc.orig)}") from exc
        except SQLAlchemyError as exc:
            raise SystemFailure(f"database error on {self.safe_url}: {_one_line(exc)}") from exc
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._snapshots = sessionmaker(_reader(self.engine), expire_on_commit=False)

    @property
    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True) if hasattr(self, "engine") else self.url

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """Commit everything the block did, or nothing."""
        session = self._sessions()
        try:
            with session.begin():
                yield session
        except OperationalError as exc:
            raise SystemFailure(f"database error on {self.safe_url}: {_cause(self.engine, exc.orig)}") from exc
        finally:
            session.close()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read-only view for work that must not hold the write lock (asking Slurm, say); writes are refused."""
        session = self._snapshots()
        try:
            yield session
            if session.new or session.dirty or session.deleted:
                raise RuntimeError("a snapshot() session changed rows; use transaction()")
        except OperationalError as exc:
            raise SystemFailure(f"database error on {self.safe_url}: {_cause(self.engine, exc.orig)}") from exc
        finally:
            session.close()

    def dispose(self) -> None:
        self.engine.dispose()
