"""A rollout never dies of its input (issue 56, point 2), for every scheduler of the hf backend: re-admission on
arrival, on the decoding clock, and turn-synchronous rounds (the vLLM backend: tests/vllm/test_vllm_hostile.py).

Hostile tools (answering lone surrogates, raising, answering no text, never answering, ignoring cancellation,
answering megabytes) and failures inside one row (its prompt, its segment's reading, its outputs' rendering, a
callback on the event loop, an answer that is lost) each end at most that row, with a recorded reason and a
defined reward; the other rows and the rollout go on. Each case runs under pytest-timeout: a row waiting for
ever fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio

import pytest

from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.protocols import protocol_for
from pipeline.reward.score import score_trajectory
from pipeline.rollout import engine as engine_module
from pipeline.rollout import episode, schedule, watchdog
from pipeline.rollout.engine import RolloutEngine, special_token_ids
from pipeline.types import Problem, ToolResult
from tests.helpers.tiny import ScriptedLM, tiny_tokenizer

pytestmark = pytest.mark.timeout(120)

SCHEDULES = {"on-arrival": {"readmit_after_steps": 0}, "clocked": {"readmit_after_steps": 2},
             "turn-synchronous": {"schedule": "turn-synchronous"}}
SEGMENTS = ["<think>compute</think> <code>print(6 * 7)</code>", "<answer>42</answer>"]
PROBLEMS = [Problem(f"p{i}", f"What is 6 * 7? ({i})", ("42",), "calculator", "calculator", "train") for i in range(2)]


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(params=sorted(SCHEDULES))
def schedule_cfg(request) -> dict:
    return SCHEDULES[request.param]


class Tool:
    """A code tool double whose answer the test chooses: `answer(call_input)` is awaited, its value returned."""

    name = "code"

    def __init__(self, answer, deadline_s: float | None = None) -> None:
        self.answer, self.calls = answer, []
        if deadline_s is not None:
            self.deadline_s = deadline_s

    async def __call__(self, code: str):
        self.calls.append(code)
        await asyncio.sleep(0)
        return await self.answer(code)

    async def aclose(self) -> None:
        pass


def answers(value):
    async def answer(code: str):
        return value
    return answer


def rollout(tok, tool, schedule_cfg: dict, problems=PROBLEMS, n: int = 2, patch=None, others=None, **cfg):
    config = RolloutConfig(**{"max_policy_tokens": 200, "max_total_tokens": 4000, "max_tool_output_chars": 200,
                              "temperature": 1.0, **schedule_cfg, **cfg})
    with RolloutEngine(ScriptedLM(tok, SEGMENTS), tok, {"code": tool, **(others or {})}, config, seed=0) as engine:
        if patch is not None:
            patch(engine)
        return engine.rollout(problems, n)


def reward(traj, problem=PROBLEMS[0]):
    return score_trajectory(problem, traj, RewardConfig(), protocol=protocol_for("tapo"), max_policy_tokens=200)


def trajectories(result):
    return [t for g in result.groups for t in g.trajectories]


# --- hostile tools ----------------------------------------------------------------------------------------------
def test_a_tool_answering_lone_surrogates_is_shown_as_replacement_characters(tok, schedule_cfg) -> None:
    """The defect: the tokenizer raised in the reply; the rollout raised (clocked) or waited for ever (on arrival)."""
    result = rollout(tok, Tool(answers(ToolResult("42 \ud83d \udc00\ud83d 42", ok=True))), schedule_cfg)
    for traj in trajectories(result):
        assert traj.finish_reason == "answer", traj.error
        (call,) = traj.tool_calls
        assert call.result.output == "42 \ufffd \ufffd\ufffd 42"  # recorded as shown: the scorer finds it
        assert not set(traj.response_ids[slice(*call.output_span)]) & special_token_ids(tok)
        assert reward(traj).accuracy == 1.0 and reward(traj).format_ok


class Ignores:
    """A client that swallows its cancellation and keeps the call for ever."""

    async def __call__(self, code: str):
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue


async def _never(code: str):
    await asyncio.Event().wait()


async def _raises(code: str):
    raise RuntimeError("the client broke")


async def _cancelled(code: str):
    raise asyncio.CancelledError


HOSTILE = {
    "raises": _raises,
    "raises-cancelled": _cancelled,
    "answers-none": answers(None),
    "answers-a-string": answers("42"),
    "answers-no-text": answers(ToolResult(None, ok=True)),  # type: ignore[arg-type]
    "never-answers": _never,
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_tool_breaking_its_contract_is_the_tools_failure_and_the_row_goes_on(tok, schedule_cfg, kind,
                                                                                monkeypatch) -> None:
    monkeypatch.setattr(watchdog, "WATCHDOG_MARGIN_S", 0.0)
    # the watchdog's limit is the longest call deadline: a search tool (not offered here) of 5 s puts it past the
    # code call's 0.2 s, which a busy machine's decoder thread could otherwise reach first (then the row ended)
    idle = Tool(answers(ToolResult("", ok=True)), deadline_s=5.0)
    result = rollout(tok, Tool(HOSTILE[kind], deadline_s=0.2), schedule_cfg, others={"search": idle})
    for traj in trajectories(result):
        (call,) = traj.tool_calls
        assert not call.result.ok and call.result.infrastructure, call.result  # the service's fault: not trained
        assert traj.finish_reason == "answer"  # the row read the failure and went on
    if kind == "never-answers":
        assert all(c.result.status == "timeout" for t in trajectories(result) for c in t.tool_calls)


def test_a_call_is_answered_at_its_deadline_even_by_a_client_that_ignores_its_cancellation() -> None:
    """The row does not wait for the client (which would keep the call for ever): it is let go. Run on a loop of
    its own, closed without cancelling what is left (asyncio.Runner.close would wait for that task)."""
    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(watchdog.bounded_call(Ignores(), "code", "print(1)", 0.2))
    finally:
        loop.close()
    assert result.status == "timeout" and result.infrastructure and not result.ok


async def _ignores_cancellation(code: str):
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue


def test_closing_the_engine_abandons_a_call_that_ignores_its_cancellation(tok, schedule_cfg, monkeypatch,
                                                                          caplog) -> None:
    """Each call was let go at its deadline and goes on for ever: closing cancels it, waits CLOSE_GRACE_S and
    abandons it, naming the tool (asyncio.Runner.close, which the engine's close ended with, waited for ever)."""
    monkeypatch.setattr(watchdog, "WATCHDOG_MARGIN_S", 0.0)
    monkeypatch.setattr(engine_module, "CLOSE_GRACE_S", 0.2)
    idle = Tool(answers(ToolResult("", ok=True)), deadline_s=5.0)  # the watchdog's limit past the calls' deadline
    with caplog.at_level("WARNING", logger=engine_module.__name__):
        result = rollout(tok, Tool(_ignores_cancellation, deadline_s=0.2), schedule_cfg, others={"search": idle})
    assert all(c.result.status == "timeout" for t in trajectories(result) for c in t.tool_calls)
    abandoned = [r.getMessage() for r in caplog.records if r.name == engine_module.__name__]
    assert len(abandoned) == 1 and "4 task(s)" in abandoned[0] and "tool 'code': call" in abandoned[0], abandoned


def test_a_tool_answering_megabytes_is_cut_to_the_output_limit(tok, schedule_cfg) -> None:
    result = rollout(tok, Tool(answers(ToolResult("4" * 2_000_000 + "\ud83d", ok=True))), schedule_cfg)
    for traj in trajectories(result):
        (call,) = traj.tool_calls
        assert call.output_span[1] - call.output_span[0] < 400 and traj.finish_reason == "answer"


# --- failures inside one row -------------------------------------------------------------------------------------
def _poison_reply(engine: RolloutEngine) -> None:
    reply = engine.renderer.reply

    def poisoned(dialogue, segment_ids, answered):
        if any("poison" in shown for _, shown in answered):
            raise UnicodeEncodeError("utf-8", "poison", 0, 1, "a tokenizer that cannot take it")
        return reply(dialogue, segment_ids, answered)
    engine.renderer.reply = poisoned


def test_outputs_the_renderer_cannot_render_end_their_row_only(tok, schedule_cfg) -> None:
    answered = []

    async def answer(code: str):
        answered.append(code)
        return ToolResult("poison" if len(answered) % 2 else "42", ok=True)  # every other answer
    tool = Tool(answer)
    result = rollout(tok, tool, schedule_cfg, patch=_poison_reply)
    ended = [t for t in trajectories(result) if t.finish_reason == "error"]
    assert ended and len(ended) < len(trajectories(result))  # some rows, never the rollout
    for traj in ended:
        assert "could not be rendered" in traj.error and "UnicodeEncodeError" in traj.error
        r = reward(traj)
        assert not r.format_ok and r.total == RewardConfig().format_penalty + r.length + r.code_penalty
    assert result.stats.finish_reasons["error"] == len(ended)


def test_a_segment_the_protocol_cannot_read_ends_its_row_only(tok, schedule_cfg) -> None:
    def patch(engine):
        read = engine.renderer.read

        def fragile(dialogue, segment_ids, tools, at_eos):
            if dialogue.prompt_ids == poisoned_prompt:
                raise RecursionError("maximum recursion depth exceeded")
            return read(dialogue, segment_ids, tools, at_eos)
        engine.renderer.read = fragile
    poisoned_prompt = RolloutEngine(ScriptedLM(tok, SEGMENTS), tok, {"code": Tool(answers(None))},
                                    RolloutConfig()).renderer.start(PROBLEMS[1], ("code",)).prompt_ids
    result = rollout(tok, Tool(answers(ToolResult("42", ok=True))), schedule_cfg, patch=patch)
    first, second = result.groups
    assert all(t.finish_reason == "answer" for t in first.trajectories)
    assert all(t.finish_reason == "error" and "RecursionError" in t.error for t in second.trajectories)


def test_a_prompt_that_cannot_be_built_ends_its_rows_without_sampling(tok, schedule_cfg) -> None:
    def patch(engine):
        start = engine.renderer.start

        def fragile(problem, tools):
            if problem.id == "p1":
                raise ValueError("the template refuses this question")
            return start(problem, tools)
        engine.renderer.start = fragile
    result = rollout(tok, Tool(answers(ToolResult("42", ok=True))), schedule_cfg, patch=patch)
    first, second = result.groups
    assert all(t.finish_reason == "answer" for t in first.trajectories)
    for traj in second.trajectories:
        assert traj.finish_reason == "error" and "prompt could not be built" in traj.error
        assert traj.prompt_ids and traj.response_ids == () and traj.policy_token_count == 0
        assert not reward(traj, PROBLEMS[1]).format_ok


def test_a_callback_raising_on_the_event_loop_ends_its_row_not_the_rollout(tok, schedule_cfg, monkeypatch) -> None:
    """What `_call_tools` calls once the tools answered raises (the first time): the row must not wait for ever."""
    clocked = schedule_cfg.get("readmit_after_steps", 0) > 0 and "schedule" not in schedule_cfg
    cls, name = (schedule.Clocked, "arrive") if clocked else (episode.Episodes, "_insert")
    original, raised = getattr(cls, name), []

    def once(self, *args):
        if not raised:
            raised.append(True)
            raise RuntimeError("a callback raised")
        return original(self, *args)
    monkeypatch.setattr(cls, name, once)
    result = rollout(tok, Tool(answers(ToolResult("42", ok=True))), schedule_cfg)
    reasons = sorted(t.finish_reason for t in trajectories(result))
    assert reasons == ["answer"] * 3 + ["error"]
    assert any("a callback raised" in t.error for t in trajectories(result))


def test_the_watchdog_names_and_ends_a_row_whose_answer_is_lost(tok, schedule_cfg, monkeypatch) -> None:
    monkeypatch.setattr(watchdog, "WATCHDOG_MARGIN_S", 0.0)
    lost = []
    spawn = episode.Episodes._spawn

    def loses_the_first(self, seq, *args):
        if not lost:
            lost.append(self.row_label(seq))
            return None  # the calls never run: nothing will ever answer this row
        return spawn(self, seq, *args)
    monkeypatch.setattr(episode.Episodes, "_spawn", loses_the_first)
    result = rollout(tok, Tool(answers(ToolResult("42", ok=True)), deadline_s=0.2), schedule_cfg)
    ended = [t for t in trajectories(result) if t.finish_reason == "error"]
    assert len(ended) == 1 and sum(t.finish_reason == "answer" for t in trajectories(result)) == 3
    assert ended[0].error.startswith(f"watchdog: row {lost[0]} waited")
    assert "tool call(s) code('print(6 * 7)')" in ended[0].error


def test_a_late_answer_to_a_row_the_watchdog_ended_is_dropped(tok, monkeypatch) -> None:
    """Whoever takes the row first owns it: the watchdog's end and a late answer cannot both apply."""
    dog = watchdog.Watchdog(limit_s=1.0, clock=lambda: now[0])
    now = [0.0]
    dog.parked(7, "p#0", "tool call(s) code('x')", queued=1)
    now[0] = 0.5
    dog.started(7)
    now[0] = 1.4
    assert dog.stuck() == []  # progress at 0.5: not past the limit yet
    now[0] = 1.6
    (stuck,) = dog.stuck()
    assert stuck.key == 7 and "row p#0 waited" in stuck.reason
    assert dog.released(7) is False


def test_a_row_queued_behind_busy_calls_is_not_stuck_while_any_call_moves() -> None:
    now = [0.0]
    dog = watchdog.Watchdog(limit_s=1.0, clock=lambda: now[0])
    dog.parked(1, "p#1", "tool call(s) code('a')", queued=1)  # waits for a concurrency slot
    dog.parked(2, "p#2", "tool call(s) code('b')", queued=1)
    dog.started(2)
    for t in (0.9, 1.8, 2.7):  # row 2's calls keep answering and starting: the run moves
        now[0] = t
        dog.answered(2)
        assert dog.stuck() == []
    now[0] = 4.0  # nothing moved for 1.3 s: both are stuck
    assert sorted(s.key for s in dog.stuck()) == [1, 2]


def test_a_tools_own_deadline_sets_the_engines_and_a_tool_without_one_gets_the_default() -> None:
    class Limits:
        deadline_s = 12.0

    class Client:
        limits = Limits()

    assert watchdog.call_deadline_s(Client()) == 12.0 + watchdog.WATCHDOG_MARGIN_S
    assert watchdog.call_deadline_s(object()) == watchdog.DEFAULT_CALL_DEADLINE_S + watchdog.WATCHDOG_MARGIN_S
    assert watchdog.Watchdog.for_tools({"a": Client(), "b": object()}).limit_s == watchdog.call_deadline_s(object())
