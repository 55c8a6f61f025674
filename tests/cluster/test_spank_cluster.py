"""The slurmhet SPANK plugin on the real dev cluster (built and loaded by `devcluster up`).

Jobs run as the unprivileged `slurmhet-test` user where ownership matters, with a stand-in
nvidia-cuda-mps-control (tests/standins) on the job's PATH where the daemon lifecycle matters.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
STANDIN = REPO / "tests" / "standins" / "nvidia-cuda-mps-control"
USER = "slurmhet-test"
DROP_IN = Path("/etc/slurm/plugstack.conf.d/slurmhet.conf")
LOG_DIR = Path(os.environ.get("DEVCLUSTER_ROOT", "/var/lib/slurmhet-devcluster")) / "log"
TIMEOUT = 180  # other engineers' jobs may hold the nodes for a while


def _run(*argv: str, user: str | None = None, env: dict[str, str] | None = None, check: bool = True,
         timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    full = [*(["runuser", "-u", user, "--"] if user else []), "env", *(f"{k}={v}" for k, v in (env or {}).items()),
            *argv]
    proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, cwd="/tmp")
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def _wait(predicate, what: str, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def plugin(slurm_cluster: None) -> None:
    """The plugin is loaded: srun lists its options (as slurmhet's profile probe checks for sbatch)."""
    help_text = _run("srun", "--help").stdout
    if "--slurmhet-mps" not in help_text:
        pytest.fail("srun --help has no --slurmhet-mps: the SPANK plugin is not loaded "
                    "(run etc/devcluster/devcluster up)", pytrace=False)
    assert "--slurmhet-mps" in _run("sbatch", "--help").stdout


@pytest.fixture
def standin() -> Iterator[tuple[Path, Path]]:
    """A world-readable bin dir with the stand-in control program, and its event log."""
    bin_dir = Path(tempfile.mkdtemp(prefix="slurmhet-spank-test-"))
    try:
        bin_dir.chmod(0o755)
        shutil.copy(STANDIN, bin_dir / STANDIN.name)
        (bin_dir / STANDIN.name).chmod(0o755)
        events = bin_dir / "events.log"
        events.touch()
        events.chmod(0o666)
        yield bin_dir, events
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


def _standin_env(bin_dir: Path, events: Path) -> dict[str, str]:
    return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "SLURMHET_MPS_STANDIN_LOG": str(events)}


def _events(events: Path) -> list[str]:
    return [line.split(" ", 1)[1] for line in events.read_text().splitlines() if " " in line]


def _starts(events: Path) -> list[str]:
    """Pipe directory of every daemon start."""
    return [m.group(1) for e in _events(events) if (m := re.match(r"start pid=\d+ pipe=(\S+)", e))]


def _quits(events: Path) -> int:
    return sum(1 for e in _events(events) if e == "quit")


def _env_lines(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


# ------------------------------------------------------------------------------------ MPS


def test_mps_variables_private_dirs_removed_after_job(plugin: None) -> None:
    script = ('env; for d in "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"; do '
              'stat -c "STAT %n %a %U %F" "$d"; done')
    out = _run("srun", "-D", "/tmp", "--slurmhet-mps=40", "--gres=gpu:v100:1", "bash", "-c", script, user=USER).stdout
    env = _env_lines(out)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    pipe, logs = env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]
    assert pipe != logs and f".{env['SLURMD_NODENAME']}/" in pipe
    stats = {line.split()[1]: line.split()[2:] for line in out.splitlines() if line.startswith("STAT ")}
    for d in (pipe, logs):
        assert stats[d] == ["700", USER, "directory"], stats
    # Gone once the step is over (slurmstepd runs slurm_spank_exit after srun returns).
    _wait(lambda: not Path(pipe).exists() and not Path(logs).exists(), f"{pipe} and {logs} to be removed", 30)
    assert env["SLURMHET_GPU_TYPE"] == "v100"


def test_bare_mps_option_uses_default_percentage(plugin: None) -> None:
    out = _run("srun", "-D", "/tmp", "--slurmhet-mps", "--gres=gpu:k80:1", "printenv",
               "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").stdout
    assert out.strip() == "100"  # default_mps=100 in the dev cluster's plugstack drop-in


