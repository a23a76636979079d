"""Reward shaping applied after rule-based scoring, chosen once at set-up from `reward.tepo`.

Only TEPO sparse changes a trajectory's reward (R = base * m / n). TEPO dense shapes the
advantages instead (`pipeline.rl.advantage.token_advantages`), so for the reward it is the same
as off: neither computes segment entropies here, and the training step asks no question
about which variant it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipeline.config.reward import RewardConfig, TepoSparse
from pipeline.reward.score import apply_tepo
from pipeline.reward.tepo import delta_segment_entropies
from pipeline.types import RewardBreakdown, Trajectory


class RewardShaping(Protocol):
    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown: ...


@dataclass(frozen=True)
class NoShaping:
    """The rule-based reward as it is (TEPO off, or dense: its term lives in the advantages)."""

    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown:
        return reward


@dataclass(frozen=True)
class TepoSparseShaping:
    """TEPO sparse: scale the outcome by the share of entropy-reducing tool calls."""

    reward_cfg: RewardConfig  # apply_tepo reads wrong_answer_reward from it
    min_segment_tokens: int

    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown:
        if not reward.format_ok:  # apply_tepo leaves an ill-formed trajectory alone: skip the entropies
            return reward
        deltas = delta_segment_entropies(trajectory.entropies, trajectory.output_spans, self.min_segment_tokens)
        return apply_tepo(reward, deltas, self.reward_cfg)


def reward_shaping(cfg: RewardConfig) -> RewardShaping:
    """The shaping for `cfg.tepo` (the one place that looks at which variant is configured)."""
    if isinstance(cfg.tepo, TepoSparse):
        return TepoSparseShaping(cfg, cfg.tepo.min_segment_tokens)
    return NoShaping()
