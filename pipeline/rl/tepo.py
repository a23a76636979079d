"""TEPO (arXiv 2602.02050), all of it: entropy change around each tool call as a reward signal.

The variant is a type resolved once at set-up (`tepo_variant`): `NoTepo`, `TepoSparseReward` (the
outcome reward scaled by the share of entropy-reducing calls) or `TepoDenseAdvantages` (tool-level
advantages on the calls' segments). Scoring, the dynamic-sampling filter and the advantages call
its methods and never ask which one they hold. Departure from GRPO/DAPO: only under TEPO does a
trajectory's reward or advantage depend on the policy's entropies; off, this module changes nothing.
Below the variants, the pure functions of per-token entropies and spans.

The rollout supplies `entropies`: the sampling policy's full-vocabulary entropy H_t at each
response token (`Trajectory.entropies`; values at tool-output positions are ignored). An entropy
that is unknown is None, never 0.0 (a zero would make every dH_k 0 and score every tool-using
trajectory as if no call reduced entropy); a segment holding one raises instead of guessing.
The config check refuses TEPO with a backend that records none (vLLM).

Segment definition (the paper's r_k; stated here because the paper leaves the boundaries
informal): the response is cut at the engine's tool outputs. Segment 0 is every policy token
before the first tool output; segment k (k >= 1) is every policy token after the k-th
tool output and before the next one (or the end). A segment therefore holds the
reasoning AND the call the model wrote in it; tool-output tokens belong to no segment.
The segment entropy is the mean H_t over its tokens, and for call k (1-based)

    dH_k = H(segment k) - H(segment k - 1)

i.e. the entropy of what the model writes after seeing the k-th output minus that of what
it wrote before (and including) the call. A call is entropy-reducing iff dH_k < 0. When
either segment has fewer than `min_segment_tokens` tokens (say the trajectory was cut right
after an output) dH_k is NaN and the call counts as not entropy-reducing.

- sparse (Sec. 3.2): R = base * m / n; R = base when n = 0.
- dense (Sec. 3.3): r_k = base * (1 + alpha * 1[dH_k < 0]) for each call; the rewards of
  all calls of all G rollouts of a question form one group and A_k = (r_k - mean) / (std + eps).
  The advantage of call k goes to the tokens of segment k - 1 (the segment that produced
  the call); tokens of the final segment (the answer) keep the trajectory's outcome
  advantage. The paper says "different token spans receive distinct advantages" without
  fixing the spans; this is our reading. `base` is the outcome score (F1 in the paper,
  f_T here), so the bonus is gated by correctness.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from pipeline.config.reward import RewardConfig, TepoDense, TepoSparse
from pipeline.types import RewardBreakdown, ScoredGroup, Trajectory

Span = tuple[int, int]  # half-open token span into the response


def policy_segments(n_tokens: int, output_spans: Sequence[Span]) -> list[Span]:
    """The len(output_spans) + 1 segments between (sorted, disjoint) tool-output spans."""
    segments: list[Span] = []
    start = 0
    for out_start, out_end in output_spans:
        if not start <= out_start <= out_end <= n_tokens:
            raise ValueError(f"tool-output span {(out_start, out_end)} is not ordered inside [{start}, {n_tokens}]")
        segments.append((start, out_start))
        start = out_end
    segments.append((start, n_tokens))
    return segments


def segment_entropy(entropies: Sequence[float | None], span: Span, min_tokens: int = 1) -> float:
    """Mean entropy over the span; NaN when it has fewer than `min_tokens` tokens. An unknown (None)
    entropy in the span is an error: TEPO must not run on entropies that are not there."""
    start, end = span
    if end - start < max(1, min_tokens):
        return math.nan
    values = entropies[start:end]
    if len(values) != end - start or any(h is None for h in values):
        missing = next((start + i for i, h in enumerate(values) if h is None), start + len(values))
        raise ValueError(f"TEPO needs the sampling entropy of every policy token, and response token {missing} has "
                         "none (the rollout backend did not record it: rollout.backend hf records them)")
    return math.fsum(cast(Sequence[float], values)) / (end - start)  # no None, checked above


def delta_segment_entropies(entropies: Sequence[float | None], output_spans: Sequence[Span], min_tokens: int = 1) -> list[float]:
    """dH_k for each tool call k = 1..n (NaN when a neighbouring segment is too short)."""
    if not output_spans:  # no call, nothing to compare (and segment 0 may hold unknown entropies nobody reads)
        return []
    if not entropies:
        raise ValueError("TEPO needs the sampling entropies of a trajectory with tool calls, and it has none "
                         "(the rollout backend did not record them: rollout.backend hf records them)")
    segments = policy_segments(len(entropies), output_spans)
    means = [segment_entropy(entropies, seg, min_tokens) for seg in segments]
    return [means[k] - means[k - 1] for k in range(1, len(segments))]


def entropy_reducing(delta_entropies: Sequence[float]) -> list[bool]:
    """1[dH_k < 0]; NaN (undefined) is not reducing."""
    return [d < 0 for d in delta_entropies]  # NaN < 0 is False


def entropy_reducing_share(trajectories: Iterable[Trajectory], min_tokens: int = 1) -> float | None:
    """The share of tool calls that reduce the policy's entropy (dH_k < 0), pooled over the trajectories whose
    policy tokens all carry an entropy; None when no such trajectory made a call (or the backend recorded no
    entropies). TEPO reports it per variant; it is logged for every run, so DAPO's is there to compare."""
    reducing = calls = 0
    for trajectory in trajectories:
        try:
            deltas = delta_segment_entropies(trajectory.entropies, trajectory.output_spans, min_tokens)
        except ValueError:  # entropies not recorded (vLLM): this trajectory says nothing either way
            continue
        reducing += sum(entropy_reducing(deltas))
        calls += len(deltas)
    return reducing / calls if calls else None


