"""Shared fixtures; the real-cluster gate lives here.

With SLURMHET_REQUIRE_CLUSTER=1 (set by `make test`, hence CI) a missing Slurm
cluster or PostgreSQL server fails the run instead of skipping, and any skipped
cluster/postgres test turns the session red.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable, Iterator

import pytest

from slurmhet.slurm.client import SlurmCli
from slurmhet.slurm.runner import SlurmCommandError, SubprocessRunner

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


#: How long a cluster test waits, before it starts, for an earlier test's node to come back into service.
NODE_WAIT_S = 150
#: How long it waits for the jobs an earlier test left to end once cancelled: longer than the dev cluster's
#: UnkillableStepTimeout (180 s), after which Slurm ends a job whose step will not die.
LEFTOVER_WAIT_S = 240
#: Jobs the gate has already waited LEFTOVER_WAIT_S for in vain: not waited for again.
_WAITED: set[str] = set()
#: sinfo states (``%T``) in which a node takes no new job: down, drained/draining, failing, invalid, unknown, not
#: responding (``*``).
_OUT_OF_SERVICE = re.compile(r"down|drain|fail|inval|unknown|\*")
#: Nodes the gate has already waited NODE_WAIT_S for in vain: later tests fail at once on them rather than each
#: waiting again, so a node that stays out costs one wait, not one per remaining test (CI's 90 minutes).
_GAVE_UP: set[str] = set()


def _sinfo_nodes() -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return f"sinfo -> {out.returncode}: {out.stderr.strip()}"
    return "".join(f"{line}\n" for line in dict.fromkeys(out.stdout.splitlines()))  # a node once, not per partition


def _sinfo_rows(nodes: str) -> list[list[str]]:
    """(name, state, reason) of each node in what :func:`_sinfo_nodes` read; none where sinfo failed."""
    return [line.split("|", 2) for line in nodes.splitlines() if line.count("|") >= 2]


def _out_of_service(nodes: str) -> list[str]:
    rows = _sinfo_rows(nodes)
    if not rows:
        return [nodes.strip() or "sinfo listed no node"]
    return [f"{name} {state} ({reason})" for name, state, reason in rows if _OUT_OF_SERVICE.search(state)]


def _kill_task_failed(nodes: str) -> list[str]:
    """Nodes Slurm drained because a job's processes outlived SIGKILL by UnkillableStepTimeout, now empty.

    On the dev cluster that is the host's load (three slurmd, two clusters' tests, one small machine), not a broken
    node: an admin resumes such a node once its jobs are gone, which ``drained`` (not ``draining``) says.
    """
    return [name for name, state, reason in _sinfo_rows(nodes)
            if state == "drained" and reason.startswith("Kill task failed")]


def _wait_in_service(read: Callable[[], str], wait_s: float, gave_up: set[str],
                     resume: Callable[[str], None] = lambda node: None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> str | None:
    """None once every node takes jobs; else why the test must fail.

    Waits up to ``wait_s`` for nodes to come back, except for nodes in ``gave_up`` (already waited for in vain),
    which fail at once; the nodes it gives up on join ``gave_up``. A node drained for "Kill task failed" whose jobs
    are gone is handed to ``resume`` (see :func:`_kill_task_failed`).
    """
    deadline = clock() + wait_s
    while bad := _out_of_service(nodes := read()):
        for node in _kill_task_failed(nodes):
            resume(node)
        if {line.split()[0] for line in bad} <= gave_up:
            return f"dev cluster node(s) still out of service, as an earlier test found: {'; '.join(bad)}"
        if clock() > deadline:
            gave_up.update(line.split()[0] for line in bad)
            return f"dev cluster node(s) out of service for {wait_s:.0f}s before the test: {'; '.join(bad)}"
        sleep(2)
    return None


@pytest.fixture(autouse=True)
def cluster_ready_for_test(request: pytest.FixtureRequest) -> None:
    """A cluster test starts on an empty queue and with every node able to take jobs, or fails at once naming the
    node and its reason.

    A job an earlier test left running, or a node it took out of service (drained, its slurmd killed, the
    controller restarted), otherwise shows up minutes later as a job that never starts, far from its cause.
    Leftover jobs are cancelled first, so that a node drained for "Kill task failed" can empty and be resumed.
    """
    if "slurm_cluster" not in request.fixturenames:
        return
    request.getfixturevalue("slurm_cluster")
    if cancelled := _clear_leftovers(_queued_jobs, _scancel, LEFTOVER_WAIT_S, _WAITED):
        warnings.warn(cancelled, stacklevel=1)
    if why := _wait_in_service(_sinfo_nodes, NODE_WAIT_S, _GAVE_UP, resume=_resume):
        pytest.fail(why, pytrace=False)


def _queued_jobs() -> str:
    """Every job Slurm lists, as ``id|user|state|name`` lines; a het job or job array once, under its leader's id
    (``%F``); nothing where squeue fails (the node check then says why)."""
    out = subprocess.run(["squeue", "-a", "-h", "-o", "%F|%u|%T|%j"], capture_output=True, text=True, timeout=30)
    return out.stdout if out.returncode == 0 else ""


def _job_rows(queue: str) -> dict[str, str]:
    """Slurm id -> "user state name" of each job in what :func:`_queued_jobs` read."""
    rows = [line.split("|", 3) for line in queue.splitlines() if line.count("|") >= 3]
    return {job_id: " ".join(rest) for job_id, *rest in rows}


def _scancel(job_ids: list[str]) -> None:
    subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30)


def _clear_leftovers(read: Callable[[], str], cancel: Callable[[list[str]], None], wait_s: float, waited: set[str],
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Cancel every job in the queue and wait up to ``wait_s`` for it to go; what was done, for the warnings summary.

    Each test has its own store and cancels the jobs it made, and nothing else submits between tests, so a job
    listed when a test starts outlived the test that made it. It holds GPUs that the next test's plan, counting
    the cluster's, does not expect. On 24.11 one such job held a V100 for the rest of a run and failed 9 replan
    tests, whose blockers had to take every usable GPU. A job that comes back pending or running after it was
    seen completing requeued itself on the cancel's SIGTERM (slurmhet's in-job wrapper takes SIGTERM for a
    preemption, and 26.05 requeued a cancelled job that way in CI, 2026-12-06), so it is cancelled again. A job
    still there after the wait joins ``waited`` and is not waited for again: the test runs, and the node check
    and its own assertions say the rest.
    """
    left = _job_rows(read())
    if not left:
        return None
    cancel(sorted(left))
    said = "dev cluster: cancelled job(s) an earlier test left in the queue: " + "; ".join(
        f"{job_id} ({what})" for job_id, what in sorted(left.items()))
    completing: set[str] = set()
    requeued: set[str] = set()
    deadline = clock() + wait_s
    while still := {job_id: what for job_id, what in _job_rows(read()).items() if job_id not in waited}:
        states = {job_id: what.split()[1] if len(what.split()) > 1 else "" for job_id, what in still.items()}
        if back := sorted(job_id for job_id in completing if states.get(job_id) in ("PENDING", "RUNNING")):
            cancel(back)
            requeued.update(back)
            completing.difference_update(back)
        completing.update(job_id for job_id, state in states.items() if state == "COMPLETING")
        if clock() > deadline:
            waited.update(still)
            said += f"; still there after {wait_s:.0f}s: " + "; ".join(
                f"{job_id} ({what})" for job_id, what in sorted(still.items()))
            break
        sleep(2)
    if requeued:
        said += "; cancelled again after requeueing themselves: " + ", ".join(sorted(requeued))
    return said


