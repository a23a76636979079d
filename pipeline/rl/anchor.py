"""A KL anchor on the openings of the groups dynamic sampling drops (our addition; off by default).

DAPO drops a group whose answers are all correct or all wrong (`pipeline.rl.advantage.group_filter`):
it gets zero advantage, so it carries no policy gradient, and with it goes the only place a KL term to
the initial model (`kl_coef`) could see that problem. On a tool mix that matters. A small model's fact groups are mostly all-zero and
dropped, so the anchor acts only on the calculator rows, which reward the shared opening that picks
a tool; in one learning_cpu run in ten the policy drifted to answering fact questions with code
(benchmarks/RESULTS.md, runs 2 and 6), and ToRL's code penalty, which held it, did so by making
whole extra rows informative (~15% more update time).

The tool is chosen in the first few dozen sampled tokens. So, with `train.sampling.anchor_dropped_tokens`
N > 0, each dropped trajectory's opening (its first N response tokens) stays in the batch at zero
advantage: the surrogate gives it no gradient and only the KL term acts, pulling the opening back
where it has drifted from the initial model. It costs the group's prompt (one pass, shared by the
rows) and N tokens a row, and its tokens count in the loss denominator like any token in the batch
(DAPO's token-level mean), which dilutes the policy gradient of the kept rows by their share.
"""

from __future__ import annotations

import dataclasses

from pipeline.types import Group, ScoredGroup, Trajectory


def opening(trajectory: Trajectory, n_tokens: int) -> Trajectory:
    """The trajectory cut to its first `n_tokens` response tokens.

    Tool calls are dropped: an opening trains nothing but the KL term, and a call's output span may
    lie past the cut. Output tokens inside the cut keep loss mask 0."""
    if n_tokens < 1:
        raise ValueError(f"an opening needs n_tokens >= 1 (got {n_tokens})")
    cut = slice(0, n_tokens)
    return dataclasses.replace(
        trajectory, response_ids=trajectory.response_ids[cut], loss_mask=trajectory.loss_mask[cut],
        logprobs=trajectory.logprobs[cut], entropies=trajectory.entropies[cut], tool_calls=(),
        turns=1, finish_reason="max_tokens" if len(trajectory.response_ids) > n_tokens else trajectory.finish_reason)


def dropped_openings(dropped: list[ScoredGroup], n_tokens: int) -> list[ScoredGroup]:
    """Each dropped group with its trajectories cut to their openings; its rewards are kept (they may
    differ, e.g. by the length penalty under the accuracy filter: `token_advantages` gives a group the
    filter drops zero advantage all the same). None when `n_tokens` is 0 (the anchor is off)."""
    if n_tokens == 0:
        return []
    return [ScoredGroup(Group(g.group.problem, tuple(opening(t, n_tokens) for t in g.group.trajectories)), g.rewards,
                        anchor_only=True) for g in dropped]


def step_openings(kept: list[ScoredGroup], dropped: list[ScoredGroup], n_tokens: int) -> list[ScoredGroup]:
    """The dropped groups' openings a step trains on beside its kept groups. None when nothing was kept:
    a KL-only step would move the policy on no reward (a step without the anchor makes no update then either)."""
    return dropped_openings(dropped, n_tokens) if kept else []
