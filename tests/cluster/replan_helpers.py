"""Helpers for the replan / report / fault tests on the real dev cluster.

Everything here looks at Slurm's own view (squeue, sacct, scontrol) or reads the
store's SQLite file directly, so a test can check slurmhet's claims against both.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import textwrap
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.runner import SubprocessRunner
from tests.cluster.helpers import SLURMHET, cli, job, status, write

REPO = Path(__file__).resolve().parents[2]
SLURM = SlurmCli(SubprocessRunner())
def submit(state: Path, spec: Path, check: bool = True, **kw: Any) -> list[dict[str, Any]]:
    proc = cli("submit", "--json", str(spec), state=state, check=check, **kw)
    return json.loads(proc.stdout)["jobs"]


# --------------------------------------------------------------------------- the store, read directly


def db_path(state: Path) -> Path:
    return state / "slurmhet.db"


def store_tag(state: Path) -> str:
    """The store's instance id: the ``@tag`` in its Slurm comments."""
    with sqlite3.connect(db_path(state)) as conn:
        return str(conn.execute("SELECT value FROM store_meta WHERE key = 'instance'").fetchone()[0])


_TABLES = ("jobs", "slurm_jobs", "events", "cluster_snapshots", "progress_marks", "throughput_observations",
           "store_meta")


