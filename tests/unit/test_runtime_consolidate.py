"""Checkpoint consolidation (HadarE V-B): exact arithmetic, step aggregation, validation, atomic output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurmhet.errors import InputError
from slurmhet.runtime.checkpoint import TrainingCheckpoint, load_checkpoint, save_checkpoint
from slurmhet.runtime.consolidate import consolidate
from slurmhet.runtime.progress import job_steps, read_progress

REPO = Path(__file__).resolve().parents[2]


def _copy(tmp_path: Path, name: str, value: float, steps: int, start: int = 10, *, momentum: float = 0.0,
          counter: int = 0) -> Path:
    model = {"w": torch.full((2, 2), value), "b": torch.tensor([value, -value], dtype=torch.float64),
             "bn.num_batches_tracked": torch.tensor(counter)}
    optimizer = {"state": {0: {"momentum_buffer": torch.full((2, 2), momentum)}},
                 "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0]}]}
    return save_checkpoint(tmp_path / name, TrainingCheckpoint(model=model, optimizer=optimizer, steps=steps,
                                                               start_steps=start))


def test_default_weights_are_steps_done_this_round_and_arithmetic_is_exact(tmp_path: Path) -> None:
    a = _copy(tmp_path, "copy-0.pt", 1.0, steps=13, momentum=0.5, counter=4)  # 3 steps this round
    b = _copy(tmp_path, "copy-1.pt", 5.0, steps=11, momentum=7.0, counter=9)  # 1 step
    result = consolidate(tmp_path / "consolidated.pt", [a, b])
    assert result.weights == (0.75, 0.25)
    assert (result.start_steps, result.round_steps, result.steps) == (10, (3, 1), 14)
    merged = load_checkpoint(tmp_path / "consolidated.pt")
    assert torch.equal(merged.model["w"], torch.full((2, 2), 2.0))  # 0.75 * 1 + 0.25 * 5
    assert merged.model["w"].dtype == torch.float32
    assert torch.equal(merged.model["b"], torch.tensor([2.0, -2.0], dtype=torch.float64))
    assert torch.equal(merged.model["bn.num_batches_tracked"], torch.tensor(4))  # integers: from the most steps
    assert torch.equal(merged.optimizer["state"][0]["momentum_buffer"], torch.full((2, 2), 0.5))
    assert result.optimizer_from == a
    assert (merged.steps, merged.start_steps) == (14, 14)  # the next round starts here


def test_explicit_weights_override_and_are_normalised(tmp_path: Path) -> None:
    a = _copy(tmp_path, "a.pt", 0.0, steps=12)
    b = _copy(tmp_path, "b.pt", 8.0, steps=12)
    c = _copy(tmp_path, "c.pt", 4.0, steps=12)
    result = consolidate(tmp_path / "out.pt", [a, b, c], weights=[2, 1, 1])
    assert result.weights == (0.5, 0.25, 0.25)
    assert torch.equal(load_checkpoint(tmp_path / "out.pt").model["w"], torch.full((2, 2), 3.0))
    assert result.steps == 16


def test_aggregated_steps_reach_the_jobs_progress(tmp_path: Path) -> None:
    a = _copy(tmp_path, "a.pt", 1.0, steps=13)
    b = _copy(tmp_path, "b.pt", 2.0, steps=15)
    consolidate(tmp_path / "out.pt", [a, b], progress_dir=tmp_path / "progress", job_id="77", slurm_job_id="9500")
    [record] = read_progress(tmp_path / "progress")
    assert (record.job_id, record.steps_done, record.state) == ("77", 18, "done")
    assert job_steps([record]) == {"77": 18}


def test_plain_state_dicts_need_explicit_weights(tmp_path: Path) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    torch.save({"w": torch.zeros(2)}, tmp_path / "b.pt")
    with pytest.raises(InputError, match="sum to zero") as info:
        consolidate(tmp_path / "out.pt", [tmp_path / "a.pt", tmp_path / "b.pt"])
    assert "--weights" in info.value.hint
    result = consolidate(tmp_path / "out.pt", [tmp_path / "a.pt", tmp_path / "b.pt"], weights=[1, 3])
    assert torch.equal(load_checkpoint(result.out).model["w"], torch.full((2,), 0.25))


@pytest.mark.parametrize(("other", "fragment"), [
    ({"w": torch.zeros(2, 2)}, "key 'b' is missing"),
    ({"w": torch.zeros(2, 2), "b": torch.zeros(2, dtype=torch.float64), "x": torch.zeros(1)}, "unexpected key 'x'"),
    ({"w": torch.zeros(3, 2), "b": torch.zeros(2, dtype=torch.float64)}, "shape (3, 2) of 'w'"),
    ({"w": torch.zeros(2, 2, dtype=torch.float16), "b": torch.zeros(2, dtype=torch.float64)}, "dtype torch.float16"),
])
def test_mismatched_copies_are_rejected_naming_file_and_key(tmp_path: Path, other: dict, fragment: str) -> None:
    good = save_checkpoint(tmp_path / "good.pt", TrainingCheckpoint(
        model={"w": torch.ones(2, 2), "b": torch.ones(2, dtype=torch.float64)}, steps=2))
    bad = save_checkpoint(tmp_path / "bad.pt", TrainingCheckpoint(model=other, steps=2))
    with pytest.raises(InputError) as info:
        consolidate(tmp_path / "out.pt", [good, bad])
    assert fragment in info.value.cause
    assert info.value.place.startswith(f"{bad}:model.")
    assert not (tmp_path / "out.pt").exists()


def test_non_finite_values_are_rejected_naming_file_and_key(tmp_path: Path) -> None:
    good = _copy(tmp_path, "good.pt", 1.0, steps=12)
    bad = save_checkpoint(tmp_path / "nan.pt", TrainingCheckpoint(
        model={"w": torch.tensor([[1.0, float("nan")], [0.0, 0.0]]), "b": torch.zeros(2, dtype=torch.float64),
               "bn.num_batches_tracked": torch.tensor(0)}, steps=12, start_steps=10))
    with pytest.raises(InputError, match="NaN or infinite") as info:
        consolidate(tmp_path / "out.pt", [good, bad])
    assert info.value.place == f"{bad}:model.w"


def test_truncated_file_is_rejected_naming_the_file(tmp_path: Path) -> None:
    good = _copy(tmp_path, "good.pt", 1.0, steps=12)
    torn = tmp_path / "torn.pt"
    torn.write_bytes(good.read_bytes()[:100])
    with pytest.raises(InputError, match="cannot load checkpoint") as info:
        consolidate(tmp_path / "out.pt", [good, torn])
    assert info.value.place == str(torn)


class _Payload:
    """Not a tensor: a weights-only load must refuse to build it."""


def test_arbitrary_pickles_are_refused_by_the_weights_only_load(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(1), "extra": _Payload()}, evil)
    with pytest.raises(InputError, match="cannot load checkpoint") as info:
        load_checkpoint(evil)
    assert info.value.place == str(evil)


def test_copies_of_different_rounds_are_rejected(tmp_path: Path) -> None:
    a = _copy(tmp_path, "a.pt", 1.0, steps=13, start=10)
    b = _copy(tmp_path, "b.pt", 1.0, steps=25, start=20)
    with pytest.raises(InputError, match="different steps"):
        consolidate(tmp_path / "out.pt", [a, b])


@pytest.mark.parametrize("weights", [[1.0], [1.0, float("inf")], [-1.0, 2.0]])
def test_bad_weights_are_rejected(tmp_path: Path, weights: list[float]) -> None:
    a, b = _copy(tmp_path, "a.pt", 1.0, steps=12), _copy(tmp_path, "b.pt", 2.0, steps=12)
    with pytest.raises(InputError) as info:
        consolidate(tmp_path / "out.pt", [a, b], weights=weights)
    assert info.value.place == "--weights"


def test_output_is_replaced_atomically(tmp_path: Path) -> None:
    a, b = _copy(tmp_path, "a.pt", 1.0, steps=12), _copy(tmp_path, "b.pt", 3.0, steps=12)
    out = tmp_path / "consolidated.pt"
    out.write_bytes(b"previous round")
    consolidate(out, [a, b])
    assert torch.equal(load_checkpoint(out).model["w"], torch.full((2, 2), 2.0))
    # No temporary file left; the round before is kept beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "b.pt", "consolidated.prev.pt", "consolidated.pt"]
    assert (tmp_path / "consolidated.prev.pt").read_bytes() == b"previous round"


def _run_copy(tmp_path: Path, task: int, round_steps: int, world: int = 1) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update({"SLURM_ARRAY_TASK_ID": str(task), "SLURMHET_ARRAY_INDEX": str(task), "SLURMHET_CHECKPOINT_DIR": str(tmp_path),
                "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, str(REPO / "examples" / "train.py"), "--steps", "100", "--round-steps", str(round_steps),
            "--dataset-size", "96", "--global-batch", "16", "--seed", "3"]
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_forked_copies_consolidate_between_rounds(tmp_path: Path) -> None:
    """Two copies train on different data orders, are consolidated, and both continue from the average."""
    _run_copy(tmp_path, 0, round_steps=4)
    _run_copy(tmp_path, 1, round_steps=2)
    first = consolidate(tmp_path / "consolidated.pt", sorted(tmp_path.glob("copy-?.pt")))
    assert (first.steps, first.weights) == (6, (4 / 6, 2 / 6))
    _run_copy(tmp_path, 0, round_steps=3)
    _run_copy(tmp_path, 1, round_steps=3)
    copies = [load_checkpoint(p) for p in sorted(tmp_path.glob("copy-?.pt"))]
    assert [(c.start_steps, c.steps) for c in copies] == [(6, 9), (6, 9)]
    second = consolidate(tmp_path / "consolidated.pt", sorted(tmp_path.glob("copy-?.pt")))
    assert second.steps == 12


def test_in_a_job_bad_and_stale_copies_are_left_out_and_the_rest_renormalised(tmp_path: Path) -> None:
    good_a, good_b = _copy(tmp_path, "copy-0.pt", 1.0, steps=14), _copy(tmp_path, "copy-1.pt", 3.0, steps=16)
    stale = _copy(tmp_path, "copy-2.pt", 100.0, steps=10, start=0)  # its copy failed this round: last round's file
    cut = tmp_path / "copy-3.pt"
    cut.write_bytes(good_a.read_bytes()[:64])  # cut off by a failing disk
    warnings: list[str] = []
    result = consolidate(tmp_path / "consolidated.pt", [good_a, good_b, stale, cut], skip_bad=True,
                         warn=warnings.append)
    assert result.inputs == (good_a, good_b) and result.weights == (0.4, 0.6)  # 4 and 6 steps this round
    assert result.steps == 10 + 4 + 6
    assert torch.allclose(load_checkpoint(tmp_path / "consolidated.pt").model["w"], torch.full((2, 2), 2.2))
    assert len(warnings) == 2
    assert warnings[0].startswith(f"slurmhet consolidate: leaving out {cut}: cannot load checkpoint")
    assert warnings[1] == (f"slurmhet consolidate: leaving out {stale}: it started at step 0, an earlier round "
                           "than the others (10)")
    with pytest.raises(InputError, match="none of the 1 copies loads"):
        consolidate(tmp_path / "c2.pt", [cut], skip_bad=True, warn=warnings.append)
    with pytest.raises(InputError, match="cannot take one weight per copy"):
        consolidate(tmp_path / "c3.pt", [good_a, good_b], [1.0, 1.0], skip_bad=True)
