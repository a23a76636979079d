"""The policy's copies that one update steps together: the `Replicas` interface, and `OneProcess`.

The training step (`pipeline.train.update`) is written once, against this interface, and never asks
which replicas it has: `OneProcess` here, or `DeepSpeedReplicas` (`pipeline.distributed.replicas`),
one rank of a data-parallel job. What differs between the two is exactly what the interface names:
where gradients go (`backward`, `step`, the sums over ranks), which of a mini-batch's groups this
process trains on (`share`), how the rollout engine gets the trained weights (`sync`), and how
checkpoints and the final model are written. `backward` receives the loss already divided by the
*global* denominator (policy tokens summed over every rank); replicas that average gradients across
ranks undo the average themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedModel

from pipeline.rollout.engine import RolloutEngine
from pipeline.training_run import checkpoint
from pipeline.training_run.checkpoint import TrainerState
from pipeline.trainer.weights import PolicyWeights
from pipeline.types import ScoredGroup


class Replicas(Protocol):
    @property
    def model(self) -> torch.nn.Module: ...  # what runs forward and backward (DeepSpeed's engine under data parallelism)
    share_prefixes: bool  # run a micro-batch's rows as their prefix tree (measured on CPU only)

    @property
    def module(self) -> torch.nn.Module: ...  # the Hugging Face model inside `model`
    @property
    def is_main(self) -> bool: ...  # only the main process logs and writes metrics
    @property
    def rank(self) -> int: ...  # this process's place among the replicas (0 in one process)
    @property
    def world(self) -> int: ...  # how many replicas step together
    def zero_grad(self) -> None: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> float: ...  # clip, optimiser step; returns the global gradient norm
    def all_reduce_sum(self, values: list[float]) -> list[float]: ...
    def all_reduce_max(self, value: int) -> int: ...
    def share(self, groups: list[ScoredGroup]) -> tuple[list[ScoredGroup], float]: ...  # mine, weight (0: idle)
    def sync(self, engine: RolloutEngine) -> None: ...  # the rollout engine samples from the trained weights
    def save_checkpoint(self, root: Path, state: TrainerState, scheduler: torch.optim.lr_scheduler.LRScheduler,
                        tokenizer) -> Path: ...  # collective under data parallelism
    def load_checkpoint(self, path: Path, scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState: ...
    def save_model(self, tokenizer, path: Path) -> None: ...  # collective under data parallelism


@dataclass
class OneProcess:
    """One process: plain autograd, global-norm clipping, the optimiser's step; a checkpoint is one directory
    of safetensors; the final model is a plain Hugging Face directory (a LoRA adapter merged)."""

    model: PreTrainedModel
    optimizer: torch.optim.Optimizer
    grad_clip: float
    weights: PolicyWeights  # all weights, or a LoRA adapter
    share_prefixes: bool = True

    def __post_init__(self) -> None:
        # AdamW stepping bf16 weights rounds a small update away (at lr 1e-5, 2 % of a tiny model's weights moved)
        low = sorted({str(p.dtype) for group in self.optimizer.param_groups for p in group["params"]
                      if p.is_floating_point() and torch.finfo(p.dtype).bits < 32})
        if low:
            raise ValueError(f"the optimiser holds {low} weights: one process steps float32 master weights, with the "
                             "forward in model.dtype (pipeline.model; PolicyWeights.held_dtype)")

    @property
    def module(self) -> PreTrainedModel:
        return self.model

    @property
    def is_main(self) -> bool:
        return True

    @property
    def rank(self) -> int:
        return 0

    @property
    def world(self) -> int:
        return 1

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        return float(grad_norm)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def all_reduce_max(self, value: int) -> int:
        return value

    def share(self, groups: list[ScoredGroup]) -> tuple[list[ScoredGroup], float]:
        return list(groups), 1.0

    def sync(self, engine: RolloutEngine) -> None:
        engine.backend.update_weights(self.weights.rollout_tensors(self.model))  # a no-op for hf (shared model)

    def save_checkpoint(self, root: Path, state: TrainerState, scheduler: torch.optim.lr_scheduler.LRScheduler,
                        tokenizer) -> Path:
        return checkpoint.save_checkpoint(root, state, self.model, self.optimizer, scheduler)

    def load_checkpoint(self, path: Path, scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
        return checkpoint.load_checkpoint(path, self.model, self.optimizer, scheduler)

    def save_model(self, tokenizer, path: Path) -> None:
        """A plain Hugging Face directory (tokenizer and chat template included) for transformers and vLLM;
        a LoRA adapter is merged into the base weights first (in place: the model's last use)."""
        save_policy(self.weights, self.model, tokenizer, path)


def save_policy(weights: PolicyWeights, model: PreTrainedModel, tokenizer, path: Path) -> None:
    weights.export(model).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
