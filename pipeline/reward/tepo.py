"""TEPO entropy shaping (arXiv 2602.02050) as pure functions of per-token entropies and spans.

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

import math
from collections.abc import Sequence

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
    return math.fsum(values) / (end - start)


def delta_segment_entropies(entropies: Sequence[float | None], output_spans: Sequence[Span], min_tokens: int = 1) -> list[float]:
    """dH_k for each tool call k = 1..n (NaN when a neighbouring segment is too short)."""
    if output_spans and not entropies:
        raise ValueError("TEPO needs the sampling entropies of a trajectory with tool calls, and it has none "
                         "(the rollout backend did not record them: rollout.backend hf records them)")
    segments = policy_segments(len(entropies), output_spans)
    means = [segment_entropy(entropies, seg, min_tokens) for seg in segments]
    return [means[k] - means[k - 1] for k in range(1, len(segments))]


def entropy_reducing(delta_entropies: Sequence[float]) -> list[bool]:
    """1[dH_k < 0]; NaN (undefined) is not reducing."""
    return [d < 0 for d in delta_entropies]  # NaN < 0 is False


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
