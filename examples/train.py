"""Example slurmhet workload: a small MLP regression on synthetic data, using the whole runtime.

Run it under ``slurmhet run -- python examples/train.py ...`` (the launcher sets
RANK, WORLD_SIZE, MASTER_*, and the plan's SLURMHET_* variables). It shows:

* throughput-proportional shards of a fixed global batch with exact gradients
  (``slurmhet.runtime.torch``), so any shard weights give the full-batch run;
* relaxed scale-fixed sync: ``SLURMHET_ACCUMULATION_STEPS`` micro-batches per step;
* progress files for the replanner, emulated GPU speed on the CPU dev cluster
  (``SLURMHET_EMULATE_THROUGHPUT=1``; reported as emulated);
* checkpoint on SIGUSR2/SIGTERM, then requeue or a clean end;
* forked copies (array tasks, local SGD): each copy resumes from the
  consolidated checkpoint, trains ``--round-steps`` steps on its own data order,
  and writes ``copy-<task>.pt`` for ``slurmhet consolidate``.

The last line printed by rank 0 is a JSON summary with the final full-dataset loss.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Mapping

import torch
import torch.distributed as dist
from torch import nn

from slurmhet.errors import InputError
from slurmhet.runtime import emulation
from slurmhet.runtime.checkpoint import (StopRequest, TrainingCheckpoint, choose_resume, handle_stop,
                                         own_checkpoint_name, save_checkpoint)
from slurmhet.runtime.output import say
from slurmhet.runtime.progress import ProgressRecord, ProgressReporter
from slurmhet.runtime.torch import (ProportionalDistributedSampler, any_rank, global_mean_loss,
                                    register_exact_gradients)

IN_FEATURES = 16
HIDDEN = {"mlp-small": (32,), "mlp-large": (128, 128)}
#: Forked copies shuffle with seed + COPY_SEED_STRIDE * task, so their data orders differ.
COPY_SEED_STRIDE = 1_000_003


def build_model(name: str, seed: int, dtype: torch.dtype) -> nn.Module:
    """Same seed, same initial weights on every rank and every copy."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = IN_FEATURES
    for hidden in HIDDEN[name]:
        layers += [nn.Linear(width, hidden), nn.Tanh()]
        width = hidden
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers).to(dtype)


