"""TEPO: delta segment entropy, sparse and dense rewards, tool-level advantages (hand-computed)."""

from __future__ import annotations

import math

import pytest

from pipeline.rl.tepo import (
    delta_segment_entropies,
    dense_token_advantages,
    entropy_reducing_share,
    policy_segments,
    tepo_dense_call_rewards,
    tepo_dense_group_advantages,
    tepo_sparse_reward,
    tool_level_advantages,
)
from pipeline.types import ToolCall, ToolResult, Trajectory

# 12 tokens: policy [0, 4), tool output [4, 6), policy [6, 9), tool output [9, 10), policy [10, 12)
ENTROPIES = [1.0, 2.0, 3.0, 2.0, 9.0, 9.0, 1.0, 1.0, 1.0, 9.0, 4.0, 2.0]
SPANS = [(4, 6), (9, 10)]


def test_segments_are_the_policy_runs_between_outputs() -> None:
    assert policy_segments(12, SPANS) == [(0, 4), (6, 9), (10, 12)]
    assert policy_segments(5, []) == [(0, 5)]


def test_delta_segment_entropy_ignores_tool_output_tokens() -> None:
    # segment means: 2.0, 1.0, 3.0 -> dH_1 = 1 - 2 = -1, dH_2 = 3 - 1 = +2
    assert delta_segment_entropies(ENTROPIES, SPANS) == [pytest.approx(-1.0), pytest.approx(2.0)]


def test_empty_segment_gives_nan_and_counts_as_not_reducing() -> None:
    deltas = delta_segment_entropies([1.0, 1.0, 5.0], [(2, 3)])  # nothing after the output
    assert math.isnan(deltas[0])
    assert tepo_sparse_reward(1.0, deltas) == 0.0


def test_min_segment_tokens() -> None:
    assert math.isnan(delta_segment_entropies(ENTROPIES, SPANS, min_tokens=3)[1])  # last segment has 2 tokens


def test_spans_out_of_order_are_an_error() -> None:
    with pytest.raises(ValueError, match="not ordered"):
        policy_segments(10, [(5, 6), (2, 3)])


@pytest.mark.parametrize(
    ("base", "deltas", "expected"),
    [(1.0, [], 1.0), (0.8, [], 0.8), (1.0, [-1.0, 2.0], 0.5), (1.0, [-0.1, -0.2, -0.3], 1.0),
     (1.0, [0.5, 0.0], 0.0), (0.6, [-1.0, 1.0, -1.0], 0.4), (0.0, [-1.0], 0.0)],
)  # fmt: skip
def test_sparse_reward_base_times_m_over_n(base: float, deltas: list[float], expected: float) -> None:
    assert tepo_sparse_reward(base, deltas) == pytest.approx(expected)


def test_dense_call_rewards() -> None:
    assert tepo_dense_call_rewards(1.0, [-1.0, 2.0], alpha=0.5) == [1.5, 1.0]
    assert tepo_dense_call_rewards(0.0, [-1.0, 2.0], alpha=0.5) == [0.0, 0.0]  # gated by correctness
    assert tepo_dense_call_rewards(1.0, [], alpha=0.5) == []


def test_tool_level_advantages_pool_all_calls_of_the_group() -> None:
    # rewards 1.5, 1.0 | 0.0 | (no calls) -> mean 2.5/3, population std sqrt(((2/3)^2+(1/6)^2+(5/6)^2)/3)
    rewards = [[1.5, 1.0], [0.0], []]
    mean = 2.5 / 3
    std = math.sqrt(((1.5 - mean) ** 2 + (1.0 - mean) ** 2 + mean**2) / 3)
    advantages = tool_level_advantages(rewards, eps=0.0)
    assert advantages[0] == [pytest.approx((1.5 - mean) / std), pytest.approx((1.0 - mean) / std)]
    assert advantages[1] == [pytest.approx(-mean / std)]
    assert advantages[2] == []


def test_equal_call_rewards_give_zero_advantage() -> None:
    assert tool_level_advantages([[1.0], [1.0, 1.0]]) == [[0.0], [0.0, 0.0]]
    assert tool_level_advantages([[], []]) == [[], []]


