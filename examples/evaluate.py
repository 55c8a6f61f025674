"""An entrypoint job for the first-contact example: score each learning rate's checkpoint, return the best.

``slurmhet result ID`` prints what :func:`main` returns. Checkpoints are loaded weights-only
(``slurmhet.runtime.checkpoint.load_checkpoint``); the data is train.py's synthetic set.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from examples.train import build_model, make_data
from slurmhet.runtime.checkpoint import CHECKPOINT_NAME, load_checkpoint


def main(checkpoint_dirs: list[str], model: str = "mlp-small", seed: int = 0) -> dict[str, object]:
    """Mean squared error of each run's final weights on the full synthetic dataset; the best run first."""
    x, y = make_data(4096, seed, torch.float32)
    scores = {}
    for directory in checkpoint_dirs:
        net = build_model(model, seed, torch.float32)
        net.load_state_dict(load_checkpoint(Path(directory) / CHECKPOINT_NAME).model)
        with torch.no_grad():
            scores[directory] = round(nn.functional.mse_loss(net(x), y).item(), 6)
    best = min(scores, key=lambda d: scores[d])
    return {"best": best, "mse": scores}
