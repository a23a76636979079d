"""The masking ablation (`train.mask_tool_output: false`): the tokens a tool wrote join the loss, with their
advantage and in the normaliser; with masking (the default) they carry neither."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config.train import DAPOLoss
from pipeline.config.reward import TepoOff
from pipeline.rl.advantage import group_filter, token_advantages
from pipeline.trainer.batching import make_train_batch
from tests.helpers.tepo import variant
from tests.train.test_anchor import scored


@pytest.mark.parametrize("mask", [True, False])
def test_tool_output_is_trained_on_only_when_unmasked(mask: bool) -> None:
    groups = [scored([1.0, 0.0, 0.0], 0)]
    algo = DAPOLoss()
    advantages = token_advantages(groups, algo, variant(TepoOff()), group_filter(algo, variant(TepoOff())))
    batch = make_train_batch(groups, advantages, pad_id=0, mask_tool_output=mask)
    prompt = len(groups[0].group.trajectories[0].prompt_ids)
    for row, trajectory in enumerate(groups[0].group.trajectories):
        tool = np.array(trajectory.loss_mask) == 0  # the 4 output tokens
        span = slice(prompt, prompt + len(trajectory.response_ids))
        in_loss = batch.loss_mask_BT[row, span].numpy()
        advantage = batch.advantages_BT[row, span].numpy()
        assert (in_loss[tool] == (0.0 if mask else 1.0)).all() and (in_loss[~tool] == 1.0).all()
        assert (advantage[tool] == 0.0).all() if mask else (advantage[tool] == advantage[~tool][0]).all()
    sampled = sum(sum(t.loss_mask) for t in groups[0].group.trajectories)
    everything = sum(len(t.response_ids) for t in groups[0].group.trajectories)
    assert batch.n_policy_tokens == (sampled if mask else everything)
