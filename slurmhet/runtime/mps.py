"""Co-location packs: run several small jobs on one GPU under a job-private MPS daemon.

Thesis (seed 002) 2.1.3: without MPS, kernels from different processes
time-share the GPU; with MPS one server runs them concurrently, which is where
co-location speedup comes from. Each pack gets its *own* control daemon, so
packs on one node cannot see or stop each other's:

* pipe and log directories live in a fresh 0700 directory under the job's
  tmp directory (``TMPDIR``), passed as ``CUDA_MPS_PIPE_DIRECTORY`` /
  ``CUDA_MPS_LOG_DIRECTORY`` to the daemon and to every member;
* the daemon starts (``nvidia-cuda-mps-control -d``) before any member; each
  member gets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the plan;
* ``quit`` is sent when the members are done, on an error, and after SIGTERM or
  SIGUSR2 (forwarded to the members first so they can checkpoint);
* every member's exit status is collected and reported;
* a member with its own log files (``stdout``/``stderr``, ``%j`` the Slurm job id) writes to a pipe that
  run-pack copies to the pack's shared files and to its own, and run-pack's lines go to each own stderr
  too: a member's logs, and the stderr its failure is judged on, are its own.

Without ``nvidia-cuda-mps-control`` on PATH (the CPU dev cluster) the members
still run concurrently, and the log says plainly that MPS is not active.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, BinaryIO, Callable, Mapping, Sequence

from slurmhet.errors import InputError, SystemFailure
from slurmhet.runtime.output import Copier, say

CONTROL_PROGRAM = "nvidia-cuda-mps-control"
TRAPPED_SIGNALS = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)
CONTROL_TIMEOUT_S = 30.0
#: What begins run-pack's own lines in the pack's stderr (and in each member's own).
LOG_PREFIX = "slurmhet run-pack: "


@dataclass(frozen=True)
class PackMember:
    """One co-located job: its command, its share of the GPU's SMs (percent) and extra environment."""

    name: str
    argv: tuple[str, ...]
    thread_percentage: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: Its own output files beside the pack's (``%j``: the Slurm job id); None: only the pack's.
    stdout: str | None = None
    stderr: str | None = None


@dataclass(frozen=True)
class MemberResult:
    name: str
    returncode: int
    started_at: float
    ended_at: float
    mps_active: bool
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _member(entry: Any, place: str) -> PackMember:
    if not isinstance(entry, dict):
        raise InputError("a pack member must be a mapping", place=place, hint='{"name": "a", "argv": ["python", "t.py"]}')
    name, argv = entry.get("name"), entry.get("argv")
    if not isinstance(name, str) or not name.strip():
        raise InputError("member needs a 'name'", place=f"{place}.name", hint='"name": "job-a"')
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise InputError("'argv' must be a non-empty list of strings", place=f"{place}.argv",
                         hint='"argv": ["python", "train.py"]')
    pct = entry.get("thread_percentage")
    if pct is not None and (isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100):
        raise InputError(f"thread_percentage must be a whole number in 1..100, got {pct!r}",
                         place=f"{place}.thread_percentage", hint='"thread_percentage": 50')
    env = entry.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise InputError("'env' must map names to strings", place=f"{place}.env", hint='"env": {"SEED": "1"}')
    for stream in ("stdout", "stderr"):
        value = entry.get(stream)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InputError(f"'{stream}' must be a file path", place=f"{place}.{stream}",
                             hint=f'"{stream}": "logs/job-a-%j.{"out" if stream == "stdout" else "err"}"')
    unknown = set(entry) - {"name", "argv", "thread_percentage", "env", "stdout", "stderr"}
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", place=place,
                         hint="fields: name, argv, thread_percentage, env, stdout, stderr")
    return PackMember(name.strip(), tuple(argv), pct, dict(env), entry.get("stdout"), entry.get("stderr"))


