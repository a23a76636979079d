"""Rollouts as MLflow traces: every evaluated problem and a sample of each training step's groups, opened as a
tree in MLflow's trace view, linked to their run (`mlflow.sourceRun`) and step (tags).

A trace is one group: the problem's trajectories under it, and under each trajectory a span per turn (the policy's
text of that turn) and per tool call (the tool, its arguments, its output as the model saw it, its latency, status
and whether the service failed: `ToolResult.infrastructure`). The reward's parts, the advantage the update gave
the trajectory and its finish reason are the trajectory span's attributes; the group's are on the root.

Built from the records the rollout already returns (`Trajectory`, `RewardBreakdown`, the evaluation's scored
records), in two steps: a pure conversion into `SpanRecord` trees (`group_trace`, `problem_trace`), tested without
MLflow, and `log_traces`, which writes them. How much is written is bounded by `run.traces` (`TracesSection`);
`benchmarks/trace_cost.py` measures the bytes and seconds a step and an evaluated problem cost.

Departures from a live trace: the rollout keeps no clock per turn, only each tool call's latency, so a trace is laid
out after the fact: a turn span has no duration, a tool span lasts its measured latency, in the order they
happened. MLflow logs traces from a background queue, which drops what overflows it; each call here waits for its
traces to be written (`flush`), so a long evaluation loses none and a killed stage loses at most the chunk in hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlflow
import numpy as np
from mlflow.entities import SpanStatusCode, SpanType
from mlflow.tracing.constant import TraceMetadataKey

from pipeline.config.run import TracesSection
from pipeline.types import Collected, Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, Trajectory

TAG = "tapo."  # trace tags: tapo.stage, tapo.step, tapo.problem_id, tapo.group (kept / dropped), tapo.benchmark
NS = 1_000_000_000


@dataclass(frozen=True)
class SpanRecord:
    """One span of a trace, before it is logged. Times are nanoseconds from the trace's start."""

    name: str
    kind: str  # an MLflow SpanType
    inputs: Any = None
    outputs: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    ok: bool = True
    children: tuple[SpanRecord, ...] = ()


@dataclass(frozen=True)
class TraceRecord:
    """A trace: its root span (the group) and its tags."""

    root: SpanRecord
    tags: dict[str, str]


@dataclass(frozen=True)
class Score:
    """What an evaluation recorded about one sample (its scored record): the verifier's score, the reward, the
    format check, the predicted answer, the judge's verdict when one was asked."""

    score: float
    reward: float
    format_ok: bool
    predicted: str | None
    judged: bool = False  # the LLM judge was asked (`pipeline.evaluation.judge`): it may have raised the score
    judge_error: str = ""

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> Score:
        return cls(float(record["score"]), float(record["reward"]), bool(record["format_ok"]), record.get("predicted"),
                   bool(record.get("judged", False)), str(record.get("judge_error") or ""))


def turns_of(trajectory: Trajectory) -> list[tuple[str, tuple[ToolCall, ...]]]:
    """(the policy's text of a turn, the tool calls answered after it), in order. The calls of one chat turn share
    one insertion (`ToolCall.output_span`); a record without its turns' text (`segments`) is one turn holding the
    whole response."""
    batches: list[list[ToolCall]] = []
    for call in trajectory.tool_calls:
        if batches and batches[-1][-1].output_span == call.output_span:
            batches[-1].append(call)
        else:
            batches.append([call])
    texts = list(trajectory.segments) if len(trajectory.segments) == len(batches) + 1 else [trajectory.text]
    texts += [""] * (len(batches) + 1 - len(texts))
    return [(text, tuple(batches[i]) if i < len(batches) else ()) for i, text in enumerate(texts)]


def tool_span(call: ToolCall, start_ns: int) -> SpanRecord:
    result = call.result
    attributes = {"tool": call.tool, "latency_s": round(result.latency_s, 6), "status": result.status,
                  "ok": result.ok, "outage": result.infrastructure}
    if result.error:
        attributes["error"] = result.error
    return SpanRecord(f"tool: {call.tool}", SpanType.TOOL, inputs={"arguments": call.input},
                      outputs=result.output, attributes=attributes, start_ns=start_ns,
                      end_ns=start_ns + max(0, int(result.latency_s * NS)), ok=result.ok)


def trajectory_span(trajectory: Trajectory, index: int, attributes: Mapping[str, Any], start_ns: int,
                    outputs: Any = None) -> SpanRecord:
    """The trajectory's span: a span per turn and per tool call below it, laid out one after the other."""
    children: list[SpanRecord] = []
    clock = start_ns
    for turn, (text, calls) in enumerate(turns_of(trajectory), start=1):
        children.append(SpanRecord(f"turn {turn}", SpanType.LLM, outputs=text, start_ns=clock, end_ns=clock))
        for call in calls:
            children.append(tool_span(call, clock))
            clock = children[-1].end_ns
    own = {"finish_reason": trajectory.finish_reason, "turns": trajectory.turns, "tool_calls": len(trajectory.tool_calls),
           "outages": trajectory.infrastructure_failures, "policy_tokens": trajectory.policy_token_count,
           "response_tokens": len(trajectory.response_ids)} | dict(attributes)
    if trajectory.error:
        own["error"] = trajectory.error
    return SpanRecord(f"trajectory {index}", SpanType.AGENT, outputs=outputs or trajectory.text, attributes=own,
                      start_ns=start_ns, end_ns=clock, ok=trajectory.finish_reason != "error",
                      children=tuple(children))