def tepo_sparse_reward(base: float, delta_entropies: Sequence[float]) -> float:
    """TEPO sparse outcome reward: base * m / n, or base when there are no calls."""
    n = len(delta_entropies)
    if n == 0:
        return base
    m = sum(entropy_reducing(delta_entropies))
    return base * m / n


def tepo_dense_call_rewards(base: float, delta_entropies: Sequence[float], alpha: float) -> list[float]:
    """TEPO dense process rewards r_k = base * (1 + alpha * 1[dH_k < 0]), one per call."""
    return [base * (1.0 + alpha * reducing) for reducing in entropy_reducing(delta_entropies)]


def tool_level_advantages(call_rewards: Sequence[Sequence[float]], eps: float = 1e-6) -> list[list[float]]:
    """Group-normalise the call rewards of a question's G rollouts (all calls pooled)."""
    pooled = [r for rollout in call_rewards for r in rollout]
    if not pooled:
        return [[] for _ in call_rewards]
    mean = math.fsum(pooled) / len(pooled)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in pooled) / len(pooled))
    return [[(r - mean) / (std + eps) for r in rollout] for rollout in call_rewards]


def dense_token_advantages(
    n_tokens: int, output_spans: Sequence[Span], call_advantages: Sequence[float], outcome_advantage: float
) -> list[float]:
    """Per-token advantages [n_tokens]: call k's advantage on segment k-1, the outcome's on the last.

    Tool-output positions get 0 (they are masked out of the loss anyway).
    """
    if len(call_advantages) != len(output_spans):
        raise ValueError(f"{len(call_advantages)} call advantages for {len(output_spans)} tool outputs")
    advantages = [0.0] * n_tokens
    segments = policy_segments(n_tokens, output_spans)
    for (start, end), value in zip(segments, [*call_advantages, outcome_advantage], strict=True):
        advantages[start:end] = [value] * (end - start)
    return advantages


def tepo_dense_group_advantages(
    bases: Sequence[float], delta_entropies: Sequence[Sequence[float]], alpha: float, eps: float = 1e-6
) -> list[list[float]]:
    """Tool-level advantages of a group: dense call rewards per rollout, normalised over all calls.

    `bases[i]` is rollout i's outcome score f_T (0 for a wrong or ill-formed answer) and
    `delta_entropies[i]` its dH_k per call; returns A_{i,k} for each call of each rollout.
    """
    if len(bases) != len(delta_entropies):
        raise ValueError(f"{len(bases)} outcome scores for {len(delta_entropies)} rollouts")
    rewards = [tepo_dense_call_rewards(base, deltas, alpha) for base, deltas in zip(bases, delta_entropies, strict=True)]
    return tool_level_advantages(rewards, eps)