def make_data(size: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A noisy random teacher: every rank regenerates the identical dataset from the seed."""
    generator = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(size, IN_FEATURES, generator=generator, dtype=torch.float64)
    teacher = torch.randn(IN_FEATURES, 1, generator=generator, dtype=torch.float64)
    y = torch.sin(x @ teacher) + 0.05 * torch.randn(size, 1, generator=generator, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def summed_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum (not mean) over samples: the exact-gradient recipe divides by the global batch instead."""
    return nn.functional.mse_loss(model(x), y, reduction="sum")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(HIDDEN), default="mlp-small")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--dataset-size", type=int, default=4096)
    parser.add_argument("--steps", type=int, required=True, help="total steps of the job")
    parser.add_argument("--round-steps", type=int, default=None,
                        help="stop after this many steps in this run (a forked copy's share of the round); "
                             "default: $SLURMHET_ROUND_STEPS, else no cap")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="default: $SLURMHET_CHECKPOINT_DIR; no checkpoints when neither is given")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also checkpoint every N steps (0: only at the end)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ if env is None else env)
    dtype = getattr(torch, args.dtype)
    rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    weights = [float(w) for w in env["SLURMHET_SHARD_WEIGHTS"].split(",")] if env.get("SLURMHET_SHARD_WEIGHTS") \
        else [1.0 / world] * world
    accumulation = int(env.get("SLURMHET_ACCUMULATION_STEPS", "1"))
    copy_task = env.get("SLURMHET_ARRAY_INDEX")  # a forked copy (a sweep variant in an array is not one)
    checkpoint_dir = args.checkpoint_dir or (Path(env["SLURMHET_CHECKPOINT_DIR"]) if env.get("SLURMHET_CHECKPOINT_DIR") else None)
    own_name = own_checkpoint_name(env)

    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    model = build_model(args.model, args.seed, dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    x, y = make_data(args.dataset_size, args.seed, dtype)

    steps = start_steps = 0
    resumed = choose_resume(checkpoint_dir, env) if checkpoint_dir else None
    if resumed is not None:
        model.load_state_dict(resumed.checkpoint.model)
        if resumed.checkpoint.optimizer is not None:
            optimizer.load_state_dict(resumed.checkpoint.optimizer)
        steps, start_steps = resumed.checkpoint.steps, resumed.start_steps
        if rank == 0:
            print(f"resuming from {resumed.path} at step {steps}", file=sys.stderr, flush=True)
    round_steps = args.round_steps if args.round_steps is not None else int(env.get("SLURMHET_ROUND_STEPS", "0"))
    target = min(args.steps, start_steps + round_steps) if round_steps else args.steps

    seed = args.seed + (COPY_SEED_STRIDE * int(copy_task) if copy_task else 0)
    sampler = ProportionalDistributedSampler(args.dataset_size, args.global_batch, weights, rank, seed=seed,
                                             accumulation_steps=accumulation)
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else None
    if ddp is not None:
        register_exact_gradients(ddp)
    net = ddp or model

    emulated = emulation.enabled(env)
    gpu_type = emulation.node_gpu_type(env)
    pacer = None
    if emulated:
        rate = emulation.emulated_samples_per_s(env, args.model, gpu_type)
        pacer = emulation.StepPacer(rate)
        print(f"[rank {rank}] EMULATED GPU speed: {gpu_type} at {rate:.0f} samples/s "
              "(dev cluster emulation, not a measurement)", file=sys.stderr, flush=True)
    reporter = None
    if env.get("SLURMHET_PROGRESS_FILE"):
        reporter = ProgressReporter(Path(env["SLURMHET_PROGRESS_FILE"]), ProgressRecord(
            job_id=env.get("SLURMHET_JOB_ID", "local"), slurm_job_id=env.get("SLURM_JOB_ID", "local"), rank=rank,
            gpu_type=gpu_type, node=env.get("SLURMD_NODENAME", ""), steps_done=steps,
            samples_done=sampler.samples_before(steps), samples_per_second=0.0, epoch=steps // sampler.steps_per_epoch,
            updated_at=0.0, emulated=emulated, start_steps=start_steps,
            saved_steps=start_steps if rank == 0 else None))  # rank 0 saves; a fault resumes from its last save

    def save() -> None:
        """Rank 0's checkpoint, and its step in the progress record: where the replanner counts from after a fault."""
        save_checkpoint(checkpoint_dir / own_name, TrainingCheckpoint(
            model=model.state_dict(), optimizer=optimizer.state_dict(), steps=steps, start_steps=start_steps,
            meta={"model": args.model, "seed": args.seed}))
        if reporter is not None:
            reporter.saved(steps)

    stop = StopRequest()
    stop.install()
    stopping = False
    rank_samples = 0
    while steps < target and not stopping:
        sampler.set_position(steps)
        for local in sampler:
            step_batch = sampler.global_batch_size(steps % sampler.steps_per_epoch)
            micro = sampler.micro_batches(local)
            optimizer.zero_grad()
            for j, indices in enumerate(micro):
                sync = contextlib.nullcontext() if ddp is None or j == len(micro) - 1 else ddp.no_sync()
                with sync:
                    global_mean_loss(summed_loss(net, x[indices], y[indices]), step_batch).backward()
            optimizer.step()
            steps += 1
            rank_samples += len(local)
            if pacer is not None:
                pacer.step(len(local))
            if reporter is not None:
                reporter.update(steps_done=steps, samples_done=sampler.samples_before(steps),
                                epoch=steps // sampler.steps_per_epoch, rank_samples=rank_samples)
            if checkpoint_dir and rank == 0 and args.checkpoint_every and steps % args.checkpoint_every == 0:
                save()
            if any_rank(stop.requested):
                stopping = True
                break
            if steps >= target:
                break

    def save_on_stop() -> None:
        if checkpoint_dir:
            save()
        else:
            print("no checkpoint directory: stopping without a checkpoint", file=sys.stderr)

    state = "done"
    if stopping:
        outcome = handle_stop(stop, rank=rank, env=env, save=save_on_stop)
        state = outcome.reason
        if rank == 0:
            say(f"stopping after step {steps}: {outcome.reason}; {outcome.detail}")
    elif checkpoint_dir and rank == 0:
        save()
    if reporter is not None:
        reporter.update(steps_done=steps, samples_done=sampler.samples_before(steps),
                        epoch=steps // sampler.steps_per_epoch, rank_samples=rank_samples, state=state)
    if rank == 0:
        with torch.no_grad():
            final = nn.functional.mse_loss(model(x), y).item()
        # say(): pack members share the job's output file, and two print()ed summaries could fuse into one line.
        say(json.dumps({"final_loss": final, "steps": steps, "start_steps": start_steps, "state": state,
                        "world_size": world, "emulated": emulated}), sys.stdout)
    if world > 1:
        # Leave together: a rank tearing gloo down while a peer still writes its checkpoint aborts (SIGABRT).
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as exc:  # e.g. no checkpoint of this job loads: say which and stop, do not start over
        print(f"train.py: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
