"""`slurmhet result ID`: an entrypoint job's return value, or its exception, from submitit's own result files.

submitit writes ``<folder>/<slurm id>_<task>_result.pkl`` holding ``("success", value)`` or
``("error", traceback text)``; slurmhet's submitit folder is ``<state dir>/submitit/<job id>``.
The file is the user's own job output (loading it runs no code but the value's own pickle);
slurmhet never loads checkpoints this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths, pickle_load


@dataclass(frozen=True)
class Result:
    ok: bool
    value: Any = None
    traceback: str = ""


def result_path(state_dir: Path, job_id: int, slurm_id: str, rank: int = 0) -> Path:
    return Path(JobPaths(state_dir / "submitit" / str(job_id), slurm_id, rank).result_pickle)


def read_result(path: Path) -> Result | None:
    """The outcome in ``path``, or None when the job wrote none (still running, or killed before returning)."""
    if not path.is_file():
        return None
    kind, payload = pickle_load(path)
    if kind == "success":
        return Result(True, payload)
    return Result(False, traceback=str(payload))
