"""TEPO variants from bare TEPO configs, as `set_up` resolves them (the rest of the reward config default)."""

from __future__ import annotations

from pipeline.config.reward import RewardConfig, TepoConfig
from pipeline.rl.tepo import Tepo, tepo_variant


def variant(tepo: TepoConfig) -> Tepo:
    return tepo_variant(RewardConfig(tepo=tepo))
