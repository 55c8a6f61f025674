"""examples/train.py's summary line (the cluster tests and users parse it, one JSON document per line) and its
progress record's last saved step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.unit.examples import example_train


class WriteRecorder:
    """A stdout that keeps each write() call apart, as an unbuffered stream hands each to the kernel."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_the_summary_line_is_one_write_so_pack_members_sharing_stdout_cannot_splice_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    train = example_train()
    out = WriteRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert train.main(["--steps", "2", "--dataset-size", "64", "--global-batch", "16"], env={}) == 0
    [summary] = [w for w in out.writes if "final_loss" in w]
    assert summary.endswith("\n") and summary.count("\n") == 1
    assert json.loads(summary)["steps"] == 2


def test_the_progress_record_says_which_step_the_last_checkpoint_holds(tmp_path: Path) -> None:
    """Where the next run resumes after a fault: the replanner plans the work left from there, not from the step
    reached. A run with no checkpoint directory saves nothing, so it says its start (0): it restarts from scratch."""
    from slurmhet.runtime.progress import read_record

    train = example_train()
    argv = ["--steps", "7", "--dataset-size", "64", "--global-batch", "16", "--checkpoint-every", "3"]
    saving = {"SLURMHET_PROGRESS_FILE": str(tmp_path / "saving.json"), "SLURMHET_CHECKPOINT_DIR": str(tmp_path / "c")}
    assert train.main(argv, env=saving) == 0
    record = read_record(tmp_path / "saving.json")
    assert record is not None and (record.steps_done, record.saved_steps) == (7, 7)  # the final save
    resumed = {**saving, "SLURMHET_PROGRESS_FILE": str(tmp_path / "resumed.json")}
    assert train.main(["--steps", "9", *argv[2:]], env=resumed) == 0
    record = read_record(tmp_path / "resumed.json")
    assert record is not None and (record.start_steps, record.steps_done, record.saved_steps) == (7, 9, 9)
    assert train.main(argv, env={"SLURMHET_PROGRESS_FILE": str(tmp_path / "none.json")}) == 0
    record = read_record(tmp_path / "none.json")
    assert record is not None and (record.steps_done, record.saved_steps) == (7, 0)
