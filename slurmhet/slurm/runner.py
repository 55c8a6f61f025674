"""The one place that runs Slurm commands.

Every call is an argv list with a timeout; nothing goes through a shell. A
failure raises ``SlurmCommandError`` carrying the command, exit code, stdout and
stderr, so callers can record Slurm's own words (e.g. sbatch's refusal).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from slurmhet.errors import SystemFailure

#: Variables a job inherits from its own allocation; passed on, they would make an
#: sbatch issued from inside a job (e.g. replan on a compute node) inherit that job's shape.
_INHERITED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
_KEEP = frozenset({"SLURM_CONF"})


def scrubbed_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment minus inherited ``SLURM_*``/``SBATCH_*``/``SRUN_*`` variables."""
    return {k: v for k, v in env.items() if k in _KEEP or not k.startswith(_INHERITED_PREFIXES)}


class SlurmCommandError(SystemFailure):
    """A Slurm command failed, timed out or could not be started."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stdout: str, stderr: str, note: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.note = note
        super().__init__(self.describe())

    @property
    def words(self) -> str:
        """What the command said, one line: stderr, else stdout, except a timed-out command's stdout (an sbatch
        cut off after it printed its id did not fail for that)."""
        text = self.stderr or ("" if self.timed_out else self.stdout)
        return " ".join(line.strip() for line in text.splitlines() if line.strip())

    @property
    def message(self) -> str:
        """Slurm's own words, one line, what to store as the reason; a timeout says so first."""
        if self.timed_out:
            return f"{self.note}: {self.words}" if self.words else self.note
        return self.words or self.note or f"exit code {self.returncode}"

    @property
    def timed_out(self) -> bool:
        return self.returncode is None and "timed out" in self.note

    def describe(self) -> str:
        how = self.note or f"exit code {self.returncode}"
        return f"{self.argv[0] if self.argv else '?'} failed ({how})" + (f": {self.words}" if self.words else "")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    stdout: str
    stderr: str


class SlurmRunner(Protocol):
    """Runs one Slurm command; the fake used by unit tests implements the same call."""

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult: ...


class SubprocessRunner:
    """The real runner: subprocess with an argv list, a timeout and a scrubbed environment."""

    def __init__(self, timeout: float = 30.0, base_env: Mapping[str, str] | None = None) -> None:
        self.timeout = timeout
        self.base_env = dict(os.environ if base_env is None else base_env)

    def run(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float | None = None,
            env: Mapping[str, str] | None = None) -> CommandResult:
        argv = [str(a) for a in argv]
        full_env = scrubbed_environment({**self.base_env, **(env or {})})
        try:
            proc = subprocess.run(
                argv, input=stdin, capture_output=True, text=True, timeout=timeout or self.timeout,
                env=full_env, check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandError(argv, None, "", "", note=f"{argv[0]} not found; is Slurm installed?") from exc
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise SlurmCommandError(argv, None, out, err, note=f"timed out after {timeout or self.timeout:g} s") from exc
        if proc.returncode != 0:
            raise SlurmCommandError(argv, proc.returncode, proc.stdout, proc.stderr)
        return CommandResult(tuple(argv), proc.stdout, proc.stderr)
