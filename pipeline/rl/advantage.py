"""Group-relative advantages and DAPO's dynamic-sampling filter (pure functions).

Departures from GRPO: none by default. Dr.GRPO (`DrGRPOLoss`) and GRPO with `std_normalize: false`
use (r - mean), which does not up-weight groups whose rewards barely differ. TEPO dense replaces the
broadcast outcome advantage on tool-call segments by tool-level advantages.

The std is the unbiased one (ddof 1), as in verl (`torch.std`) and TRL (`Tensor.std`): at G = 4 the
population std would make every advantage 1.15x (sqrt(4/3)) larger than theirs. (TEPO dense's tool-level
advantages, `pipeline.rl.tepo.tool_level_advantages`, keep their own normalisation over a group's
pooled calls.)

The filter (`group_filter`, resolved once at set-up) keeps a group on what DAPO keeps it on: its
correctness verdicts differ (0 < #correct < G; `filter_metric: accuracy`, DAPO's and verl's
`filter_groups.metric: acc`), not its totals: four wrong answers whose lengths differ inside the
overlong buffer (totals [0, 0, 0, -0.0625]) carry no signal worth a std-normalised push toward "wrong
but short". A trajectory is correct when its verifier score f_T exceeds 0.9 (`RewardBreakdown.correct`);
a fact answer scored with Levenshtein partial credit 1 - r counts as correct when r < 0.1, so a fact group
of near misses (0.6, 0.7, 0.8, 0) counts as all wrong and is dropped. `filter_metric: total` keeps a
group whose trained rewards differ (length and code penalties included). Either way the filter also
keeps what TEPO puts into the advantage, which correctness alone does not see: under TEPO dense a group
whose tool-level advantages are not all zero (an all-correct group can carry +-1 on its calls), and
under TEPO sparse (accuracy metric) one whose correct trajectories' entropy terms differ. Outside TEPO
dense a group whose totals all agree is dropped whatever its verdicts (its advantage is zero on every
token, and its tokens would only dilute the loss's denominator): under TEPO sparse with ToRL's -1 for a
wrong answer, a correct answer without an entropy-reducing call scores -1 too. So a kept group always
has a non-zero token advantage, and a dropped one gets none (`token_advantages`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.config.train import AlgorithmConfig, DAPOLoss, DrGRPOLoss, FilterMetric, GRPOLoss
from pipeline.rl.tepo import NoTepo, Tepo
from pipeline.types import ScoredGroup

STD_EPS = 1e-6
STD_DDOF = 1  # the unbiased std, as verl and TRL
AGREE_TOL = 1e-9  # values closer than this count as equal: their group carries no signal

GroupFilter = Callable[[ScoredGroup], bool]


def rewards_agree(rewards_G: np.ndarray) -> bool:
    """Whether a group's values are all the same (up to float rounding): its advantages are all zero."""
    return float(np.ptp(rewards_G)) <= AGREE_TOL


def group_advantages(rewards_G: np.ndarray, *, std_normalize: bool) -> np.ndarray:
    """A_i = (r_i - mean(r)) [/ (std(r, ddof=1) + eps)] over one group; shape [G]. Exactly 0 when the
    rewards all agree (the float mean of G equal values need not equal them: its rounding must not become
    a gradient, e.g. on the dropped groups' openings of `pipeline.rl.anchor`)."""
    if rewards_agree(rewards_G):
        return np.zeros_like(rewards_G)
    centred = rewards_G - rewards_G.mean()
    if not std_normalize:
        return centred
    return centred / (rewards_G.std(ddof=STD_DDOF) + STD_EPS)


def normalizes_by_std(algo: AlgorithmConfig) -> bool:
    """DAPO always divides by the std, Dr.GRPO never, GRPO as configured."""
    if isinstance(algo, GRPOLoss):
        return algo.std_normalize
    return not isinstance(algo, DrGRPOLoss)


def _verdicts(group: ScoredGroup, metric: FilterMetric, tepo: Tepo) -> np.ndarray:
    """What the filter compares across a group, one row per trajectory."""
    if metric == "total":
        return np.array([[r.total] for r in group.rewards], dtype=np.float64)
    return np.array(tepo.filter_columns(group), dtype=np.float64)


@dataclass(frozen=True)
class InformativeFilter:
    """Dynamic sampling's test, resolved once: is there signal in this group (see the module docstring)?"""

    metric: FilterMetric
    tepo: Tepo

    def __call__(self, group: ScoredGroup) -> bool:
        if any(abs(a) > AGREE_TOL for calls in self.tepo.call_advantages(group) for a in calls):
            return True  # tool-level advantages: signal whatever the outcomes
        if rewards_agree(np.array(group.totals, dtype=np.float64)):
            return False  # the outcome advantage is zero on every token: nothing to train on
        verdicts = _verdicts(group, self.metric, self.tepo)
        return any(not rewards_agree(column) for column in verdicts.T)


def keep_every_group(group: ScoredGroup) -> bool:
    """No dynamic sampling: every group trains (one whose rewards agree has zero advantage anyway)."""
    return True


def group_filter(algo: AlgorithmConfig, tepo: Tepo) -> GroupFilter:
    """The step's filter, chosen once: DAPO's informative test, or keep all without dynamic sampling."""
    return InformativeFilter(algo.filter_metric, tepo) if algo.dynamic_sampling else keep_every_group


def is_informative(group: ScoredGroup, metric: FilterMetric = DAPOLoss().filter_metric,
                   tepo: Tepo = NoTepo()) -> bool:
    """Whether DAPO's dynamic sampling keeps `group` (its default metric, TEPO off, unless given)."""
    return InformativeFilter(metric, tepo)(group)


def advantages_of(groups: list[ScoredGroup], algo: AlgorithmConfig) -> list[np.ndarray]:
    """Per-group outcome advantages [G] for each group, from the trained totals."""
    std_normalize = normalizes_by_std(algo)
    return [group_advantages(np.array(g.totals, dtype=np.float64), std_normalize=std_normalize) for g in groups]


def token_advantages(groups: list[ScoredGroup], algo: AlgorithmConfig, tepo: Tepo,
                     keep: GroupFilter) -> list[np.ndarray]:
    """One [R] array per trajectory (groups flattened in order): the advantage of each response token.

    Outcome variants broadcast the trajectory's group-relative advantage; TEPO dense gives each tool
    call's segment its tool-level advantage and keeps the outcome advantage on the final segment
    (`pipeline.rl.tepo`). A group `keep` drops, and an anchored opening (`pipeline.rl.anchor`), gets
    exactly zero everywhere, whatever its totals (under the accuracy metric they may differ); an opening is
    not judged again: its trajectories are cut and lost their calls, so TEPO's terms would not be its group's.
    Tool-output tokens are masked later.
    """
    out: list[np.ndarray] = []
    for g, adv_G in zip(groups, advantages_of(groups, algo), strict=True):
        if not g.anchor_only and keep(g):
            out += tepo.token_advantages(g, adv_G)
        else:
            out += [np.zeros(len(t.response_ids)) for t in g.group.trajectories]
    return out
