"""The shared PostgreSQL store goes away under slurmhet (its connections cut, as a restart does): during a submit
(after sbatch, before the record) and before a replan. Each command ends with exit 1 and one line naming the database; once PostgreSQL is back, the
next replan adopts the Slurm job the failed submit left, and no job runs twice."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.helpers import cli, job, status, write
from tests.cluster.replan_helpers import live_tagged

pytestmark = pytest.mark.usefixtures("slurm_cluster")

PROXY = Path(__file__).resolve().parent / "tcp_proxy.py"


class Database:
    """The store's PostgreSQL reached through a TCP forwarder, so the test can take it away and bring it back."""

    def __init__(self, url: str, pid_file: Path) -> None:
        self.target = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = url.replace(f":{self.target}/", f":{self.port}/")
        self.pid_file = pid_file
        self.proc: subprocess.Popen[str] | None = None

    def up(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(PROXY), str(self.port), str(self.target)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "listening"
        self.pid_file.write_text(str(self.proc.pid))

    def down(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def database(pg_store: str, tmp_path: Path) -> Iterator[Database]:
    db = Database(pg_store, tmp_path / "proxy.pid")
    db.up()
    yield db
    db.down()


def _sbatch_then_drop_the_database(directory: Path, pid_file: Path) -> tuple[dict[str, str], Path]:
    """A PATH entry whose `sbatch` submits for real, notes the id, then takes the database away before answering."""
    real = shutil.which("sbatch")
    assert real
    directory.mkdir(parents=True, exist_ok=True)
    noted, wrapper = directory / "submitted", directory / "sbatch"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        case " $* " in *" --parsable "*) ;; *) exec {real} "$@" ;; esac
        out=$({real} "$@"); rc=$?
        [ $rc -eq 0 ] && echo "$out" >> {noted}
        kill -9 "$(cat {pid_file})"; sleep 0.5
        [ -n "$out" ] && echo "$out"
        exit $rc
        """))
    wrapper.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}, noted


def test_the_database_going_away_loses_and_duplicates_nothing(tmp_path: Path, state_dir: Path,
                                                              database: Database, leftovers: list[str]) -> None:
    db = {"SLURMHET_DB": database.url}
    spec = write(tmp_path / "j.yaml", job("db-gone", ["sleep", "20"]))
    cli("status", state=state_dir, env=db)  # the store exists before the fault
    path_env, noted = _sbatch_then_drop_the_database(tmp_path / "bin", database.pid_file)

    failed = cli("submit", "--json", str(spec), state=state_dir, env={**db, **path_env}, check=False)
    (slurm_id,) = noted.read_text().split()
    leftovers.append(slurm_id)
    assert failed.returncode == 1, failed
    (line,) = failed.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"slurmhet: failure: database error on {database.url}:"), line
    down = cli("replan", "--once", state=state_dir, env=db, check=False)
    (line,) = down.stderr.strip().splitlines()
    assert down.returncode == 1 and line.startswith("slurmhet: failure: cannot open the slurmhet database"), down

    database.up()  # back: the next replan finds the Slurm job the cut-off submit left, and adopts it
    again = cli("replan", "--once", state=state_dir, env=db)
    (row,) = status(state_dir, env=db).values()
    assert f"adopted Slurm job {slurm_id} for job {row['id']}" in again.stdout, again.stdout
    assert [p["id"] for p in row["slurm"]] == [slurm_id] and row["state"] in ("SUBMITTED", "RUNNING")
    cli("replan", "--once", state=state_dir, env=db)
    comment = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%k"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    assert live_tagged(comment.partition("@")[2]) == {slurm_id: [row["id"]]}  # one Slurm job for it, still
