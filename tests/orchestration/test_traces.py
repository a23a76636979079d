"""Rollouts as MLflow traces (`pipeline.tracking.traces`): the conversion keeps every turn and tool call of any
trajectory, in order, with what the model saw and the latency, status and outage of each call; a training step logs
its sample of kept and dropped groups with the advantages the update gave them; an evaluation logs the problems
`run.traces.evaluate` covers; and what is logged reads back from MLflow, linked to its run and step."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow import MlflowClient

from pipeline.config.run import TracesSection
from pipeline.tracking.traces import (Score, finish_traces, group_trace, log_evaluation_traces, log_step_traces, problem_trace,
                                      sampled_groups, step_traces, turns_of)
from pipeline.types import Collected, Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, ToolResult, Trajectory

PROBLEM = Problem("p1", "What is 6 x 7?", ("42",), "calculator", "calculator", "train")


def trajectory(calls: list[tuple[str, str, float, bool, bool]], per_turn: list[int] | None = None,
               finish: str = "answer", problem_id: str = "p1") -> Trajectory:
    """A trajectory whose tool calls are `(tool, output, latency_s, ok, outage)`; `per_turn` says how many calls
    each turn wrote (chat-tools: several share one insertion), one each by default."""
    per_turn = per_turn or [1] * len(calls)
    tool_calls, position = [], 0
    for turn, count in enumerate(per_turn):
        for _ in range(count):
            tool, output, latency, ok, outage = calls[position]
            result = ToolResult(output, ok, "ok" if ok else "error", None if ok else "boom", latency, outage)
            tool_calls.append(ToolCall(tool, f"arg {position}", result, (10 * turn, 10 * turn + 1),
                                       (10 * turn + 2, 10 * turn + 3)))
            position += 1
    segments = tuple(f"turn text {i}" for i in range(len(per_turn) + 1))
    return Trajectory(problem_id, (1,), (2,), (1,), (0.0,), tuple(tool_calls), finish, "whole text", len(segments),
                      segments=segments, error="watchdog" if finish == "error" else "")


def reward(total: float) -> RewardBreakdown:
    return RewardBreakdown(True, float(total > 0), 0.0, -0.1, total=total, predicted="42")


CALL = st.tuples(st.sampled_from(["code", "search", "calc"]), st.text(max_size=30),
                 st.floats(0, 5, allow_nan=False), st.booleans(), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), max_size=4).flatmap(
    lambda per_turn: st.tuples(st.just(per_turn), st.lists(CALL, min_size=sum(per_turn), max_size=sum(per_turn)))),
    st.sampled_from(["answer", "max_tokens", "error"]), st.floats(-2, 2, allow_nan=False))
def test_every_turn_and_tool_call_is_a_span_in_order(shape: tuple[list[int], list], finish: str,
                                                     advantage: float) -> None:
    per_turn, calls = shape
    traj = trajectory(calls, per_turn, finish)
    trace = group_trace(3, ScoredGroup(Group(PROBLEM, (traj,)), (reward(1.0),)), True, [advantage])
    (span,) = trace.root.children
    turns = [c for c in span.children if c.kind == "LLM"]
    tools = [c for c in span.children if c.kind == "TOOL"]
    assert [t.outputs for t in turns] == list(traj.segments)  # each turn's own text, every one
    assert len(tools) == len(calls)
    for call, tool in zip(traj.tool_calls, tools, strict=True):
        assert tool.inputs == {"arguments": call.input} and tool.outputs == call.result.output
        assert tool.attributes["outage"] is call.result.infrastructure and tool.ok is call.result.ok
        assert tool.attributes["status"] == call.result.status
        assert tool.end_ns - tool.start_ns == int(call.result.latency_s * 1e9)
    starts = [c.start_ns for c in span.children]
    assert starts == sorted(starts)  # in the order they happened
    assert span.end_ns == trace.root.end_ns == sum(int(c[2] * 1e9) for c in calls)
    assert span.attributes["advantage"] == advantage and span.attributes["reward.length"] == -0.1
    assert span.attributes["outages"] == sum(c[4] for c in calls) and span.ok is (finish != "error")
    assert trace.tags == {"tapo.stage": "train", "tapo.step": "3", "tapo.problem_id": "p1", "tapo.group": "kept"}


def test_a_chat_turns_calls_follow_that_turn() -> None:
    calls = [("code", "1", 0.1, True, False), ("search", "2", 0.2, True, False), ("code", "3", 0.3, False, True)]
    turns = turns_of(trajectory(calls, [2, 1]))
    assert [(text, [c.result.output for c in batch]) for text, batch in turns] == [
        ("turn text 0", ["1", "2"]), ("turn text 1", ["3"]), ("turn text 2", [])]
    bare = trajectory(calls, [2, 1])
    bare = Trajectory(**{**bare.__dict__, "segments": ()})  # a hand-built record without its turns' texts
    assert [text for text, _ in turns_of(bare)] == ["whole text", "", ""]


def _groups(prefix: str, n: int) -> list[ScoredGroup]:
    out = []
    for i in range(n):
        problem = Problem(f"{prefix}{i}", "q", ("1",), "calculator", "calculator", "train")
        trajs = tuple(trajectory([], finish="answer", problem_id=problem.id) for _ in range(2))
        out.append(ScoredGroup(Group(problem, trajs), (reward(1.0), reward(0.0))))
    return out


@pytest.mark.parametrize(("kept", "dropped", "n", "expected"), [
    (3, 2, 4, ["k0", "d0", "k1", "d1"]), (3, 0, 2, ["k0", "k1"]), (0, 3, 2, ["d0", "d1"]), (1, 3, 9, ["k0", "d0", "d1", "d2"]),
    (2, 2, 0, [])])
def test_a_step_traces_its_kept_and_dropped_groups_alternately(kept: int, dropped: int, n: int,
                                                               expected: list[str]) -> None:
    k, d = _groups("k", kept), _groups("d", dropped)
    collected = Collected(k, k + d, {}, d)
    assert [g.group.problem.id for g, _ in sampled_groups(collected, n)] == expected
    traces = step_traces(TracesSection(train_groups_per_step=n), 5, collected,
                         lambda groups: [np.array([0.7, -0.7]) for _ in groups])
    advantages = [[s.attributes["advantage"] for s in t.root.children] for t in traces]
    assert advantages == [[0.7, -0.7] if e.startswith("k") else [0.0, 0.0] for e in expected]


@pytest.fixture()
def run_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    mlflow.set_experiment("traces-test")
    with mlflow.start_run() as run:
        yield run.info.run_id


def test_a_step_and_an_evaluation_read_back_from_mlflow_linked_to_their_run(run_id: str) -> None:
    calls = [("code", "42\n", 0.25, True, False), ("search", "refused", 1.5, False, True)]
    group = ScoredGroup(Group(PROBLEM, (trajectory(calls), trajectory([])),), (reward(1.0), reward(-1.0)))
    collected = Collected([group], [group], {}, [])
    assert log_step_traces(TracesSection(), None, 7, collected, lambda gs: []) == 0  # no run: nothing
    assert log_step_traces(TracesSection(), run_id, 7, collected, lambda gs: [np.array([0.5, -0.5])]) == 1
    records = [{"id": "p1", "sample": i, "score": 1.0 - i, "reward": 1.0, "format_ok": True, "predicted": "42"}
               for i in range(2)]
    other = Problem("p2", "q", ("1",), "calculator", "calculator", "test")
    evaluation = [Group(PROBLEM, group.group.trajectories), Group(other, group.group.trajectories)]
    records += [r | {"id": "p2"} for r in records]
    assert log_evaluation_traces(TracesSection(evaluate=1), "calc", [PROBLEM, other], evaluation, records) == 1
    assert log_evaluation_traces(TracesSection(evaluate="none"), "calc", [PROBLEM, other], evaluation, records) == 0
    finish_traces()  # the stages' end: the hooks queue their traces, the stage waits for them once
    traces = mlflow.search_traces(run_id=run_id, return_type="list")
    by_stage = {t.info.tags["tapo.stage"]: t for t in traces}
    assert len(traces) == 2 and by_stage.keys() == {"train", "evaluate"}
    train = by_stage["train"]
    assert train.info.tags["tapo.step"] == "7" and train.info.trace_metadata["mlflow.sourceRun"] == run_id
    spans = {s.name: s for s in train.data.spans}
    assert {"step 7 · p1 · kept", "trajectory 0", "trajectory 1", "turn 1", "turn 3", "tool: code",
            "tool: search"} <= spans.keys()
    search = spans["tool: search"]
    assert search.outputs == "refused" and search.attributes["outage"] is True and search.status.status_code == "ERROR"
    assert search.inputs == {"arguments": "arg 1"} and search.attributes["latency_s"] == 1.5
    assert (search.end_time_ns - search.start_time_ns) == 1_500_000_000
    assert spans["trajectory 0"].attributes["advantage"] == 0.5 and spans["trajectory 0"].attributes["reward.total"] == 1
    assert by_stage["evaluate"].info.tags["tapo.problem_id"] == "p1"
    assert MlflowClient().get_run(run_id).info.run_id == run_id


def test_an_evaluated_problem_keeps_each_samples_score() -> None:
    trajs = (trajectory([("code", "7", 0.1, True, False)]), trajectory([]))
    trace = problem_trace("gsm8k", PROBLEM, trajs, [Score(1.0, 1.0, True, "42"), Score(0.0, -1.0, False, None, True)])
    assert trace.root.name == "gsm8k/p1" and trace.root.outputs == {"predicted": ["42", None], "correct": True}
    assert [s.attributes["score"] for s in trace.root.children] == [1.0, 0.0]
    assert trace.root.children[1].attributes["judged"] is True
