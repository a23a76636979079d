"""What the training loop holds: the `Trainer` bundle and its `Placement`.

The placement (single process, or one rank of a DeepSpeed data-parallel job) is chosen
once at set-up; the loop calls its functions and never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.rl.advantage import GroupFilter
from pipeline.trainer.checkpoint import TrainerState
from pipeline.config import RunConfig
from pipeline.trainer.weights import PolicyWeights
from pipeline.tools.outages import OutageGuard
from pipeline.sampling.problem_stream import ProblemStream
from pipeline.trainer.reference import Reference
from pipeline.rollout.engine import RolloutEngine
from pipeline.rl.tepo import Tepo
from pipeline.types import Collected, ScoredGroup


@dataclass(frozen=True)
class Placement:
    # (kept groups, dropped groups' openings) -> advantages, loss, optimiser steps
    train_step: Callable[[Trainer, list[ScoredGroup], Sequence[ScoredGroup]], dict[str, float]]
    save_checkpoint: Callable[[Trainer], Any]  # collective under data parallelism
    save_final_model: Callable[[Trainer, Path], None]
    is_main: Callable[[], bool]  # only the main process logs and writes metrics


@dataclass
class Trainer:
    """Everything the loop touches, built once by `pipeline.train.set_up`."""

    cfg: RunConfig
    model: torch.nn.Module  # the policy (a DeepSpeed engine under data parallelism)
    tokenizer: Any
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stream: ProblemStream
    state: TrainerState
    placement: Placement
    # The variants, chosen once from the config by `pipeline.train.set_up` (no defaults: both placements pass them).
    weights: PolicyWeights  # all weights, or a LoRA adapter
    tepo: Tepo  # TEPO off, sparse or dense (pipeline.rl.tepo)
    reference: Reference  # frozen initial model for a KL term, or nothing
    collect_groups: Callable[[Trainer], Collected]  # dynamic sampling in rounds, or by refill
    informative: GroupFilter  # dynamic sampling's filter (pipeline.rl.advantage.group_filter), or keep all
    outages: OutageGuard | None = None  # the run's tool-outage counts; built from cfg.train by the first step
