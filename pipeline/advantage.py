"""Group-relative advantages and DAPO's dynamic sampling (pure functions).

Departures from GRPO: none by default; `std_normalize=False` gives Dr.GRPO's (r - mean),
which does not up-weight groups whose rewards barely differ. TEPO dense replaces the
broadcast outcome advantage on tool-call segments by tool-level advantages.
"""

from __future__ import annotations

import numpy as np

from pipeline.config.reward import TepoConfig, TepoDense
from pipeline.config.train import DAPOLoss, GRPOLoss
from pipeline.reward.tepo import delta_segment_entropies, dense_token_advantages, tepo_dense_group_advantages
from pipeline.types import ScoredGroup

STD_EPS = 1e-6
AGREE_TOL = 1e-9  # rewards closer than this count as equal: their group carries no signal


def rewards_agree(rewards_G: np.ndarray) -> bool:
    """Whether a group's rewards are all the same (up to float rounding): its advantages are all zero."""
    return float(np.ptp(rewards_G)) <= AGREE_TOL


def group_advantages(rewards_G: np.ndarray, *, std_normalize: bool) -> np.ndarray:
    """A_i = (r_i - mean(r)) [/ (std(r) + eps)] over one group; shape [G]. Exactly 0 when the rewards
    all agree (the float mean of G equal values need not equal them: its rounding must not become a
    gradient, e.g. on the dropped groups' openings of `pipeline.anchor`)."""
    if rewards_agree(rewards_G):
        return np.zeros_like(rewards_G)
    centred = rewards_G - rewards_G.mean()
    if not std_normalize:
        return centred
    return centred / (rewards_G.std() + STD_EPS)


def is_informative(group: ScoredGroup) -> bool:
    """A group whose rewards all agree gives zero advantage everywhere (DAPO drops it)."""
    return not rewards_agree(np.array(group.totals, dtype=np.float64))


def advantages_of(groups: list[ScoredGroup], algo: DAPOLoss | GRPOLoss) -> list[np.ndarray]:
    """Per-group advantages [G] for each kept group (DAPO always normalises by the std)."""
    std_normalize = algo.std_normalize if isinstance(algo, GRPOLoss) else True
    return [group_advantages(np.array(g.totals, dtype=np.float64), std_normalize=std_normalize) for g in groups]


def token_advantages(groups: list[ScoredGroup], algo: DAPOLoss | GRPOLoss, tepo: TepoConfig) -> list[np.ndarray]:
    """One [R] array per trajectory (groups flattened in order): the advantage of each response token.

    Outcome variants broadcast the trajectory's group-relative advantage. TEPO dense instead
    gives each tool call's segment its tool-level advantage (pooled over the group's calls)
    and keeps the outcome advantage on the final segment. Tool-output tokens are masked later.
    """
    outcome = advantages_of(groups, algo)
    if not isinstance(tepo, TepoDense):
        return [np.full(len(t.response_ids), float(a)) for g, adv_G in zip(groups, outcome, strict=True)
                for t, a in zip(g.group.trajectories, adv_G, strict=True)]
    out: list[np.ndarray] = []
    for g, adv_G in zip(groups, outcome, strict=True):
        trajs = g.group.trajectories
        deltas = [delta_segment_entropies(t.entropies, t.output_spans, tepo.min_segment_tokens) for t in trajs]
        call_adv = tepo_dense_group_advantages([r.accuracy for r in g.rewards], deltas, tepo.alpha, tepo.advantage_eps)
        out += [np.array(dense_token_advantages(len(t.response_ids), t.output_spans, calls, float(a)))
                for t, calls, a in zip(trajs, call_adv, adv_G, strict=True)]
    return out
