"""The runner: argv only, timeouts, and errors that carry the command, exit code and output."""

from __future__ import annotations

import pytest

from slurmhet.slurm.runner import SlurmCommandError, SubprocessRunner, scrubbed_environment


def test_failure_carries_everything() -> None:
    runner = SubprocessRunner(timeout=5)
    with pytest.raises(SlurmCommandError) as info:
        runner.run(["bash", "-c", "echo out; echo 'sbatch: error: Batch job submission failed' >&2; exit 1"])
    err = info.value
    assert err.argv[0] == "bash" and err.returncode == 1
    assert err.stdout == "out\n" and "submission failed" in err.stderr
    assert err.message == "sbatch: error: Batch job submission failed"
    assert err.exit_code == 1


def test_timeout_and_missing_program() -> None:
    runner = SubprocessRunner(timeout=0.2)
    with pytest.raises(SlurmCommandError) as info:
        runner.run(["sleep", "5"])
    assert info.value.timed_out and str(info.value) == "sleep failed (timed out after 0.2 s)"
    slow = SubprocessRunner(timeout=2)  # time for bash to start and speak on a loaded machine
    with pytest.raises(SlurmCommandError) as info:  # an sbatch cut off after it printed its id
        slow.run(["bash", "-c", "echo 'Submitted batch job 81'; sleep 30"])
    assert info.value.message == "timed out after 2 s" and "81" in info.value.stdout
    with pytest.raises(SlurmCommandError) as info:
        slow.run(["bash", "-c", "echo 'sbatch: error: Socket timed out on send/recv operation' >&2; sleep 30"])
    assert info.value.message == "timed out after 2 s: sbatch: error: Socket timed out on send/recv operation"
    with pytest.raises(SlurmCommandError, match="not found"):
        runner.run(["no-such-slurm-command-xyz"])


def test_stdin_and_no_shell() -> None:
    out = SubprocessRunner().run(["cat"], stdin="$(echo no); `x`").stdout
    assert out == "$(echo no); `x`"


def test_inherited_slurm_variables_are_scrubbed() -> None:
    env = {"SLURM_JOB_ID": "1", "SBATCH_GRES": "x", "SRUN_CPUS_PER_TASK": "2", "SLURM_CONF": "/c", "PATH": "/bin"}
    assert scrubbed_environment(env) == {"SLURM_CONF": "/c", "PATH": "/bin"}
    out = SubprocessRunner(base_env={**env}).run(["env"]).stdout
    assert "SLURM_JOB_ID" not in out and "SLURM_CONF=/c" in out
