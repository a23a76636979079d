"""A step's tool choice per problem source: the collapse of a tool mix shows where the totals hide it."""

from __future__ import annotations

import pytest

from pipeline.sampling.dynamic_sampling import tool_choice_metrics
from pipeline.types import Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, ToolResult, Trajectory


def trajectory(tools: list[str]) -> Trajectory:
    calls = tuple(ToolCall(tool, "x", ToolResult("y", True), (0, 1), (1, 2)) for tool in tools)
    return Trajectory("p", (1,), (5, 6, 7), (1, 0, 1), (-0.1, 0.0, -0.1), calls, "answer", "text", len(tools) + 1)


def group(source: str, calls: list[list[str]]) -> ScoredGroup:
    problem = Problem(f"{source}-1", "q", ("a",), "fact" if source == "nq_open" else "calculator", source, "train")
    trajectories = tuple(trajectory(c) for c in calls)
    return ScoredGroup(Group(problem, trajectories), tuple(RewardBreakdown(True, 0.0, 0.0, 0.0) for _ in calls))


def test_calls_per_trajectory_are_counted_per_source_and_tool() -> None:
    # The totals over both groups are 1.0 code and 0.25 search calls per trajectory, which look healthy;
    # per source, the fact questions are answered with code three times in four.
    metrics = tool_choice_metrics([
        group("calculator", [["code"], ["code"], ["code"], ["code"]]),
        group("nq_open", [["code"], ["code", "code"], ["search"], []]),
    ])
    assert metrics == pytest.approx({
        "tool_choice/calculator/code": 1.0, "tool_choice/calculator/search": 0.0,
        "tool_choice/nq_open/code": 0.75, "tool_choice/nq_open/search": 0.25,
    })


def test_groups_of_one_source_pool_their_trajectories_and_no_call_gives_no_metric() -> None:
    metrics = tool_choice_metrics([group("nq_open", [["search"], ["search"]]), group("nq_open", [[], [], [], []])])
    assert metrics == pytest.approx({"tool_choice/nq_open/search": 2 / 6})
    assert tool_choice_metrics([group("nq_open", [[], []])]) == {}
