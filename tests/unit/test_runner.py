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
    assert info.value.timed_out and "timed out after 0.2 s" in str(info.value)
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