def reward_attributes(reward: RewardBreakdown) -> dict[str, Any]:
    return {"reward.total": reward.total, "reward.accuracy": reward.accuracy, "reward.format": reward.format,
            "reward.length": reward.length, "reward.code_penalty": reward.code_penalty,
            "reward.entropy": reward.entropy, "reward.format_ok": reward.format_ok, "correct": reward.correct,
            "predicted": reward.predicted or ""}


def _problem_inputs(problem: Problem) -> dict[str, Any]:
    return {"question": problem.question, "gold": list(problem.answers), "source": problem.source,
            "type": problem.type}


def _root(name: str, problem: Problem, spans: list[SpanRecord], attributes: dict[str, Any],
          outputs: Any) -> SpanRecord:
    return SpanRecord(name, SpanType.CHAIN, inputs=_problem_inputs(problem), outputs=outputs, attributes=attributes,
                      start_ns=0, end_ns=max((s.end_ns for s in spans), default=0), children=tuple(spans))


def _sequential(build: Callable[[int, int], SpanRecord], count: int) -> list[SpanRecord]:
    """`count` spans, each starting where the previous one ended (`build(index, start_ns)`)."""
    spans: list[SpanRecord] = []
    for i in range(count):
        spans.append(build(i, spans[-1].end_ns if spans else 0))
    return spans


def group_trace(step: int, scored: ScoredGroup, kept: bool, advantages_G: Sequence[float] | np.ndarray) -> TraceRecord:
    """A training group as a trace: each trajectory with its reward's parts and the advantage the update gave it
    (zero for a dropped group)."""
    group, rewards = scored.group, scored.rewards
    spans = _sequential(lambda i, start: trajectory_span(
        group.trajectories[i], i, reward_attributes(rewards[i]) | {"advantage": float(advantages_G[i])}, start),
        len(group.trajectories))
    status = "kept" if kept else "dropped"
    totals = [r.total for r in rewards]
    attributes = {"step": step, "group": status, "anchor_only": scored.anchor_only, "reward.mean": float(np.mean(totals)),
                  "accuracy.mean": float(np.mean([r.accuracy for r in rewards])), "trajectories": len(totals)}
    root = _root(f"step {step} · {group.problem.id} · {status}", group.problem, spans, attributes,
                 {"rewards": totals, "advantages": [float(a) for a in advantages_G]})
    return TraceRecord(root, {f"{TAG}stage": "train", f"{TAG}step": str(step),
                              f"{TAG}problem_id": group.problem.id, f"{TAG}group": status})


def problem_trace(benchmark: str, problem: Problem, trajectories: Sequence[Trajectory],
                  scores: Sequence[Score]) -> TraceRecord:
    """An evaluated problem as a trace: each sample with its score, reward and predicted answer."""
    def sample(i: int, start: int) -> SpanRecord:
        s = scores[i]
        attributes = {"score": s.score, "reward.total": s.reward, "reward.format_ok": s.format_ok,
                      "predicted": s.predicted or "", "judged": s.judged} | (
                          {"judge_error": s.judge_error} if s.judge_error else {})
        return trajectory_span(trajectories[i], i, attributes, start)

    spans = _sequential(sample, len(trajectories))
    correct = bool(scores) and scores[0].score > 0.9
    root = _root(f"{benchmark}/{problem.id}", problem, spans, {"benchmark": benchmark, "samples": len(spans),
                                                               "score.mean": float(np.mean([s.score for s in scores]))},
                 {"predicted": [s.predicted for s in scores], "correct": correct})
    return TraceRecord(root, {f"{TAG}stage": "evaluate", f"{TAG}benchmark": benchmark,
                              f"{TAG}problem_id": problem.id, f"{TAG}correct": str(correct).lower()})


def sampled_groups(collected: Collected, n: int) -> list[tuple[ScoredGroup, bool]]:
    """Up to `n` of a step's groups, (group, kept), kept and dropped ones alternately, each in its order: what a
    reader compares (what the update trained on, what dynamic sampling threw away). No randomness: logging never
    changes a resumed run."""
    kept, dropped = list(collected.kept), list(collected.dropped)
    order: list[tuple[ScoredGroup, bool]] = []
    for i in range(max(len(kept), len(dropped))):
        order += [(kept[i], True)] if i < len(kept) else []
        order += [(dropped[i], False)] if i < len(dropped) else []
    return order[:n]


