"""`slurmhet result`: submitit's result files read back; a missing file is None, an exception keeps its traceback."""

from __future__ import annotations

from pathlib import Path

from submitit.core.utils import cloudpickle_dump

from slurmhet.results import read_result, result_path


def test_success_error_and_missing(tmp_path: Path) -> None:
    path = result_path(tmp_path, 7, "123", 0)
    assert path == tmp_path / "submitit" / "7" / "123_0_result.pkl"
    assert read_result(path) is None
    path.parent.mkdir(parents=True)
    cloudpickle_dump(("success", {"acc": 0.91, "epochs": 3}), path)
    ok = read_result(path)
    assert ok is not None and ok.ok and ok.value == {"acc": 0.91, "epochs": 3}
    failed = result_path(tmp_path, 7, "124", 1)
    cloudpickle_dump(("error", "Traceback (most recent call last):\nValueError: boom"), failed)
    err = read_result(failed)
    assert err is not None and not err.ok and err.traceback.endswith("ValueError: boom")