def test_no_mps_option_no_mps_variables(plugin: None) -> None:
    out = _run("srun", "-D", "/tmp", "--gres=gpu:k80:1", "env").stdout
    assert "CUDA_MPS_" not in out
    assert _env_lines(out)["SLURMHET_GPU_TYPE"] == "k80"


@pytest.mark.parametrize("value", ["0", "101", "abc", "40%"])
def test_bad_mps_percentage_is_refused_by_srun(plugin: None, value: str) -> None:
    proc = _run("srun", "-D", "/tmp", f"--slurmhet-mps={value}", "--gres=gpu:k80:1", "true", check=False, timeout=60)
    assert proc.returncode != 0
    assert "--slurmhet-mps" in proc.stderr


def test_daemon_once_per_node_quit_at_job_end(plugin: None, standin: tuple[Path, Path]) -> None:
    bin_dir, events = standin
    out = _run("srun", "-D", "/tmp", "-N2", "--ntasks-per-node=2", "--gres=gpu:1", "--slurmhet-mps=30", "bash", "-c",
               'echo "NODE $SLURMD_NODENAME $CUDA_MPS_PIPE_DIRECTORY"', user=USER,
               env=_standin_env(bin_dir, events)).stdout
    pipes = {line.split()[2] for line in out.splitlines() if line.startswith("NODE ")}
    assert len(pipes) == 2  # two nodes, one private pipe directory each, shared by the node's 2 tasks
    _wait(lambda: _quits(events) >= 2, "quit on both nodes", 30)
    assert sorted(_starts(events)) == sorted(pipes)  # started exactly once per node
    assert _quits(events) == 2
    # The directories go after `quit` returns (same slurm_spank_exit), so a moment later than the quit event.
    _wait(lambda: all(not Path(p).exists() for p in pipes), f"{sorted(pipes)} to be removed", 30)
    assert _quits(events) == 2  # and no second quit came while waiting


def test_batch_job_steps_share_one_daemon(plugin: None, standin: tuple[Path, Path]) -> None:
    bin_dir, events = standin
    job = _run("sbatch", "--parsable", "-D", "/tmp", "-o", "/dev/null", "--wait", "--gres=gpu:t4:1",
               "--slurmhet-mps=50", "--wrap",
               'srun printenv CUDA_MPS_PIPE_DIRECTORY; srun printenv CUDA_MPS_PIPE_DIRECTORY; true',
               user=USER, env=_standin_env(bin_dir, events)).stdout.strip()
    assert job.isdigit()
    _wait(lambda: _quits(events) >= 1, "quit after the batch job", 30)
    starts = _starts(events)
    assert len(starts) == 1 and starts[0].endswith(f"/{job}.nodeb/mps-pipe"), _events(events)
    _wait(lambda: not Path(starts[0]).exists(), f"{starts[0]} to be removed", 30)
    time.sleep(1)
    assert _quits(events) == 1


def test_daemon_quit_when_job_is_cancelled(plugin: None, standin: tuple[Path, Path]) -> None:
    bin_dir, events = standin
    job = _run("sbatch", "--parsable", "-D", "/tmp", "-o", "/dev/null", "--gres=gpu:k80:1", "--slurmhet-mps=50",
               "--wrap", "srun sleep 600", user=USER, env=_standin_env(bin_dir, events)).stdout.strip()
    try:
        _wait(lambda: _starts(events), "the daemon to start", TIMEOUT)
        _wait(lambda: _run("squeue", "-h", "-j", job, "-s", "-o", "%i").stdout.count(f"{job}.0"), "step 0", 60)
    finally:
        _run("scancel", job, check=False)
    _wait(lambda: _quits(events) >= 1, "quit after scancel", 60)
    starts = _starts(events)
    assert len(starts) == 1 and _quits(events) == 1, _events(events)
    _wait(lambda: not Path(starts[0]).parent.exists(), f"{Path(starts[0]).parent} to be removed", 30)


