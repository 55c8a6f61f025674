"""The per-owner plan-and-dispatch lock: a PostgreSQL advisory lock, or a file lock beside SQLite."""

from __future__ import annotations

import contextlib
import fcntl
import zlib
from pathlib import Path
from typing import Iterator

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from slurmhet.store.db import Database


@contextlib.contextmanager
def dispatch_lock(db: Database, state_dir: Path, owner: str, wait: bool = False) -> Iterator[bool]:
    """Yield True when this run holds the owner's plan-and-dispatch lock, False when another run does.

    ``replan`` does not wait (a second cron run just exits); ``submit`` waits its turn,
    so two commands never dispatch the same pending job.
    """
    if db.engine.dialect.name == "postgresql":
        key = zlib.crc32(f"slurmhet-replan:{owner}".encode())
        with db.engine.connect() as conn:
            call = "pg_advisory_lock(:k), true" if wait else "pg_try_advisory_lock(:k)"
            got = bool(conn.execute(text(f"SELECT {call}"), {"k": key}).one()[-1])
            conn.commit()
            try:
                yield got
            finally:
                if got:
                    try:
                        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                        conn.commit()
                    except SQLAlchemyError:
                        pass  # the server went away, and the lock with the session; the error in flight tells why
        return
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / f"replan-{owner}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
