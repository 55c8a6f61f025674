"""examples/train.py's summary line: the cluster tests and users parse it, one JSON document per line."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


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
    spec = importlib.util.spec_from_file_location("example_train", REPO / "examples" / "train.py")
    assert spec is not None and spec.loader is not None
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    out = WriteRecorder()
    monkeypatch.setattr(sys, "stdout", out)
    assert train.main(["--steps", "2", "--dataset-size", "64", "--global-batch", "16"], env={}) == 0
    [summary] = [w for w in out.writes if "final_loss" in w]
    assert summary.endswith("\n") and summary.count("\n") == 1
    assert json.loads(summary)["steps"] == 2
