"""Throughput-proportional sharding with exact gradients, and relaxed scale-fixed accumulation.

Seed 001 eqs. (10)-(12): giving worker k a share |pi_k| = |Pi| rho_k / sum rho of
the work makes all workers finish a step together. Here the "work" is every
global batch: rank r gets ``weights[r]`` of it (``SLURMHET_SHARD_WEIGHTS``).

Exactness. With unequal local batches, DDP's default mean of per-rank means is
*not* the full-batch mean gradient. The recipe that is exact:

1. compute the loss with ``reduction="sum"`` over the rank's samples and divide
   it by the step's *global* batch size (``global_mean_loss``);
2. all-reduce gradients with a plain SUM (``register_exact_gradients`` swaps
   DDP's averaging hook for ``sum_allreduce_hook``).

Then sum_r sum_{i in r} grad l_i / B = (1/B) sum_i grad l_i, whatever the shares.
A rank with no sample in a step (possible only in a short final batch) still
runs its backward, on an empty batch, so every rank joins every all-reduce.

Relaxed scale-fixed sync (Hare 2.2.3): a rank that stands in for several
nominal workers splits its share into ``accumulation_steps`` micro-batches and
accumulates (DDP ``no_sync`` for all but the last). Because the loss is already
normalised by the global batch, accumulation needs no extra scaling and the
step's gradient is unchanged.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations
# against the real ``GradBucket``/``Future`` types, not strings.
import math
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from slurmhet.errors import InputError


def split_counts(total: int, weights: Sequence[float]) -> list[int]:
    """Integer shares of ``total`` proportional to ``weights`` (largest remainder, ties to the lower rank)."""
    if not weights or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise InputError(f"shard weights {list(weights)} must be non-negative with a positive sum",
                         place="SLURMHET_SHARD_WEIGHTS", hint="e.g. 0.5,0.3,0.2")
    scale = sum(weights)
    exact = [total * w / scale for w in weights]
    counts = [math.floor(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def split_micro_batches(indices: Sequence[int], accumulation_steps: int) -> list[list[int]]:
    """Split a rank's share into at most ``accumulation_steps`` near-equal chunks; never zero chunks."""
    steps = max(1, accumulation_steps)
    base, extra = divmod(len(indices), steps)
    chunks, start = [], 0
    for i in range(steps):
        size = base + (1 if i < extra else 0)
        if size:
            chunks.append(list(indices[start : start + size]))
        start += size
    return chunks or [[]]


class ProportionalDistributedSampler(Sampler[list[int]]):
    """Batch sampler: each step, this rank's ``weights[rank]`` share of one fixed-size global batch.

    Every epoch is one permutation of the dataset (seeded by ``seed + epoch``,
    identical on all ranks), cut into global batches of ``global_batch``; the
    last one is shorter when the dataset size is not a multiple, so each sample
    is seen exactly once per epoch. Each global batch is split by ``split_counts``.
    Use as ``DataLoader(ds, batch_sampler=sampler)``. The positions are defined in
    global steps, so a checkpoint resumes on any number of ranks.
    """

    def __init__(self, dataset_size: int, global_batch: int, weights: Sequence[float], rank: int, *,
                 seed: int = 0, shuffle: bool = True, accumulation_steps: int = 1) -> None:
        if dataset_size <= 0 or global_batch <= 0:
            raise InputError(f"dataset size {dataset_size} and global batch {global_batch} must be positive",
                             place="sampler", hint="check the job's work and global_batch")
        if not 0 <= rank < len(weights):
            raise InputError(f"rank {rank} has no shard weight ({len(weights)} given)",
                             place="SLURMHET_SHARD_WEIGHTS", hint="one weight per rank")
        split_counts(global_batch, weights)  # validates the weights once, up front
        self.dataset_size = dataset_size
        self.global_batch = global_batch
        self.weights = tuple(float(w) for w in weights)
        self.rank = rank
        self.seed = seed
        self.shuffle = shuffle
        self.accumulation_steps = max(1, accumulation_steps)
        self.epoch = 0
        self.start_step = 0

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.dataset_size // self.global_batch)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Select the epoch (and, when resuming, the first step of it) the next iteration yields."""
        self.epoch, self.start_step = epoch, start_step

    def set_position(self, steps_done: int) -> None:
        """Resume after ``steps_done`` global steps of this job."""
        self.set_epoch(*divmod(steps_done, self.steps_per_epoch))

    def samples_before(self, steps_done: int) -> int:
        """Samples consumed by the first ``steps_done`` global steps (progress from a step count)."""
        epochs, step = divmod(steps_done, self.steps_per_epoch)
        return epochs * self.dataset_size + min(step * self.global_batch, self.dataset_size)

    def global_batch_size(self, step: int) -> int:
        """Samples in global step ``step`` of an epoch (the last one may be short)."""
        return min(self.global_batch, self.dataset_size - step * self.global_batch)

    def _permutation(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.dataset_size)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.dataset_size, generator=generator)

    def step_indices(self, epoch: int, step: int, rank: int | None = None) -> list[int]:
        """Dataset indices ``rank`` (default: this rank) processes in ``step`` of ``epoch``."""
        return self._slices(self._permutation(epoch), step)[self.rank if rank is None else rank]

    def _slices(self, perm: torch.Tensor, step: int) -> list[list[int]]:
        start = step * self.global_batch
        batch = perm[start : start + self.global_batch_size(step)].tolist()
        out, offset = [], 0
        for count in split_counts(len(batch), self.weights):
            out.append(batch[offset : offset + count])
            offset += count
        return out

    def micro_batches(self, indices: Sequence[int]) -> list[list[int]]:
        return split_micro_batches(indices, self.accumulation_steps)

    def __iter__(self) -> Iterator[list[int]]:
        perm = self._permutation(self.epoch)
        for step in range(self.start_step, self.steps_per_epoch):
            yield self._slices(perm, step)[self.rank]

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step


def global_mean_loss(loss_sum: torch.Tensor, global_batch_size: int) -> torch.Tensor:
    """Turn a rank's summed per-sample loss into its part of the full-batch mean."""
    return loss_sum / global_batch_size


def sum_allreduce_hook(process_group: dist.ProcessGroup | None,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: all-reduce SUM without DDP's division by the world size."""
    group = process_group if process_group is not None else dist.group.WORLD
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    assert work is not None
    return work.get_future().then(lambda fut: fut.value()[0])


def register_exact_gradients(model: torch.nn.parallel.DistributedDataParallel) -> None:
    """Make ``model``'s gradient the full-batch mean when losses come from ``global_mean_loss``."""
    model.register_comm_hook(None, sum_allreduce_hook)


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on one: ranks agree to stop at the same step after a signal."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
