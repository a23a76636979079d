"""The reference policy for a KL penalty: a frozen copy of the model RL started from.

GRPO (DeepSeekMath) keeps pi_ref = the initial policy and penalises KL(pi || pi_ref) per token;
DAPO drops it. `make_reference` resolves the choice once at set-up: `FrozenReference` when the
loss has a KL term, `NoReference` (nothing loaded, batches unchanged) otherwise. The copy is
loaded from `train.init_model`, not from a checkpoint, so a resumed run anchors to the same
model as an uninterrupted one. It is loaded in the policy's own dtype and runs the update's own
forward (`logprobs_as_updated`: the same micro-batches, packed or padded layout and precision), so
KL(pi || pi_ref) is exactly 0 before the first step, in one process and under data parallelism
(where rows run padded): a reference run in another layout or precision reported the difference as
KL and its term pushed a gradient (norm 0.107 at step 0, bf16 autocast on 2 ranks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import torch

from pipeline.config.train import AlgorithmConfig
from pipeline.rl.loss import needs_reference
from pipeline.model import load_policy
from pipeline.types import TrainBatch
from pipeline.trainer.update import UpdateSettings, logprobs_as_updated


class Reference(Protocol):
    def attach(self, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch: ...


class NoReference:
    """No KL term: batches go to the loss as they are."""

    def attach(self, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch:
        return batch


@dataclass
class FrozenReference:
    """A frozen model whose log-probs of the sampled tokens ride along in the batch."""

    model: torch.nn.Module

    def __post_init__(self) -> None:
        self.model.eval()
        self.model.requires_grad_(False)

    def attach(self, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch:
        """The batch with `ref_logprobs_BT` (0 off the loss mask), by the update's forward (`settings`: its
        micro-batches, layout, precision and the rollout temperature)."""
        ref_BT = logprobs_as_updated(self.model, batch, settings)
        return dataclasses.replace(batch, ref_logprobs_BT=ref_BT.to(batch.old_logprobs_BT.dtype))


def make_reference(algorithm: AlgorithmConfig, init_model: str, device: torch.device, held_dtype: str) -> Reference:
    """The reference `algorithm`'s loss needs, chosen once: a frozen `init_model` (`train.init_model`), or none.
    `held_dtype`: the dtype the policy was loaded in (`PolicyWeights.held_dtype`), so that both start from the same
    weights."""
    if not needs_reference(algorithm):
        return NoReference()
    model, _ = load_policy(init_model, held_dtype, str(device))
    return FrozenReference(model)
