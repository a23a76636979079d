"""The learning rate over a run: linear warm-up, then constant (DAPO), linear or cosine decay.

DAPO and TAPO train at a constant rate after warm-up. On a 135M model with a few problems a step,
the rollout accuracy of our CPU runs peaked mid-run and fell back by the end at a constant rate
(benchmarks/RESULTS.md, learning_cpu runs 8, 9 and 11), so the rate can decay towards a floor
(`train.optimizer.lr_decay`, `train.optimizer.min_lr_ratio`). The schedule counts optimiser updates of whole rollout
batches: a step that dynamic sampling skips (no informative group) does not advance it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipeline.config.train import LrDecay

_DECAYS: dict[str, Callable[[float], float]] = {  # progress in [0, 1] after warm-up -> share of the way to the floor kept
    "constant": lambda progress: 1.0,
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def lr_multiplier(decay: LrDecay, warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """The factor of the peak rate at update `s` (0-based; torch's LambdaLR convention), chosen once.

    Warm-up: (s + 1) / (warmup_steps + 1). Then min_ratio + (1 - min_ratio) * decay(progress), with
    progress = (s - warmup_steps) / (total_steps - warmup_steps), so the last of total_steps updates
    still trains (as in transformers' schedules) and updates past the end stay at the floor."""
    if decay not in _DECAYS:
        raise ValueError(f"train.optimizer.lr_decay: {decay!r} is not one of {sorted(_DECAYS)}")
    shape = _DECAYS[decay]
    span = max(1, total_steps - warmup_steps)

    def multiplier(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / (warmup_steps + 1)
        progress = min(1.0, (s - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * shape(progress)

    return multiplier