def _resume(node: str) -> None:
    """Resume a node drained for "Kill task failed", and say so in the session's warnings summary."""
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True, timeout=30)
    warnings.warn(f"dev cluster: resumed {node}, drained by Slurm for \"Kill task failed\" (a job's processes "
                  "outlived SIGKILL by UnkillableStepTimeout) and now empty", stacklevel=1)


#: Lines of each Slurm daemon's log a failed cluster test's report ends with.
DAEMON_LOG_LINES = 12


def _daemon_logs(nodes: str) -> str:
    """Whether each node's slurmd runs, and the last lines of slurmctld's and each slurmd's log, where Slurm's
    own configuration puts them: why a node went out of service is written there, and CI keeps only the output.

    ``nodes`` is what :func:`_sinfo_nodes` read for the same report.
    """
    settings = SlurmCli(SubprocessRunner()).config()
    nodes = sorted({name for name, _, _ in _sinfo_rows(nodes)})
    logs = {"slurmctld": settings.get("SlurmctldLogFile", "")}
    out = []
    for node in nodes:
        logs[f"slurmd {node}"] = settings.get("SlurmdLogFile", "").replace("%n", node)
        pid_file = Path(settings.get("SlurmdPidFile", "").replace("%n", node))
        pid = pid_file.read_text().strip() if pid_file.is_file() else ""
        out.append(f"slurmd {node}: {'running' if pid and Path(f'/proc/{pid}').exists() else 'not running'}"
                   f" (pid file {pid_file}: {pid or 'none'})")
    for name, path in logs.items():
        lines = Path(path).read_text(errors="replace").splitlines()[-DAEMON_LOG_LINES:] if Path(path).is_file() else []
        out.append(f"{name} log {path or '(not configured)'}, last {len(lines)} lines:\n" + "\n".join(lines))
    return "\n".join(out) + "\n"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed cluster test's report carries the nodes' states and the queue as they were when it failed."""
    outcome = yield
    report = outcome.get_result()
    if not (report.failed and "slurm_cluster" in getattr(item, "fixturenames", ())):
        return
    try:
        nodes = _sinfo_nodes()
        queue = subprocess.run(["squeue", "-a", "-o", "%i %u %T %r %b %N"], capture_output=True, text=True,
                               timeout=30)
        report.sections.append(("dev cluster when it failed", f"sinfo (node|state|reason):\n{nodes}\n"
                                f"squeue:\n{queue.stdout}{queue.stderr}\n{_daemon_logs(nodes)}"))
    except (OSError, subprocess.TimeoutExpired, SlurmCommandError) as exc:
        report.sections.append(("dev cluster when it failed", f"could not ask Slurm: {exc}"))


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
