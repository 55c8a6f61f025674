"""Drive the real `slurmhet` CLI against the dev cluster, as a user would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path
from typing import Any

from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.parsers import AccountingRecord
from slurmhet.slurm.runner import SubprocessRunner

SLURMHET = [sys.executable, "-m", "slurmhet"]


def cli(*args: str, state: Path, check: bool = True, env: dict[str, str] | None = None,
        cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "SLURMHET_STATE_DIR": str(state), **(env or {})}
    full_env.pop("SLURMHET_DB", None) if "SLURMHET_DB" not in (env or {}) else None
    proc = subprocess.run([*SLURMHET, *args], capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"slurmhet {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def status(state: Path, **kw: Any) -> dict[int, dict[str, Any]]:
    out = cli("status", "--json", state=state, **kw)
    return {row["id"]: row for row in json.loads(out.stdout)["jobs"]}


def wait_for(state: Path, job_ids: list[int], final: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED"),
             timeout: float = 180) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = status(state)
        if all(rows[i]["state"] in final for i in job_ids):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs {job_ids} not in {final} after {timeout}s: {rows}")
        time.sleep(1.5)


def wait_until_empty(timeout: float = 60) -> None:
    """Let earlier tests' jobs leave the dev cluster (squeue lists none), for a test that needs its nodes free."""
    deadline = time.monotonic() + timeout
    while subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30).stdout.strip():
        assert time.monotonic() < deadline, "the dev cluster did not empty"
        time.sleep(1)


def accounting(slurm_ids: list[str], timeout: float = 60) -> list[AccountingRecord]:
    """sacct lags squeue: poll until every id has a final, non-step row."""
    client = SlurmCli(SubprocessRunner())
    deadline = time.monotonic() + timeout
    while True:
        records = client.accounting(slurm_ids)
        done = {r.id.job for r in records if not r.id.is_step and r.state not in ("PENDING", "RUNNING")}
        if set(slurm_ids) <= done:
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"sacct has no final rows for {slurm_ids}: {records}")
        time.sleep(1.0)


def never_ran(record: AccountingRecord) -> bool:
    """A job cancelled while pending: no nodes, no time (sacct may still print its cancel time as Start)."""
    return record.elapsed_s == 0 and not record.alloc_tres and record.nodes in ("", "None assigned")


ANY_ONE = "{min: 1, max: 1}"


def job(name: str, command: list[str], gpus: str = ANY_ONE, extra: str = "") -> str:
    """One job of a spec file: a ResNet-18 workload (in the dev cluster's table) running ``command``."""
    return textwrap.dedent(f"""\
        - name: {json.dumps(name)}
          command: {json.dumps(command)}
          workload: {{model: ResNet-18, batch_size: 64}}
          work: {{steps: 10}}
          gpus: {gpus}
        """) + textwrap.indent(extra, "  ")


def write(path: Path, *jobs: str) -> Path:
    path.write_text("jobs:\n" + textwrap.indent("".join(jobs), "  "))
    return path


def user_python(user: str) -> tuple[list[str], dict[str, str]] | None:
    """How ``user`` can run this slurmhet: this interpreter, or the system one of the same
    minor version with this venv's packages on PYTHONPATH (the venv's interpreter may live under
    /root, mode 0700, so other users cannot execute it)."""
    if subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", "pass"], capture_output=True,
                      cwd="/").returncode == 0:
        return [sys.executable], {}
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None:
        return None
    env = {"PYTHONPATH": f"{Path(__file__).resolve().parents[2]}:{sysconfig.get_paths()['purelib']}"}
    probe = subprocess.run(["runuser", "-u", user, "--", "env", f"PYTHONPATH={env['PYTHONPATH']}", system, "-c",
                            "import slurmhet.cli, psycopg"], capture_output=True, cwd="/")
    return ([system], env) if probe.returncode == 0 else None


TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


def train_spec(path: Path, name: str, steps: int, global_batch: int, gpus: str, checkpoint_dir: Path,
               *train_args: str, batch_size: int | None = None, extra: str = "", time_limit: int = 10,
               then: str | None = None) -> Path:
    """A spec of examples/train.py (mlp-small) that checkpoints into ``checkpoint_dir``: the fault tests' job.
    ``then``: a shell line the command runs after train.py exits 0, before the command itself ends."""
    command = [sys.executable, str(TRAIN), "--steps", str(steps), "--global-batch", str(global_batch), *train_args]
    if then is not None:
        command = ["bash", "-c", f'"$0" "$@" && {then}', *command]
    path.write_text(textwrap.dedent(f"""\
        name: {name}
        command: {json.dumps(command)}
        workload: {{model: mlp-small, batch_size: {batch_size or global_batch}}}
        global_batch: {global_batch}
        model_size_mb: 0.01
        work: {{steps: {steps}}}
        gpus: {gpus}
        checkpoint_dir: {json.dumps(str(checkpoint_dir))}
        time_limit: {time_limit}
        """) + extra)
    return path
