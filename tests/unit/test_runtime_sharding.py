"""Proportional sharding: the sampler's bookkeeping, and exact gradients in real multi-process gloo runs.

The multi-process tests start ranks the way Slurm would (one launcher per task,
recorded-style SLURM_* variables) and run examples/train.py; the reference is
an independent single-process full-batch SGD loop written here.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from slurmhet.errors import InputError
from slurmhet.runtime.checkpoint import load_checkpoint
from slurmhet.runtime.consolidate import consolidate
from slurmhet.runtime.progress import job_steps, read_progress
from slurmhet.runtime.torch import ProportionalDistributedSampler, split_counts, split_micro_batches
from tests.unit.examples import example_train

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- bookkeeping


def test_split_counts_is_proportional_and_exact() -> None:
    assert split_counts(10, [0.5, 0.3, 0.2]) == [5, 3, 2]
    assert split_counts(24, [0.5, 0.3, 0.2]) == [12, 7, 5]  # 7.2 and 4.8: the larger remainder gets the extra one
    assert split_counts(2, [0.5, 0.3, 0.2]) == [1, 1, 0]
    assert split_counts(3, [1, 1, 1]) == [1, 1, 1]
    assert split_counts(4, [1, 1, 1]) == [2, 1, 1]  # ties go to the lower rank
    for total in range(0, 50):
        assert sum(split_counts(total, [0.45, 0.35, 0.2])) == total


@pytest.mark.parametrize("weights", [[], [0.0, 0.0], [0.5, float("nan")], [-1.0, 2.0]])
def test_split_counts_rejects_bad_weights(weights: list[float]) -> None:
    with pytest.raises(InputError):
        split_counts(8, weights)


def _epoch(sampler_cls: type, world: list[float], epoch: int, **kw: object) -> list[list[list[int]]]:
    """steps x ranks x indices for one epoch."""
    samplers = [sampler_cls(98, 24, world, r, **kw) for r in range(len(world))]
    for s in samplers:
        s.set_epoch(epoch)
    return [list(step) for step in zip(*[list(iter(s)) for s in samplers])]


def test_each_epoch_covers_the_dataset_exactly_once_in_proportional_shares() -> None:
    weights = [0.5, 0.3, 0.2]
    steps = _epoch(ProportionalDistributedSampler, weights, epoch=0, seed=7)
    assert len(steps) == math.ceil(98 / 24)
    seen = Counter(i for step in steps for shard in step for i in shard)
    assert sorted(seen) == list(range(98)) and set(seen.values()) == {1}
    for step in steps[:-1]:
        assert [len(shard) for shard in step] == split_counts(24, weights)
    assert [len(shard) for shard in steps[-1]] == split_counts(98 - 4 * 24, weights)


def test_sampler_is_deterministic_and_reshuffles_every_epoch() -> None:
    first = _epoch(ProportionalDistributedSampler, [0.6, 0.4], epoch=0, seed=3)
    again = _epoch(ProportionalDistributedSampler, [0.6, 0.4], epoch=0, seed=3)
    second = _epoch(ProportionalDistributedSampler, [0.6, 0.4], epoch=1, seed=3)
    other_seed = _epoch(ProportionalDistributedSampler, [0.6, 0.4], epoch=0, seed=4)
    assert first == again
    assert first != second and first != other_seed
    unshuffled = _epoch(ProportionalDistributedSampler, [0.6, 0.4], epoch=0, shuffle=False)
    assert [i for step in unshuffled for shard in step for i in shard] == list(range(98))


def test_position_is_in_global_steps_so_any_world_size_resumes_the_same_batches() -> None:
    three = ProportionalDistributedSampler(98, 24, [0.5, 0.3, 0.2], 0, seed=1)
    one = ProportionalDistributedSampler(98, 24, [1.0], 0, seed=1)
    one.set_position(7)  # epoch 1, step 2
    assert (one.epoch, one.start_step, len(one)) == (1, 2, 3)
    global_batch = next(iter(one))
    shards = [three.step_indices(1, 2, rank=r) for r in range(3)]
    assert [i for s in shards for i in s] == global_batch
    assert one.samples_before(7) == 98 + 48
    assert one.global_batch_size(4) == 2


def test_micro_batches_split_a_share_without_losing_samples() -> None:
    assert split_micro_batches(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_micro_batches([1], 3) == [[1]]
    assert split_micro_batches([], 2) == [[]]  # an empty share still runs one (empty) backward


# --------------------------------------------------------------------------- multi-process exactness

D, B, LR, MOMENTUM, SEED = 98, 24, 0.1, 0.9, 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(tmp_path: Path, weights: list[float], steps: int, *, nominal: int | None = None,
               job: str = "9300") -> dict:
    """One launcher per rank, as srun would start them; returns rank 0's JSON summary."""
    port = _free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RANK", "WORLD_SIZE", "MASTER_"))}
    base.update({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_NTASKS": str(len(weights)),
                 "SLURM_STEP_NUM_TASKS": str(len(weights)), "SLURM_STEP_NODELIST": "127.0.0.1",
                 "MASTER_PORT": str(port), "SLURMHET_JOB_ID": "41",
                 "SLURMHET_SHARD_WEIGHTS": ",".join(map(str, weights)),
                 "SLURMHET_PROGRESS_DIR": str(tmp_path / "progress"), "SLURMHET_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
                 "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
    if nominal:
        base["SLURMHET_NOMINAL_WORKERS"] = str(nominal)
    argv = [sys.executable, str(REPO / "examples" / "train.py"), "--steps", str(steps), "--dataset-size", str(D),
            "--global-batch", str(B), "--lr", str(LR), "--momentum", str(MOMENTUM), "--seed", str(SEED),
            "--dtype", "float64"]
    runner = f"import sys; from slurmhet.runtime.launcher import launch; sys.exit(launch({argv!r}))"
    procs = [subprocess.Popen([sys.executable, "-c", runner], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env={**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
             for r in range(len(weights))]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def _reference(steps: int) -> dict[str, torch.Tensor]:
    """Single-process full-batch SGD over the same global batches, written independently of the sampler."""
    train = example_train()
    model = train.build_model("mlp-small", SEED, torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = train.make_data(D, SEED, torch.float64)
    per_epoch = math.ceil(D / B)
    for step in range(steps):
        epoch, k = divmod(step, per_epoch)
        perm = torch.randperm(D, generator=torch.Generator().manual_seed(SEED + epoch))
        batch = perm[k * B : (k + 1) * B]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
        optimizer.step()
    return model.state_dict()


def _assert_same_parameters(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], rtol=0, atol=1e-6), key
    assert any(not torch.equal(v, example_train().build_model("mlp-small", SEED, torch.float64).state_dict()[k])
               for k, v in got.items()), "training did not move the parameters"


def test_unequal_shares_over_gloo_equal_full_batch_sgd(tmp_path: Path) -> None:
    # 7 steps cross an epoch boundary; the short last batch (2 samples) leaves rank 2 with none.
    summary = _run_ranks(tmp_path, [0.5, 0.3, 0.2], steps=7)
    assert summary["steps"] == 7 and summary["world_size"] == 3
    _assert_same_parameters(load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt").model, _reference(7))
    records = read_progress(tmp_path / "progress")
    assert [(r.rank, r.steps_done, r.state) for r in records] == [(0, 7, "done"), (1, 7, "done"), (2, 7, "done")]


def test_relaxed_scale_fixed_accumulation_equals_full_batch_sgd(tmp_path: Path) -> None:
    # Two ranks standing in for four nominal workers: 3 and 2 micro-batches per step.
    _run_ranks(tmp_path, [0.6, 0.4], steps=6, nominal=4)
    _assert_same_parameters(load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt").model, _reference(6))


@pytest.mark.parametrize("via_consolidation", [False, True])
def test_checkpoint_from_three_ranks_resumes_on_two(tmp_path: Path, via_consolidation: bool) -> None:
    _run_ranks(tmp_path, [0.5, 0.3, 0.2], steps=3, job="9301")
    if via_consolidation:  # the round's only copy, consolidated: the next round resumes from consolidated.pt
        consolidate(tmp_path / "ckpt" / "consolidated.pt", [tmp_path / "ckpt" / "checkpoint.pt"])
        (tmp_path / "ckpt" / "checkpoint.pt").unlink()
    summary = _run_ranks(tmp_path, [0.7, 0.3], steps=7, job="9302")
    assert (summary["start_steps"], summary["steps"]) == (3, 7)
    checkpoint = load_checkpoint(tmp_path / "ckpt" / "checkpoint.pt")
    assert checkpoint.steps == 7
    _assert_same_parameters(checkpoint.model, _reference(7))
    assert job_steps(read_progress(tmp_path / "progress")) == {"41": 7}
