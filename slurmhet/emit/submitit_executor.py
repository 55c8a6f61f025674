"""submitit executors whose sbatch goes through slurmhet's runner.

Users keep submitit's Job handles and result retrieval; slurmhet keeps its rule
that one runner runs every Slurm command (so refusals carry Slurm's message).
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from slurmhet.emit.requests import HetJobRequest, Materialized
from slurmhet.slurm.parsers import parse_sbatch_parsable
from slurmhet.slurm.runner import SlurmRunner


class RunnerSlurmExecutor(submitit.SlurmExecutor):
    """A ``submitit.SlurmExecutor`` that submits through a ``SlurmRunner``."""

    def __init__(self, folder: str | Path, runner: SlurmRunner, timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(folder, **kwargs)
        self.runner = runner
        self.timeout = timeout

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", "--parsable", str(submission_file_path)]

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        return parse_sbatch_parsable(string.decode() if isinstance(string, bytes) else string)

    def _submit_command(self, command: str) -> submitit.Job[Any]:
        # Mirrors submitit's PicklingExecutor._submit_command, with our runner in place of CommandFunction.
        tmp_uuid = uuid.uuid4().hex
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        submission_file = folder / f".submission_file_{tmp_uuid}.sh"
        submission_file.write_text(self._make_submission_file_text(command, tmp_uuid))
        result = self.runner.run(self._make_submission_command(submission_file), timeout=self.timeout)
        job_id = self._get_job_id_from_submission_command(result.stdout)
        job: submitit.Job[Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=list(range(self._num_tasks())))
        job.paths.move_temporary_file(submission_file, "submission_file", keep_as_symlink=True)
        self._write_job_id(job.job_id, tmp_uuid)
        self._set_job_permissions(job.paths.folder)
        return job


class HetInfoWatcher(SlurmInfoWatcher):
    """submitit's sacct reader, taught heterogeneous ids: ``N+k`` rows answer for job ``N``."""

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        lines = text.splitlines()
        return super().read_info("\n".join(lines[:1] + [re.sub(r"^(\d+)\+\d+", r"\1", line) for line in lines[1:]]))


class HetSlurmJob(SlurmJob[Any]):
    watcher = HetInfoWatcher(delay_s=600)


class HetSubmititExecutor(RunnerSlurmExecutor):
    """submitit for heterogeneous jobs: the script is slurmhet's het template, the handles are submitit's.

    submitit holds one resource shape per job, so a ``HetJobRequest`` supplies the
    components; submitit's own worker command becomes the program the one
    ``srun --het-group=0,1,...`` step launches. Every task sees the leader's
    ``SLURM_JOB_ID`` and a global ``SLURM_PROCID``, which is what submitit's
    job environment reads, so results and requeue behave as for a plain job.
    """

    def __init__(self, folder: str | Path, runner: SlurmRunner, request: HetJobRequest, timeout: float = 30.0,
                 **kwargs: Any) -> None:
        super().__init__(folder, runner, timeout, **kwargs)
        self.request = request
        self._rendered: Materialized | None = None

    job_class = HetSlurmJob

    def _num_tasks(self) -> int:
        return sum(c.tasks for c in self.request.components)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        # SUBMITIT_EXECUTOR tells submitit's worker it runs under Slurm (its own template exports it too).
        launch = replace(self.request.launch, program=tuple(shlex.split(command)),
                         env=(("SUBMITIT_EXECUTOR", "slurm"), *self.request.launch.env))
        self._rendered = replace(self.request, launch=launch).materialize()
        return self._rendered.script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        if self._rendered is None:
            raise RuntimeError("the het script is rendered before the submission command")
        return ["sbatch", "--parsable", *self._rendered.argv, str(submission_file_path)]