def step_traces(settings: TracesSection, step: int, collected: Collected,
                advantages: Callable[[list[ScoredGroup]], Sequence[np.ndarray]]) -> list[TraceRecord]:
    """The traces of one training step: `settings.train_groups_per_step` groups (`sampled_groups`). `advantages`
    gives each kept group's per-trajectory advantages (the algorithm's; a dropped group trains with none)."""
    chosen = sampled_groups(collected, settings.train_groups_per_step)
    kept = [g for g, is_kept in chosen if is_kept]
    by_group = {id(g): adv for g, adv in zip(kept, advantages(kept) if kept else [], strict=True)}
    return [group_trace(step, g, is_kept, by_group[id(g)] if is_kept else np.zeros(len(g.group.trajectories)))
            for g, is_kept in chosen]


def log_step_traces(settings: TracesSection, run_id: str | None, step: int, collected: Collected,
                    advantages: Callable[[list[ScoredGroup]], Sequence[np.ndarray]]) -> int:
    """Training's hook: the step's sampled groups as traces in run `run_id` (nothing without a run: a data-parallel
    rank other than 0, or a run the caller does not track). Written while training goes on: `finish_traces` at
    the run's end."""
    if run_id is None or settings.train_groups_per_step == 0:
        return 0
    return log_traces(step_traces(settings, step, collected, advantages), run_id, wait=False)


def log_evaluation_traces(settings: TracesSection, benchmark: str, problems: Sequence[Problem],
                          groups: Iterable[Group], records: Iterable[Mapping[str, Any]]) -> int:
    """The evaluation's hook: each problem of `groups` (of `benchmark`, whose problems in order are `problems`) as
    a trace in the active MLflow run, with its scored `records` (one per sample, `id` and `sample` keyed), when
    `settings.evaluate` covers it (all, or the benchmark's first N); nothing without an active run. Written while
    the evaluation goes on: `finish_traces` at its end."""
    active = mlflow.active_run()
    if active is None or settings.evaluate == "none":
        return 0
    limit = len(problems) if settings.evaluate == "all" else settings.evaluate
    covered = {p.id for p in problems[:limit]}
    scores = {(r["id"], int(r["sample"])): Score.of(r) for r in records}
    traces = [problem_trace(benchmark, g.problem, g.trajectories,
                            [scores[(g.problem.id, i)] for i in range(len(g.trajectories))])
              for g in groups if g.problem.id in covered]
    return log_traces(traces, active.info.run_id, wait=False)


def log_traces(traces: Iterable[TraceRecord], run_id: str, *, wait: bool = True) -> int:
    """Write `traces` into run `run_id`'s experiment, linked to the run; the number written. With `wait`, returns
    once they are written. Without, MLflow writes them on its own thread while the stage goes on, and the stage
    calls `finish_traces` once at its end: a wait (MLflow's flush) takes up to a second whatever it waits for (its
    writer polls its queue once a second), which cost every training step and evaluated chunk about a second. A
    process killed before its end loses the traces still queued (its metrics and checkpoints are written apart)."""
    experiment_id = mlflow.MlflowClient().get_run(run_id).info.experiment_id
    written = 0
    for trace in traces:
        _log(trace, experiment_id, run_id, time.time_ns())
        written += 1
    if written:
        _queued.set()
        if wait:
            finish_traces()
    return written


_queued = threading.Event()  # traces were logged and not yet waited for


def finish_traces() -> None:
    """Wait until every trace logged so far is written (a stage's end); at once when none is waiting."""
    if _queued.is_set():
        _queued.clear()
        mlflow.flush_trace_async_logging()


def _log(trace: TraceRecord, experiment_id: str, run_id: str, start_ns: int) -> None:
    root = trace.root
    live = mlflow.start_span_no_context(root.name, span_type=root.kind, inputs=root.inputs,
                                        attributes=root.attributes, tags=trace.tags,
                                        metadata={TraceMetadataKey.SOURCE_RUN: run_id}, experiment_id=experiment_id,
                                        start_time_ns=start_ns + root.start_ns)
    for child in root.children:
        _log_span(child, live, start_ns)
    live.end(outputs=root.outputs, status=_status(root), end_time_ns=start_ns + root.end_ns)


def _log_span(span: SpanRecord, parent: Any, start_ns: int) -> None:
    live = mlflow.start_span_no_context(span.name, span_type=span.kind, parent_span=parent, inputs=span.inputs,
                                        attributes=span.attributes, start_time_ns=start_ns + span.start_ns)
    for child in span.children:
        _log_span(child, live, start_ns)
    live.end(outputs=span.outputs, status=_status(span), end_time_ns=start_ns + span.end_ns)


def _status(span: SpanRecord) -> str:
    return SpanStatusCode.OK if span.ok else SpanStatusCode.ERROR