class Tepo(Protocol):
    """What scoring, the filter and the advantages ask of the configured TEPO variant."""

    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown:
        """The trained reward of one trajectory (the rule-based one, or TEPO sparse's)."""

    def filter_columns(self, group: ScoredGroup) -> list[list[float]]:
        """Per trajectory, what the accuracy filter compares across the group: correctness, and TEPO's term."""

    def call_advantages(self, group: ScoredGroup) -> list[list[float]]:
        """The tool-level advantage of each call of each trajectory; none outside TEPO dense."""

    def token_advantages(self, group: ScoredGroup, outcome_G: np.ndarray) -> list[np.ndarray]:
        """One [R] array per trajectory from the group's outcome advantages [G]."""


def _correctness(group: ScoredGroup) -> list[list[float]]:
    return [[float(r.correct)] for r in group.rewards]


def _broadcast(group: ScoredGroup, outcome_G: np.ndarray) -> list[np.ndarray]:
    return [np.full(len(t.response_ids), float(a)) for t, a in zip(group.group.trajectories, outcome_G, strict=True)]


@dataclass(frozen=True)
class NoTepo:
    """TEPO off: the rule-based reward, the outcome advantage on every token."""

    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown:
        return reward

    def filter_columns(self, group: ScoredGroup) -> list[list[float]]:
        return _correctness(group)

    def call_advantages(self, group: ScoredGroup) -> list[list[float]]:
        return []

    def token_advantages(self, group: ScoredGroup, outcome_G: np.ndarray) -> list[np.ndarray]:
        return _broadcast(group, outcome_G)


@dataclass(frozen=True)
class TepoSparseReward(NoTepo):
    """TEPO sparse (Sec. 3.2): R = base * m / n, base = f_T * (1 - wrong_answer_reward)."""

    wrong_answer_reward: float
    min_segment_tokens: int

    def shape(self, reward: RewardBreakdown, trajectory: Trajectory) -> RewardBreakdown:
        if not reward.format_ok:  # an ill-formed trajectory keeps its reward: skip the entropies
            return reward
        deltas = delta_segment_entropies(trajectory.entropies, trajectory.output_spans, self.min_segment_tokens)
        return sparse_term(reward, deltas, self.wrong_answer_reward)

    def filter_columns(self, group: ScoredGroup) -> list[list[float]]:
        # TEPO's m/n term, gated by correctness as its reward is
        return [[float(r.correct), r.entropy if r.correct else 0.0] for r in group.rewards]


@dataclass(frozen=True)
class TepoDenseAdvantages(NoTepo):
    """TEPO dense (Sec. 3.3): tool-level advantages on the segments that produced the calls."""

    alpha: float
    min_segment_tokens: int
    advantage_eps: float

    def call_advantages(self, group: ScoredGroup) -> list[list[float]]:
        """The tool-level advantage of each call of each trajectory (pooled over the group)."""
        trajs = group.group.trajectories
        deltas = [delta_segment_entropies(t.entropies, t.output_spans, self.min_segment_tokens) for t in trajs]
        return tepo_dense_group_advantages([r.accuracy for r in group.rewards], deltas, self.alpha, self.advantage_eps)

    def token_advantages(self, group: ScoredGroup, outcome_G: np.ndarray) -> list[np.ndarray]:
        return [np.array(dense_token_advantages(len(t.response_ids), t.output_spans, calls, float(a)))
                for t, calls, a in zip(group.group.trajectories, self.call_advantages(group), outcome_G, strict=True)]


def tepo_variant(cfg: RewardConfig) -> Tepo:
    """The variant for `cfg.tepo`: the one place that looks at which TEPO is configured."""
    if isinstance(cfg.tepo, TepoSparse):
        return TepoSparseReward(cfg.wrong_answer_reward, cfg.tepo.min_segment_tokens)
    if isinstance(cfg.tepo, TepoDense):
        return TepoDenseAdvantages(cfg.tepo.alpha, cfg.tepo.min_segment_tokens, cfg.tepo.advantage_eps)
    return NoTepo()


def sparse_term(breakdown: RewardBreakdown, delta_entropies: Sequence[float],
                wrong_answer_reward: float) -> RewardBreakdown:
    """Add TEPO's sparse term: entropy = f_T * m/n - f_T (0 when the format is wrong)."""
    if not breakdown.format_ok:
        return breakdown
    base = breakdown.accuracy * (1.0 - wrong_answer_reward)
    entropy = tepo_sparse_reward(base, delta_entropies) - base
    return dataclasses.replace(breakdown, entropy=entropy, total=breakdown.total - breakdown.entropy + entropy)
