"""Rollout statistics of several dynamic-sampling rounds merge into one step's figures."""

from __future__ import annotations

from pipeline.rollout.metrics import RolloutStats


def test_merge_weights_rates_and_adds_counts() -> None:
    a = RolloutStats(8, 10.0, 8.0, 2.0, 400, {"code": 1.0}, {"code": 1}, {"code": 0.1}, {"code": 0.2}, {2: 8}, {"answer": 8},
                     tool_seconds={"code": 1.5}, decode_steps=50, decode_rows=300)
    b = RolloutStats(4, 5.0, 5.0, 0.0, 100, {"code": 4.0}, {"code": 3}, {"code": 0.4}, {"code": 0.5}, {2: 2, 5: 2},
                     {"answer": 3, "eos": 1}, tool_seconds={"code": 2.0, "search": 0.25}, decode_steps=30, decode_rows=20)
    m = RolloutStats.merge([a, b])
    assert m.trajectories == 12 and m.wall_s == 15.0 and m.policy_tokens == 500
    assert m.calls_per_trajectory == {"code": (8 * 1.0 + 4 * 4.0) / 12}
    assert m.tool_errors == {"code": 4}
    assert m.turns_histogram == {2: 10, 5: 2} and m.finish_reasons == {"answer": 11, "eos": 1}
    assert m.idle_fraction == 2.0 / 15.0
    assert m.tool_seconds == {"code": 3.5, "search": 0.25}  # summed, not averaged: time spent in each tool
    assert m.as_metrics()["rollout/calls_per_traj/code"] == 2.0
    assert m.as_metrics()["rollout/tool_seconds/search"] == 0.25
    assert m.as_metrics()["rollout/decode_steps"] == 80
    assert m.as_metrics()["rollout/rows_per_decode_step"] == 320 / 80  # rows over steps, not a mean of means


def test_a_backend_that_counts_no_decoding_steps_reports_no_rows_per_step() -> None:
    stats = RolloutStats(4, 2.0, 2.0, 0.0, 40)
    assert "rollout/rows_per_decode_step" not in stats.as_metrics()