def db_snapshot(state: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every slurmhet table, for 'the store was left as it was' checks."""
    with sqlite3.connect(db_path(state)) as conn:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in _TABLES}


def attempts(state: Path, job_id: int) -> int:
    with sqlite3.connect(db_path(state)) as conn:
        return int(conn.execute("SELECT attempts FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])


def events(state: Path, job_id: int | None = None, kind: str | None = None) -> list[tuple[int | None, str, str]]:
    """(job_id, kind, message) in order."""
    query, args = "SELECT job_id, kind, message FROM events WHERE 1=1", []
    if job_id is not None:
        query += " AND job_id = ?"
        args.append(job_id)
    if kind is not None:
        query += " AND kind = ?"
        args.append(kind)
    with sqlite3.connect(db_path(state)) as conn:
        return [tuple(r) for r in conn.execute(query + " ORDER BY id", args)]  # type: ignore[misc]


def recorded_parts(state: Path) -> dict[int, list[tuple[str, str]]]:
    """job id -> [(Slurm job id, role)] as the store recorded them."""
    out: dict[int, list[tuple[str, str]]] = defaultdict(list)
    with sqlite3.connect(db_path(state)) as conn:
        for job_id, slurm_id, role in conn.execute("SELECT job_id, slurm_job_id, role FROM slurm_jobs ORDER BY id"):
            out[int(job_id)].append((str(slurm_id), str(role)))
    return out


# --------------------------------------------------------------------------- Slurm's own view


def _ids_in(comment: str, tag: str) -> list[int]:
    text, _, store = comment.partition("@")
    if store != tag or not text.startswith("slurmhet:"):
        return []
    return [int(t) for t in text.removeprefix("slurmhet:").split(",") if t.isdigit()]


def slurm_jobs_of_store(tag: str, since: datetime) -> dict[int, dict[str, str]]:
    """slurmhet job id -> {Slurm root job id: state}, from squeue --json and sacct, by comment tag.

    A het job's components share the leader id, so each sbatch counts once.
    """
    out: dict[int, dict[str, str]] = defaultdict(dict)
    for record in SLURM.queue():
        for job_id in _ids_in(record.comment, tag):
            out[job_id][record.root_id] = record.state
    for acct in SLURM.accounting(since=since):
        if acct.id.is_step:
            continue
        for job_id in _ids_in(acct.comment, tag):
            if acct.state not in ("PENDING", "RUNNING") or acct.id.job not in out[job_id]:
                out[job_id][acct.id.job] = acct.state
    return dict(out)


def live_tagged(tag: str) -> dict[str, list[int]]:
    """Pending/running/completing Slurm jobs carrying this store's tag -> the slurmhet ids they serve.

    Plain squeue (fast, for polling); a het job lists once per component, under its own id.
    """
    proc = subprocess.run(["squeue", "--noheader", "-o", "%i %k"], capture_output=True, text=True, timeout=30)
    out = {}
    for line in proc.stdout.splitlines():
        slurm_id, _, comment = line.strip().partition(" ")
        if _ids_in(comment.strip(), tag):
            out[slurm_id] = _ids_in(comment.strip(), tag)
    return out


def squeue_state(slurm_id: str) -> tuple[str, str]:
    """(state, reason) of a live job, ('', '') when squeue no longer lists it."""
    proc = subprocess.run(["squeue", "--noheader", "-j", slurm_id, "-o", "%T|%r"], capture_output=True, text=True,
                          timeout=30)
    line = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "|"
    state, _, reason = line.partition("|")
    return state, reason


def usable_gpus() -> int:
    """GPUs on nodes that take work now, as slurmhet's planner counts them."""
    return sum(sum(n.gpus.values()) for n in SLURM.nodes() if n.available)


def sbatch_foreign(*args: str, user: str = "slurmhet-noise") -> str:
    """A plain (non-slurmhet) Slurm job of another user; returns its id."""
    proc = subprocess.run(["runuser", "-u", user, "--", "sbatch", "--parsable", "-D", "/tmp", "-o", "/dev/null",
                           *args], capture_output=True, text=True, timeout=30, check=True, cwd="/tmp")
    return proc.stdout.strip().split(";")[0]


def scancel(ids: Iterable[str]) -> None:
    ids = [i for i in ids if i]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


def wait_slurm(slurm_id: str, states: tuple[str, ...], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state, _ = squeue_state(slurm_id)
        if state in states:
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm job {slurm_id} not in {states} after {timeout}s (now {state or 'gone'})")
        time.sleep(0.5)


def holding_every_v100(minutes: int, sleep_s: int, leftovers: list[str]) -> tuple[str, float]:
    """A foreign job on all 4 v100s with a time limit; returns its id and when Slurm will kill it at the latest."""
    blocker = sbatch_foreign("--gres=gpu:v100:4", "-p", "v100", "-t", str(minutes), "--wrap", f"sleep {sleep_s}")
    leftovers.append(blocker)
    wait_slurm(blocker, ("RUNNING",), timeout=90)
    (record,) = SLURM.queue([blocker])
    assert record.gpus == (("nodea", "v100", 4),), record
    return blocker, record.start.timestamp() + minutes * 60  # type: ignore[union-attr]


def sacct_rows(slurm_ids: Iterable[str]) -> list[dict[str, str]]:
    """Raw `sacct --parsable2` rows (steps included), parsed here, not by slurmhet."""
    fields = ["JobID", "JobIDRaw", "State", "Elapsed", "AllocTRES", "NodeList", "Comment"]
    proc = subprocess.run(["sacct", "--allusers", "--parsable2", "--noheader", "-o", ",".join(fields),
                           "-j", ",".join(sorted(set(slurm_ids)))], capture_output=True, text=True, timeout=30,
                          check=True)
    return [dict(zip(fields, line.split("|"))) for line in proc.stdout.splitlines() if line.strip()]


def elapsed_seconds(text: str) -> int:
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return ((int(days or 0) * 24 + parts[0]) * 60 + parts[1]) * 60 + parts[2]


# --------------------------------------------------------------------------- running the CLI


def replan(state: Path, *args: str, check: bool = True, env: dict[str, str] | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return cli("replan", *args, state=state, check=check, env=env, timeout=timeout)


def start_cli(state: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CLI in the background, in its own process group (so a kill takes its sbatch children too)."""
    full_env = {**os.environ, "SLURMHET_STATE_DIR": str(state), **(env or {})}
    full_env.pop("SLURMHET_DB", None)
    return subprocess.Popen([*SLURMHET, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True)


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=30)


_ACTION = re.compile(r"^job (\d+) \(.*\): (SUBMITTED|SUBMIT_FAILED) (.*)$")


def submitted_by(stdout: str) -> dict[int, list[str]]:
    """Replan's "job N (name): SUBMITTED ... Slurm X" lines -> {N: [X...]}."""
    out = {}
    for line in stdout.splitlines():
        match = _ACTION.match(line)
        if match and match.group(2) == "SUBMITTED":
            ids = re.search(r" Slurm ([\d,]+)", match.group(3))
            out[int(match.group(1))] = ids.group(1).split(",") if ids else []
    return out


def adopted_by(stdout: str) -> dict[int, str]:
    """Replan's "adopted Slurm job X for job N" lines -> {N: X}."""
    return {int(m.group(2)): m.group(1) for m in re.finditer(r"^adopted Slurm job (\d+) for job (\d+)$", stdout, re.M)}


def slow_sbatch(directory: Path, delay_s: float, only: str = "", once: bool = False) -> tuple[dict[str, str], Path]:
    """A PATH entry whose `sbatch` submits for real, notes the id, then stalls before answering.

    It opens the window between "Slurm has the job" and "the store recorded it" on purpose.
    ``only``: stall only the calls one of whose words starts with it (others answer at once, unnoted).
    ``once``: stall the first such call only (Slurm jobs inherit PATH: a replan one of them runs is not stalled).
    A stall ends early once :func:`release_sbatch` is called (a test that needs the window open until something
    happened, however loaded the machine). Returns the env overlay and the file the ids are noted in.
    """
    real = shutil.which("sbatch")
    assert real, "sbatch is not installed"
    directory.mkdir(parents=True, exist_ok=True)
    noted = directory / "submitted"
    wrapper = directory / "sbatch"
    wrapper.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        case " $* " in *" --parsable "*) ;; *) exec {real} "$@" ;; esac
        case " $* " in *" {only}"*) ;; *) exec {real} "$@" ;; esac
        {f'[ -e {noted} ] && exec {real} "$@"' if once else ''}
        out=$({real} "$@"); rc=$?
        [ $rc -eq 0 ] && echo "$out" >> {noted}
        end=$((SECONDS + {math.ceil(delay_s)}))
        while [ $SECONDS -lt $end ] && [ ! -e {directory / "released"} ]; do sleep 0.1; done
        [ -n "$out" ] && echo "$out"
        exit $rc
        """))
    wrapper.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ.get('PATH', '')}"}, noted


def release_sbatch(noted: Path) -> None:
    """End the stall of the :func:`slow_sbatch` whose ids are noted in ``noted`` (now, and for later calls)."""
    (noted.parent / "released").touch()


def wait_file_lines(path: Path, n: int, timeout: float = 120, proc: subprocess.Popen[str] | None = None) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().split() if path.exists() else []
        if len(lines) >= n:
            return lines
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended ({proc.returncode}) before {path} had {n} lines:\n{out}\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} has {len(lines)} of {n} lines after {timeout}s")
        time.sleep(0.05)


# --------------------------------------------------------------------------- scenarios


def store_waiting_jobs(state: Path, tmp: Path, n: int, command: list[str], prefix: str = "w") -> list[int]:
    """Store ``n`` one-GPU jobs that slurmhet leaves unplaced (PENDING), with the cluster free again.

    slurmhet's planner counts its own placed jobs, not foreign ones, so the jobs are made to
    wait behind this store's own blockers (one per usable GPU), which are then cancelled.
    """
    gpus = usable_gpus()
    blockers = submit(state, write(tmp / f"{prefix}-blockers.yaml",
                                   *[job(f"{prefix}-blocker{i}", ["sleep", "300"]) for i in range(gpus)]))
    assert [b["state"] for b in blockers] == ["SUBMITTED"] * gpus, blockers
    waiting = submit(state, write(tmp / f"{prefix}-waiting.yaml",
                                  *[job(f"{prefix}{i}", command) for i in range(n)]))
    assert [w["state"] for w in waiting] == ["PENDING"] * n, waiting
    cli("cancel", *[str(b["job_id"]) for b in blockers], state=state)
    return [w["job_id"] for w in waiting]


def hold_one_k80(leftovers: list[str]) -> str:
    """Another user's job on one of nodec's two k80s, in `urgent`, which nothing preempts: the planner then has
    one k80 left and packs co-locatable jobs onto it. Returns the holder's Slurm id (in ``leftovers`` too)."""
    hold = sbatch_foreign("-p", "urgent", "--gres=gpu:k80:1", "-w", "nodec", "-t", "5", "--wrap", "sleep 600")
    leftovers.append(hold)
    wait_slurm(hold, ("RUNNING",), timeout=90)
    return hold


