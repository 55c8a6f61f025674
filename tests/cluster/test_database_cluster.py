"""The shared PostgreSQL store goes away under slurmhet: during a submit (after sbatch, before the record) and
before a replan. Each command ends with exit 1 and one line naming the database; once PostgreSQL is back, the
next replan adopts the Slurm job the failed submit left, and no job runs twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster.helpers import cli, job, status, write
from tests.cluster.replan_helpers import live_tagged

pytestmark = pytest.mark.usefixtures("slurm_cluster")

PGCLUSTER = Path(__file__).resolve().parents[2] / "etc" / "devcluster" / "pgcluster"


@pytest.fixture
def restarted_postgres() -> Iterator[None]:
    """Whatever the test does to PostgreSQL, it runs again afterwards (later tests need it)."""
    yield
    subprocess.run([str(PGCLUSTER), "start"], check=True, capture_output=True, timeout=120)


def _sbatch_then_stop_postgres(directory: Path) -> tuple[dict[str, str], Path]:
    """A PATH entry whose `sbatch` submits for real, notes the id, then stops PostgreSQL before answering."""
    real = shutil.which("sbatch")
    assert real
    directory.mkdir(parents=True, exist_ok=True)
    noted, wrapper = directory / "submitted", directory / "sbatch"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        case " $* " in *" --parsable "*) ;; *) exec {real} "$@" ;; esac
        out=$({real} "$@"); rc=$?
        [ $rc -eq 0 ] && echo "$out" >> {noted}
        {PGCLUSTER} down >/dev/null 2>&1
        [ -n "$out" ] && echo "$out"
        exit $rc
        """))
    wrapper.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}, noted


def test_the_database_going_away_loses_and_duplicates_nothing(tmp_path: Path, state_dir: Path, pg_store: str,
                                                              restarted_postgres: None, leftovers: list[str]) -> None:
    db = {"SLURMHET_DB": pg_store}
    spec = write(tmp_path / "j.yaml", job("db-gone", ["sleep", "20"]))
    cli("status", state=state_dir, env=db)  # the store exists before the fault
    path_env, noted = _sbatch_then_stop_postgres(tmp_path / "bin")

    failed = cli("submit", "--json", str(spec), state=state_dir, env={**db, **path_env}, check=False)
    (slurm_id,) = noted.read_text().split()
    leftovers.append(slurm_id)
    assert failed.returncode == 1, failed
    (line,) = failed.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"slurmhet: failure: database error on {pg_store}:"), line
    down = cli("replan", "--once", state=state_dir, env=db, check=False)
    assert down.returncode == 1 and down.stderr.strip().splitlines() == [
        down.stderr.strip()] and "cannot open the slurmhet database" in down.stderr, down

    subprocess.run([str(PGCLUSTER), "start"], check=True, capture_output=True, timeout=120)
    again = cli("replan", "--once", state=state_dir, env=db)
    rows = status(state_dir, env=db)
    (row,) = rows.values()
    assert f"adopted Slurm job {slurm_id} for job {row['id']}" in again.stdout, again.stdout
    assert [p["id"] for p in row["slurm"]] == [slurm_id] and row["state"] in ("SUBMITTED", "RUNNING")
    cli("replan", "--once", state=state_dir, env=db)
    comment = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%k"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
    assert live_tagged(comment.partition("@")[2]) == {slurm_id: [row["id"]]}  # one Slurm job for it, still
