"""The reference policy for a KL penalty: a frozen copy of the model RL started from.

GRPO (DeepSeekMath) keeps pi_ref = the initial policy and penalises KL(pi || pi_ref) per token;
DAPO drops it. `make_reference` resolves the choice once at set-up: `FrozenReference` when the
loss has a KL term, `NoReference` (nothing loaded, batches unchanged) otherwise. The copy is
loaded from `train.init_model`, not from a checkpoint, so a resumed run anchors to the same
model as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from pipeline.config import RunConfig
from pipeline.rl.loss import needs_reference
from pipeline.model import load_policy
from pipeline.types import TrainBatch
from pipeline.trainer.update import masked_logprobs_no_grad


class Reference(Protocol):
    def attach(self, batch: TrainBatch, micro_batch_size: int, temperature: float) -> TrainBatch: ...


class NoReference:
    """No KL term: batches go to the loss as they are."""

    def attach(self, batch: TrainBatch, micro_batch_size: int, temperature: float) -> TrainBatch:
        return batch


@dataclass
class FrozenReference:
    """A frozen model whose log-probs of the sampled tokens ride along in the batch."""

    model: torch.nn.Module
    autocast: torch.dtype | None = None  # the update's precision (train.autocast), so that KL(pi || pi_ref) is 0 at step 0

    def __post_init__(self) -> None:
        self.model.eval()
        self.model.requires_grad_(False)

    def attach(self, batch: TrainBatch, micro_batch_size: int, temperature: float) -> TrainBatch:
        """The batch with `ref_logprobs_BT` (0 off the loss mask), at the rollout temperature like the policy's."""
        ref_BT = masked_logprobs_no_grad(self.model, batch, micro_batch_size, temperature, self.autocast)
        return dataclasses.replace(batch, ref_logprobs_BT=ref_BT.to(batch.old_logprobs_BT.dtype))


def make_reference(cfg: RunConfig, device: torch.device, autocast: torch.dtype | None) -> Reference:
    """The reference the configured loss needs, chosen once: a frozen `train.init_model`, or none. `autocast`: the
    update's precision as resolved at set-up (`training_autocast`), so that KL(pi || pi_ref) is 0 at step 0."""
    if not needs_reference(cfg.train.algorithm):
        return NoReference()
    model, _ = load_policy(cfg.train.init_model, cfg.model.dtype, str(device))
    return FrozenReference(model, autocast)