def submit_pack(state: Path, specs: list[Path], env: dict[str, str], leftovers: list[str]) -> tuple[list[int], str]:
    """``slurmhet submit`` of co-locatable specs that must become one pack: their job ids and its one Slurm id."""
    out = json.loads(cli("submit", "--json", *map(str, specs), state=state, env=env).stdout)["jobs"]
    (pack,) = {s for j in out for s in j["slurm_job_ids"]}  # one Slurm job for all of them: a pack
    leftovers.append(pack)
    return [j["job_id"] for j in out], pack


def replan_until_final(state: Path, job_ids: list[int], env: dict[str, str], leftovers: list[str],
                       timeout: float = 420) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """``replan --once`` every 2 s, as cron would, until every job is final: the last status rows and the actions
    replan took. Every Slurm job the jobs had on the way goes into ``leftovers``. ``timeout`` only catches jobs
    that never end: a pack's preemption test took 289 s in all in CI's 24.11 series, most of it in here."""
    actions: list[str] = []
    deadline = time.monotonic() + timeout
    while (rows := status(state)) and any(rows[i]["state"] not in ("COMPLETED", "FAILED", "CANCELLED")
                                          for i in job_ids):
        assert time.monotonic() < deadline, (rows, actions)
        actions += json.loads(cli("replan", "--once", "--json", state=state, env=env).stdout)["actions"]
        leftovers.extend(p["id"] for i in job_ids for p in rows[i]["slurm"])
        time.sleep(2)
    return rows, actions