def test_without_control_program_mps_is_logged_unavailable(plugin: None) -> None:
    env = _env_lines(_run("srun", "-D", "/tmp", "--slurmhet-mps=25", "--gres=gpu:k80:1", "env",
                          env={"PATH": "/usr/bin:/bin"}).stdout)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    job = env["SLURM_JOB_ID"]
    log = LOG_DIR / "slurmd-nodec.log"
    _wait(lambda: f"job {job} on nodec: nvidia-cuda-mps-control not found" in log.read_text(errors="replace"),
          "the 'MPS is not available' log line", 15)


# ------------------------------------------------------------------------------ GPU type


def test_gpu_type_t4_and_v100(plugin: None) -> None:
    assert _run("srun", "-D", "/tmp", "--gres=gpu:t4:1", "printenv", "SLURMHET_GPU_TYPE").stdout.strip() == "t4"
    # On nodea, without naming the type in the request: the type comes from the node's gres.conf.
    assert _run("srun", "-D", "/tmp", "-w", "nodea", "--gres=gpu:2", "printenv",
                "SLURMHET_GPU_TYPE").stdout.strip() == "v100"


def test_het_job_components_see_their_own_type(plugin: None) -> None:
    out = _run("srun", "-D", "/tmp", "--gres=gpu:v100:1", ":", "--gres=gpu:k80:1", "bash", "-c",
               'echo "TYPE $SLURMD_NODENAME $SLURMHET_GPU_TYPE"').stdout
    seen = {tuple(line.split()[1:]) for line in out.splitlines() if line.startswith("TYPE ")}
    assert seen == {("nodea", "v100"), ("nodec", "k80")}, out


def test_het_batch_job_components_see_their_own_type(plugin: None) -> None:
    out_file = Path(tempfile.mkdtemp(prefix="slurmhet-spank-het-")) / "out"
    try:
        out_file.parent.chmod(0o777)
        _run("sbatch", "--wait", "-D", "/tmp", "-o", str(out_file), "--gres=gpu:t4:1", ":", "--gres=gpu:v100:1",
             "--wrap", 'srun --het-group=0,1 bash -c "echo TYPE \\$SLURMD_NODENAME \\$SLURMHET_GPU_TYPE"')
        seen = {tuple(line.split()[1:]) for line in out_file.read_text().splitlines() if line.startswith("TYPE ")}
        assert seen == {("nodeb", "t4"), ("nodea", "v100")}, out_file.read_text()
    finally:
        shutil.rmtree(out_file.parent, ignore_errors=True)


def test_slurmhet_job_id_exported(plugin: None) -> None:
    assert _run("srun", "-D", "/tmp", "--slurmhet-job=77", "printenv", "SLURMHET_JOB_ID").stdout.strip() == "77"
    proc = _run("srun", "-D", "/tmp", "--slurmhet-job=x7", "true", check=False, timeout=60)
    assert proc.returncode != 0 and "--slurmhet-job" in proc.stderr


# ---------------------------------------------------------------------- plugin arguments


def test_bad_plugin_argument_is_logged_and_jobs_still_run(plugin: None) -> None:
    original = DROP_IN.read_text()
    line = next(line for line in original.splitlines() if line.startswith(("required", "optional")))
    # The same good arguments plus bad ones, so jobs of others running meanwhile behave the same.
    bad = original.replace(line, f"{line} default_mps=150 no_such_arg=1")
    tmp = DROP_IN.with_name(".slurmhet.conf.test")
    try:
        tmp.write_text(bad)
        tmp.chmod(0o644)
        os.replace(tmp, DROP_IN)
        out = _run("srun", "-D", "/tmp", "--slurmhet-mps", "--gres=gpu:t4:1", "env").stdout
    finally:
        tmp.write_text(original)
        tmp.chmod(0o644)
        os.replace(tmp, DROP_IN)
    env = _env_lines(out)
    assert env["SLURMHET_GPU_TYPE"] == "t4"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"  # the bad value was ignored
    log = LOG_DIR / "slurmd-nodeb.log"
    step = f"[{env['SLURM_JOB_ID']}.0]"

    def logged() -> bool:
        lines = [x for x in log.read_text(errors="replace").splitlines() if step in x]
        return (any("error: slurmhet_spank: plugstack.conf: bad argument default_mps=150" in x for x in lines)
                and any("unknown argument no_such_arg=1" in x for x in lines))

    _wait(logged, "the bad arguments in slurmd's log", 15)