def test_dense_token_advantages_place_each_call_on_the_segment_that_made_it() -> None:
    advantages = dense_token_advantages(12, SPANS, [0.5, -0.25], outcome_advantage=2.0)
    assert advantages == [0.5] * 4 + [0.0] * 2 + [-0.25] * 3 + [0.0] + [2.0] * 2


def test_dense_token_advantages_checks_lengths() -> None:
    with pytest.raises(ValueError, match="1 call advantages for 2 tool outputs"):
        dense_token_advantages(12, SPANS, [0.5], outcome_advantage=0.0)


def test_dense_group_advantages_gate_on_correctness_and_reward_entropy_drops() -> None:
    # rollout 0 correct with a reducing and a raising call; rollout 1 wrong with a reducing call
    advantages = tepo_dense_group_advantages([1.0, 0.0], [[-0.2, 0.3], [-0.5]], alpha=0.5, eps=0.0)
    rewards = [1.5, 1.0, 0.0]
    mean = sum(rewards) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 3)
    assert advantages == [[pytest.approx((1.5 - mean) / std), pytest.approx((1.0 - mean) / std)],
                          [pytest.approx(-mean / std)]]  # fmt: skip
    with pytest.raises(ValueError, match="2 outcome scores for 1 rollouts"):
        tepo_dense_group_advantages([1.0, 0.0], [[0.1]], alpha=0.5)


def test_unknown_entropies_at_tool_outputs_are_ignored() -> None:
    """The rollout records None (unknown) at tool-output tokens; the segments never read them."""
    with_none = [None if any(a <= i < b for a, b in SPANS) else h for i, h in enumerate(ENTROPIES)]
    assert delta_segment_entropies(with_none, SPANS) == delta_segment_entropies(ENTROPIES, SPANS)


@pytest.mark.parametrize("unknown_at", [0, 7, 11])
def test_an_unknown_policy_entropy_is_an_error_not_a_zero(unknown_at: int) -> None:
    entropies = list(ENTROPIES)
    entropies[unknown_at] = None
    with pytest.raises(ValueError, match=f"response token {unknown_at} has none"):
        delta_segment_entropies(entropies, SPANS)


def test_absent_entropies_are_an_error_not_zeros() -> None:
    with pytest.raises(ValueError, match="has none"):
        delta_segment_entropies((), [(4, 6)])
    assert delta_segment_entropies((), []) == []  # no call: no entropy is read


def _trajectory(entropies: list[float | None], spans: list[tuple[int, int]]) -> Trajectory:
    result = ToolResult("out", True)
    calls = tuple(ToolCall("code", "x", result, (start - 1, start), span)  # type: ignore[arg-type]
                  for start, span in ((s[0], s) for s in spans))
    n = len(entropies)
    return Trajectory("p", (1,), tuple(range(n)), (1,) * n, (0.0,) * n, calls, "answer", "", len(spans) + 1,
                      tuple(entropies))


def test_the_entropy_reducing_share_pools_every_call_of_the_step() -> None:
    # ENTROPIES: dH_1 = -1 (reducing), dH_2 = +2; a second trajectory with one reducing call; one without calls
    trajectories = [_trajectory(ENTROPIES, SPANS), _trajectory([3.0, 3.0, 9.0, 1.0], [(2, 3)]),
                    _trajectory([1.0, 1.0], [])]
    assert entropy_reducing_share(trajectories) == pytest.approx(2 / 3)
    assert entropy_reducing_share(trajectories[2:]) is None  # no call: no share, not 0


def test_the_share_skips_trajectories_without_entropies_and_counts_an_undefined_call_as_not_reducing() -> None:
    unrecorded = _trajectory([None] * 12, SPANS)  # a backend that records none (vLLM)
    assert entropy_reducing_share([unrecorded]) is None
    assert entropy_reducing_share([unrecorded, _trajectory(ENTROPIES, SPANS)]) == pytest.approx(0.5)
    cut_after_output = _trajectory([1.0, 1.0, 5.0], [(2, 3)])  # dH undefined (NaN)
    assert entropy_reducing_share([cut_after_output]) == 0.0
