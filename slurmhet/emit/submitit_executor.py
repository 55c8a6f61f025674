"""submitit executors whose sbatch goes through slurmhet's runner.

Users keep submitit's Job handles and result retrieval; slurmhet keeps its rule
that one runner runs every Slurm command (so refusals carry Slurm's message).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import submitit
from submitit.core import utils

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
