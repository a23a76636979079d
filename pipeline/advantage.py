"""Group-relative advantages and DAPO's dynamic sampling (pure functions).

Departures from GRPO: none by default; `std_normalize=False` gives Dr.GRPO's (r - mean),
which does not up-weight groups whose rewards barely differ.
"""

from __future__ import annotations

import numpy as np

from pipeline.config.train import DAPOLoss, GRPOLoss
from pipeline.types import ScoredGroup

STD_EPS = 1e-6


def group_advantages(rewards_G: np.ndarray, *, std_normalize: bool) -> np.ndarray:
    """A_i = (r_i - mean(r)) [/ (std(r) + eps)] over one group; shape [G]."""
    centred = rewards_G - rewards_G.mean()
    if not std_normalize:
        return centred
    return centred / (rewards_G.std() + STD_EPS)


def is_informative(group: ScoredGroup) -> bool:
    """A group whose rewards all agree gives zero advantage everywhere (DAPO drops it)."""
    totals = group.totals
    return max(totals) - min(totals) > 1e-9


def advantages_of(groups: list[ScoredGroup], algo: DAPOLoss | GRPOLoss) -> list[np.ndarray]:
    """Per-group advantages [G] for each kept group (DAPO always normalises by the std)."""
    std_normalize = algo.std_normalize if isinstance(algo, GRPOLoss) else True
    return [group_advantages(np.array(g.totals, dtype=np.float64), std_normalize=std_normalize) for g in groups]
