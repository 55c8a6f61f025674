"""MPS lifecycle of co-location packs, against the stand-in control program (and the real one on a GPU node)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slurmhet.errors import InputError, SystemFailure
from slurmhet.runtime.mps import PackMember, load_pack, pack_exit_status, run_pack

REPO = Path(__file__).resolve().parents[2]
STANDINS = REPO / "tests" / "standins"


def _member_script(tmp_path: Path, name: str, exit_code: int = 0, sleep_s: float = 0.3) -> tuple[str, ...]:
    """A member that records when it ran and what MPS environment it saw, then exits with ``exit_code``."""
    code = textwrap.dedent(f"""
        import json, os, pathlib, signal, sys, time
        out = pathlib.Path({str(tmp_path)!r}) / {name + '.json'!r}
        seen = {{k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY",
                                              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "SLURMHET_PACK_MEMBER")}}
        seen["start"] = time.time()
        pipe = seen["CUDA_MPS_PIPE_DIRECTORY"]
        seen["pipe_entries"] = sorted(os.listdir(pipe)) if pipe else []
        def stop(signum, frame):
            seen["signal"] = signum
            out.write_text(json.dumps(seen))
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        out.write_text(json.dumps(seen))
        time.sleep({sleep_s})
        seen["end"] = time.time()
        out.write_text(json.dumps(seen))
        sys.exit({exit_code})
    """)
    return (sys.executable, "-c", code)


def _env(tmp_path: Path, with_standin: bool) -> dict[str, str]:
    path = os.environ.get("PATH", "")
    # Keep only PATH entries without a real control program, so the no-MPS test is meaningful everywhere.
    entries = [p for p in path.split(os.pathsep) if not (Path(p) / "nvidia-cuda-mps-control").exists()]
    if with_standin:
        entries.insert(0, str(STANDINS))
    return {**os.environ, "PATH": os.pathsep.join(entries), "TMPDIR": str(tmp_path),
            "SLURMHET_MPS_STANDIN_LOG": str(tmp_path / "mps.log"), "SLURM_JOB_ID": "9700"}


def _log(tmp_path: Path) -> list[tuple[float, str]]:
    lines = (tmp_path / "mps.log").read_text().splitlines()
    return [(float(t), rest) for t, _, rest in (line.partition(" ") for line in lines)]


def test_private_daemon_starts_before_members_and_quits_after(tmp_path: Path) -> None:
    members = [PackMember("a", _member_script(tmp_path, "a"), 60),
               PackMember("b", _member_script(tmp_path, "b", exit_code=4), 40)]
    lines: list[str] = []
    results = run_pack(members, env=_env(tmp_path, True), log=lines.append)
    assert [(r.name, r.returncode, r.mps_active) for r in results] == [("a", 0, True), ("b", 4, True)]
    assert pack_exit_status(results) == 4

    events = _log(tmp_path)
    start = next(t for t, e in events if e.startswith("start"))
    quit_at = next(t for t, e in events if e == "quit")
    start_line = next(e for _, e in events if e.startswith("start"))
    assert "pipe_mode=700" in start_line
    seen = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"}
    assert all(start < s["start"] for s in seen.values()), "members must start after the daemon"
    assert all("control" in s["pipe_entries"] for s in seen.values()), "the daemon listens while members run"
    assert all(s["end"] < quit_at for s in seen.values()), "quit must come after the members"
    assert seen["a"]["start"] < seen["b"]["end"] and seen["b"]["start"] < seen["a"]["end"], "members run concurrently"
    assert (seen["a"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], seen["b"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == ("60", "40")
    pipe = Path(seen["a"]["CUDA_MPS_PIPE_DIRECTORY"])
    assert pipe.parent.parent == tmp_path and pipe.parent.name.startswith("slurmhet-mps-9700-")
    assert seen["a"]["CUDA_MPS_LOG_DIRECTORY"].startswith(str(pipe.parent))
    assert not pipe.parent.exists(), "the private directory is removed after quit"
    assert any("member b: exit status 4" in line for line in lines)


def test_private_directories_are_mode_0700_even_with_a_lax_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        run_pack([PackMember("a", _member_script(tmp_path, "a", sleep_s=0.0))], env=_env(tmp_path, True),
                 log=lambda _: None)
    finally:
        os.umask(old)
    assert "pipe_mode=700" in next(e for _, e in _log(tmp_path) if e.startswith("start"))


def test_quit_is_sent_when_a_member_cannot_start(tmp_path: Path) -> None:
    members = [PackMember("ok", _member_script(tmp_path, "ok", sleep_s=0.0)),
               PackMember("missing", (str(tmp_path / "no-such-program"),))]
    results = run_pack(members, env=_env(tmp_path, True), log=lambda _: None)
    assert [(r.name, r.returncode) for r in results] == [("ok", 0), ("missing", 127)]
    assert "cannot start" in results[1].error
    assert [e for _, e in _log(tmp_path) if e == "quit"] == ["quit"]


def test_daemon_start_failure_runs_no_member(tmp_path: Path) -> None:
    broken = tmp_path / "bin"
    broken.mkdir()
    control = broken / "nvidia-cuda-mps-control"
    control.write_text("#!/bin/sh\necho 'cannot start daemon' >&2\nexit 1\n")
    control.chmod(0o755)
    env = _env(tmp_path, False)
    env["PATH"] = f"{broken}{os.pathsep}{env['PATH']}"
    with pytest.raises(SystemFailure, match="-d exited 1"):
        run_pack([PackMember("a", _member_script(tmp_path, "a"))], env=env, log=lambda _: None)
    assert not (tmp_path / "a.json").exists()
    assert not list(tmp_path.glob("slurmhet-mps-*"))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])
def test_signal_is_forwarded_to_members_then_quit_is_sent(tmp_path: Path, signum: int) -> None:
    members = [{"name": "long", "argv": list(_member_script(tmp_path, "long", sleep_s=30)), "thread_percentage": 50}]
    pack = tmp_path / "pack.json"
    pack.write_text(json.dumps({"members": members}))
    runner = ("import sys; from slurmhet.runtime.mps import load_pack, run_pack, pack_exit_status; "
              f"sys.exit(pack_exit_status(run_pack(load_pack({str(pack)!r}))))")
    proc = subprocess.Popen([sys.executable, "-c", runner], env=_env(tmp_path, True), cwd=REPO)
    try:
        deadline = time.time() + 30
        while not (tmp_path / "long.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "long.json").exists(), "member did not start"
        proc.send_signal(signum)
        status = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    seen = json.loads((tmp_path / "long.json").read_text())
    if signum == signal.SIGTERM:
        assert seen["signal"] == signal.SIGTERM and status == 0  # the member checkpointed and exited cleanly
    else:
        assert status == 128 + signal.SIGUSR2  # this member has no USR2 handler: it died of it
    assert [e for _, e in _log(tmp_path) if e == "quit"] == ["quit"]


def test_without_mps_members_still_run_concurrently_and_the_log_says_so(tmp_path: Path) -> None:
    lines: list[str] = []
    members = [PackMember(n, _member_script(tmp_path, n), 50) for n in "ab"]
    results = run_pack(members, env=_env(tmp_path, False), log=lines.append)
    assert [(r.returncode, r.mps_active) for r in results] == [(0, False), (0, False)]
    assert any("MPS is NOT active" in line for line in lines)
    seen = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"}
    assert seen["a"]["start"] < seen["b"]["end"] and seen["b"]["start"] < seen["a"]["end"]
    assert seen["a"]["CUDA_MPS_PIPE_DIRECTORY"] is None
    assert not (tmp_path / "mps.log").exists()


def _chatty(name: str, lines: int, exit_code: int) -> list[str]:
    """A member that writes ``lines`` lines to stdout and to stderr as fast as it can, each in two writes (the
    text, then its newline, as an unbuffered ``print`` does), a progress bar redrawn with no newline among them,
    then exits with ``exit_code``."""
    code = (f"import os, sys\nfor i in range({lines}):\n"
            f"    for fd, stream in ((1, 'out'), (2, 'err')):\n"
            f"        os.write(fd, f'{name}-{{stream}} {{i}}'.encode()); os.write(fd, b'\\n')\n"
            f"os.write(2, b'{name} 50%\\r'); os.write(2, b'{name} 100%\\r'); os.write(2, b'{name} bar done\\n')\n"
            f"sys.exit({exit_code})")
    return [sys.executable, "-c", code]


def _run_pack_process(tmp_path: Path, members: list[dict[str, object]]) -> tuple[int, str, str]:
    """run-pack as a Slurm job runs it (its stdout and stderr the pack's files): status, stdout, stderr."""
    pack = tmp_path / "pack.json"
    pack.write_text(json.dumps({"members": members}))
    runner = ("import sys; from slurmhet.runtime.mps import load_pack, run_pack, pack_exit_status; "
              f"sys.exit(pack_exit_status(run_pack(load_pack({str(pack)!r}))))")
    with (tmp_path / "pack.out").open("ab") as out, (tmp_path / "pack.err").open("ab") as err:
        status = subprocess.run([sys.executable, "-c", runner], env=_env(tmp_path, False), cwd=REPO, stdout=out,
                                stderr=err, timeout=60).returncode
    return status, (tmp_path / "pack.out").read_bytes().decode(), (tmp_path / "pack.err").read_bytes().decode()


def test_each_member_has_its_own_logs_and_the_packs_have_every_line_whole(tmp_path: Path) -> None:
    """Each member's output goes to the pack's files (whole lines, never two members' fused) and to its own
    (``%j`` the Slurm job id), with run-pack's own lines in each own stderr; a requeued run appends to both."""
    members = [{"name": n, "argv": _chatty(n, 300, code), "stdout": str(tmp_path / f"own-%j.{n}.out"),
                "stderr": str(tmp_path / f"own-%j.{n}.err")} for n, code in (("a", 0), ("b", 3))]
    status, out, err = _run_pack_process(tmp_path, members)
    assert status == 3
    for n in "ab":
        own_out = (tmp_path / f"own-9700.{n}.out").read_text().splitlines()
        assert own_out == [f"{n}-out {i}" for i in range(300)]
        own_err = (tmp_path / f"own-9700.{n}.err").read_bytes().decode().split("\n")  # a "\r" stays in its line
        assert [line for line in own_err if not line.startswith("slurmhet run-pack: ")] == [
            *(f"{n}-err {i}" for i in range(300)), f"{n} 50%\r{n} 100%\r{n} bar done", ""]
        pack_lines = [line for line in own_err if line.startswith("slurmhet run-pack: ")]
        assert any("MPS is NOT active" in line for line in pack_lines), pack_lines
        assert any(line.startswith(f"slurmhet run-pack: member {n}: exit status") for line in pack_lines)
    # The pack's files: both members' lines, each whole and in its member's order.
    for text, stream in ((out, "out"), (err, "err")):
        mine = {n: [line for line in text.split("\n") if line.startswith(f"{n}-{stream} ")] for n in "ab"}
        assert mine == {n: [f"{n}-{stream} {i}" for i in range(300)] for n in "ab"}
        assert all(re.fullmatch(r"[ab]-(out|err) \d+|[ab] 50%\r[ab] 100%\r[ab] bar done|slurmhet run-pack: .*", line)
                   for line in text.split("\n")[:-1]), text
    _run_pack_process(tmp_path, members)  # Slurm requeued it: the same job id, the same files, appended
    assert len((tmp_path / "own-9700.a.out").read_text().splitlines()) == 600


def test_an_own_log_that_cannot_be_opened_leaves_the_member_on_the_packs_files(tmp_path: Path) -> None:
    members = [{"name": "a", "argv": _chatty("a", 3, 0), "stdout": str(tmp_path / "missing" / "a.out"),
                "stderr": str(tmp_path / "a.err")}]
    status, out, err = _run_pack_process(tmp_path, members)
    assert status == 0 and out.splitlines() == ["a-out 0", "a-out 1", "a-out 2"]
    assert f"member a: cannot open its own stdout file {tmp_path / 'missing' / 'a.out'}" in err
    assert "a-err 2" in (tmp_path / "a.err").read_text()


@pytest.mark.parametrize(("content", "fragment"), [
    ("{}", "non-empty 'members'"),
    ('{"members": [{"name": "a"}]}', "'argv'"),
    ('{"members": [{"name": "a", "argv": ["x"], "thread_percentage": 0}]}', "1..100"),
    ('{"members": [{"name": "a", "argv": ["x"]}, {"name": "a", "argv": ["y"]}]}', "used twice"),
    ('{"members": [{"name": "a", "argv": ["x"], "gpu": 1}]}', "unknown field"),
    ('{"members": [{"name": "a", "argv": ["x"], "stderr": ["x.err"]}]}', "'stderr' must be a file path"),
    ('{"members": [{"name": "a", "argv": ["x"], "stdout": " "}]}', "'stdout' must be a file path"),
    ("not json", "cannot read pack file"),
])
def test_bad_pack_files_are_input_errors(tmp_path: Path, content: str, fragment: str) -> None:
    pack = tmp_path / "pack.json"
    pack.write_text(content)
    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        load_pack(pack)


def _real_mps_available() -> str | None:
    if not shutil.which("nvidia-cuda-mps-control"):
        return "no nvidia-cuda-mps-control on PATH"
    smi = shutil.which("nvidia-smi")
    if not smi or subprocess.run([smi, "-L"], capture_output=True, timeout=30).returncode != 0:
        return "no working NVIDIA GPU (nvidia-smi -L failed)"
    return None


@pytest.mark.skipif(_real_mps_available() is not None, reason=str(_real_mps_available()))
def test_lifecycle_against_the_real_mps_daemon(tmp_path: Path) -> None:
    members = [PackMember(n, _member_script(tmp_path, n), 50) for n in "ab"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    results = run_pack(members, env=env, log=lambda _: None)
    assert [(r.returncode, r.mps_active) for r in results] == [(0, True), (0, True)]
    seen = json.loads((tmp_path / "a.json").read_text())
    assert "control" in seen["pipe_entries"], "the real daemon listens in the private pipe directory"
    assert not Path(seen["CUDA_MPS_PIPE_DIRECTORY"]).exists(), "quit stops the daemon; the private directory is removed"


def test_members_join_the_spank_plugins_daemon_instead_of_starting_one(tmp_path: Path) -> None:
    """With --slurmhet-mps the plugin runs the job's daemon: run-pack must not start (or quit) a second one."""
    from slurmhet.runtime.mps import PackMember, run_pack

    marker = tmp_path / "control-called"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\ntouch {marker}\n")
    control.chmod(0o755)
    pipe = tmp_path / "plugin-pipe"
    pipe.mkdir()
    seen = tmp_path / "seen"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURMHET_MPS_DAEMON": "1", "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}
    member = PackMember("a", ("sh", "-c", f'echo "$CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" > {seen}'),
                        50)
    lines: list[str] = []
    results = run_pack([member], env=env, tmp_root=tmp_path, log=lines.append)
    assert [r.returncode for r in results] == [0] and results[0].mps_active
    assert seen.read_text().split() == [str(pipe), "50"]
    assert not marker.exists() and any("SPANK plugin" in line for line in lines)