def load_pack(path: str | Path) -> list[PackMember]:
    """Read a pack file: ``{"members": [{"name", "argv", "thread_percentage", "env", "stdout", "stderr"}]}``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read pack file: {exc}", place=str(path), hint="a JSON object with 'members'") from exc
    if not isinstance(data, dict) or not isinstance(data.get("members"), list) or not data["members"]:
        raise InputError("pack file needs a non-empty 'members' list", place=str(path),
                         hint='{"members": [{"name": "a", "argv": ["python", "t.py"]}]}')
    members = [_member(m, f"{path}:members[{i}]") for i, m in enumerate(data["members"])]
    names = [m.name for m in members]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise InputError(f"member name {duplicate!r} is used twice", place=str(path), hint="give every member its own name")
    return members


def _private_dirs(env: Mapping[str, str], tmp_root: Path | None) -> tuple[Path, Path, Path]:
    root = tmp_root or Path(env.get("TMPDIR") or tempfile.gettempdir())
    base = Path(tempfile.mkdtemp(prefix=f"slurmhet-mps-{env.get('SLURM_JOB_ID', 'local')}-", dir=root))
    pipe, logs = base / "pipe", base / "log"
    for d in (base, pipe, logs):
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o700)  # explicit: mkdir's mode is filtered by the umask
    return base, pipe, logs


def _control(argv: list[str], env: Mapping[str, str], stdin_text: str | None = None) -> None:
    try:
        done = subprocess.run(argv, input=stdin_text, env=dict(env), text=True, timeout=CONTROL_TIMEOUT_S,
                              stdin=None if stdin_text is not None else subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemFailure(f"{' '.join(argv)} failed: {exc}") from exc
    if done.returncode != 0:
        raise SystemFailure(f"{' '.join(argv)} exited {done.returncode}")


class _OwnLogs:
    """The members' own log files, opened for appending (a requeued run goes on in them, as Slurm's
    ``--open-mode=append`` does in the pack's), and the copies into them; a file that cannot be opened leaves
    that stream in the pack's file alone, which the log says."""

    def __init__(self, members: Sequence[PackMember], job_id: str, log: Callable[[str], None]) -> None:
        self.files: dict[tuple[str, str], BinaryIO] = {}
        self.copiers: list[Copier] = []
        for m in members:
            for stream, pattern in (("stdout", m.stdout), ("stderr", m.stderr)):
                if pattern is None:
                    continue
                path = Path(pattern.replace("%j", job_id))
                try:
                    self.files[(m.name, stream)] = path.open("ab")
                except OSError as exc:
                    log(f"member {m.name}: cannot open its own {stream} file {path} ({exc.strerror or exc}); "
                        "it goes to the pack's only")

    def note(self, line: str) -> None:
        """One of run-pack's own lines, in every member's own stderr as in the pack's."""
        for (_, stream), handle in self.files.items():
            if stream == "stderr":
                try:
                    handle.write((line + "\n").encode())
                    handle.flush()
                except OSError:
                    pass

    def pipes(self, name: str) -> dict[str, int | None]:
        """Popen's stdout/stderr for a member: a pipe for each stream copied to its own file."""
        return {s: subprocess.PIPE if (name, s) in self.files else None for s in ("stdout", "stderr")}

    def start(self, name: str, proc: "subprocess.Popen[bytes]") -> None:
        for stream, fd in (("stdout", 1), ("stderr", 2)):
            own = self.files.get((name, stream))
            pipe = getattr(proc, stream)
            if own is not None and pipe is not None:
                self.copiers.append(Copier(pipe, fd, own))

    def close(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        for copier in self.copiers:
            copier.join(max(0.0, deadline - time.monotonic()))
        for handle in self.files.values():
            handle.close()


def run_pack(members: Sequence[PackMember], *, env: Mapping[str, str] | None = None, tmp_root: Path | None = None,
             control_program: str = CONTROL_PROGRAM, grace_s: float = 60.0,
             log: Callable[[str], None] = lambda line: say(LOG_PREFIX + line),
             ) -> list[MemberResult]:
    """Run the members concurrently (under a private MPS daemon when one is available); return their results."""
    if not members:
        raise InputError("a pack needs at least one member", place="run-pack", hint="list the members")
    base_env = dict(os.environ if env is None else env)
    own = _OwnLogs(members, base_env.get("SLURM_JOB_ID", "local"), log)

    def log_both(line: str) -> None:
        log(line)
        own.note(LOG_PREFIX + line)

    try:
        return _run_pack(members, base_env, own, tmp_root, control_program, grace_s, log_both)
    finally:
        own.close()


def _run_pack(members: Sequence[PackMember], base_env: dict[str, str], own: _OwnLogs, tmp_root: Path | None,
              control_program: str, grace_s: float, log: Callable[[str], None]) -> list[MemberResult]:
    # With the SPANK plugin's --slurmhet-mps, the plugin already runs this job's daemon on this node; a second
    # one would fight it for the GPU, so the members join the plugin's daemon and its lifecycle stays the plugin's.
    plugin_daemon = base_env.get("SLURMHET_MPS_DAEMON") == "1" and bool(base_env.get("CUDA_MPS_PIPE_DIRECTORY"))
    control = None if plugin_daemon else shutil.which(control_program, path=base_env.get("PATH"))
    signalled: list[int] = []
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def trap(signum: int, _frame: FrameType | None) -> None:
        signalled.append(signum)
        for proc in processes.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {s: signal.signal(s, trap) for s in TRAPPED_SIGNALS}
    private: Path | None = None
    member_env = dict(base_env)
    try:
        if plugin_daemon:
            log(f"MPS daemon provided by the slurmhet SPANK plugin (pipe {base_env['CUDA_MPS_PIPE_DIRECTORY']})")
        elif control is None:
            log(f"MPS is NOT active: {control_program} is not on PATH; running {len(members)} members "
                "concurrently without MPS (time-sharing the GPU)")
        else:
            private, pipe, logs = _private_dirs(base_env, tmp_root)
            member_env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logs))
            _control([control, "-d"], member_env)
            log(f"MPS control daemon started (pipe {pipe}, log {logs})")
        try:
            return _run_members(members, member_env, plugin_daemon or control is not None, processes, signalled,
                                grace_s, log, own)
        finally:
            if control is not None:
                why = f"after signal {signal.Signals(signalled[0]).name}" if signalled else "members finished"
                _control([control], member_env, stdin_text="quit\n")
                log(f"MPS control daemon stopped ({why})")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _run_members(members: Sequence[PackMember], env: Mapping[str, str], mps_active: bool,
                 processes: dict[str, "subprocess.Popen[bytes]"], signalled: list[int], grace_s: float,
                 log: Callable[[str], None], own: _OwnLogs) -> list[MemberResult]:
    started: dict[str, float] = {}
    results: dict[str, MemberResult] = {}
    for m in members:
        if signalled:
            results[m.name] = MemberResult(m.name, 128 + signalled[0], time.time(), time.time(), mps_active,
                                           "not started: the pack was signalled")
            continue
        child_env = {**env, **m.env, "SLURMHET_PACK_MEMBER": m.name}
        if m.thread_percentage is not None:
            child_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(m.thread_percentage)
        started[m.name] = time.time()
        try:
            processes[m.name] = subprocess.Popen(list(m.argv), env=child_env, **own.pipes(m.name))
            own.start(m.name, processes[m.name])
        except OSError as exc:
            results[m.name] = MemberResult(m.name, 127, started[m.name], time.time(), mps_active,
                                           f"cannot start {m.argv[0]!r}: {exc.strerror or exc}")
    deadline: float | None = None
    while len(results) < len(members):
        for name, proc in processes.items():
            if name not in results and proc.poll() is not None:
                code = proc.returncode
                results[name] = MemberResult(name, 128 - code if code < 0 else code, started[name], time.time(),
                                             mps_active)
        if signalled and deadline is None:
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() > deadline:
            for name, proc in processes.items():
                if name not in results and proc.poll() is None:
                    log(f"member {name} ignored the signal for {grace_s:.0f}s; killing it")
                    proc.kill()
            deadline = float("inf")
        time.sleep(0.05)
    ordered = [results[m.name] for m in members]
    for r in ordered:
        log(f"member {r.name}: exit status {r.returncode} after {r.ended_at - r.started_at:.1f}s"
            f"{' (MPS)' if mps_active else ' (no MPS)'}{'; ' + r.error if r.error else ''}")
    return ordered


def pack_exit_status(results: Sequence[MemberResult]) -> int:
    """The pack's own status: 0 when every member succeeded, else the first failing member's status."""
    return next((r.returncode for r in results if r.returncode != 0), 0)
