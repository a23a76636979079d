"""The rollout loop: token-exact trajectories, masks, spans, budgets, malformed calls."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers.cache_utils import DynamicCache

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.engine import BUDGET_EXHAUSTED, RolloutEngine, encode_prompt, system_turn_length
from pipeline.protocols import TapoProtocol
from pipeline.types import Problem, ToolResult
from tests.helpers.tiny import ScriptedLM, _Out, tiny_llama, tiny_tokenizer


class PythonEval:
    """A deterministic code tool double: evaluates `print(<expr>)` with digits and * + only."""

    name = "code"

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s, self.calls = latency_s, []
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, code: str) -> ToolResult:
        self.calls.append(code)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.latency_s)
        self.in_flight -= 1
        expr = code.removeprefix("print(").removesuffix(")")
        if not set(expr) <= set("0123456789*+ "):
            return ToolResult.failure("NameError: name is not defined")
        return ToolResult(str(eval(expr)), ok=True, latency_s=self.latency_s)  # noqa: S307 - digits and * + only

    async def aclose(self) -> None:
        pass


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def problem(i: int = 0, type_: str = "calculator") -> Problem:
    return Problem(f"p{i}", f"What is 6 * {i}?", (str(6 * i),), type_, "calculator", "train")


def engine(tok, segments, tools=None, **cfg) -> tuple[RolloutEngine, ScriptedLM]:
    model = ScriptedLM(tok, segments)
    config = RolloutConfig(**{"max_policy_tokens": 200, "max_total_tokens": 2000, "temperature": 1.0, **cfg})
    return RolloutEngine(model, tok, tools if tools is not None else {"code": PythonEval()}, config, seed=0), model


CALL_THEN_ANSWER = ["<think>compute</think> <code>print(6 * 7)</code>", "<answer>42</answer>"]


def test_tool_call_round_trip_is_token_exact(tok) -> None:
    eng, model = engine(tok, CALL_THEN_ANSWER)
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    assert traj.finish_reason == "answer"
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
    (call,) = traj.tool_calls
    assert call.input == "print(6 * 7)" and call.result.output == "42"
    # sampled tokens are exactly the script's tokens; inserted tokens are exactly the wrapped output
    s0, s1 = call.call_span
    o0, o1 = call.output_span
    assert list(traj.response_ids[s0:s1]) == model.segments[0]
    assert tok.decode(traj.response_ids[o0:o1]) == "\n<response>\n42\n</response>\n"
    assert list(traj.response_ids[o1:]) == model.segments[1]
    assert all(m == 0 for m in traj.loss_mask[o0:o1])
    assert all(m == 1 for m in traj.loss_mask[:o0] + traj.loss_mask[o1:])
    assert all(lp == 0.0 for lp in traj.logprobs[o0:o1])
    assert all(lp <= 0.0 for lp in traj.logprobs)
    assert len(traj.entropies) == len(traj.response_ids)
    assert all(h is None for h in traj.entropies[o0:o1])  # unknown, not 0.0: nothing was sampled there
    assert all(h is not None and h >= 0.0 for h, m in zip(traj.entropies, traj.loss_mask) if m)
    assert traj.text.endswith("<answer>42</answer>")
    assert traj.turns == 2


def test_policy_spans_decode_to_generated_text(tok) -> None:
    eng, _ = engine(tok, CALL_THEN_ANSWER)
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    policy_ids = [t for t, m in zip(traj.response_ids, traj.loss_mask) if m]
    assert tok.decode(policy_ids) == "".join(CALL_THEN_ANSWER)
    assert traj.policy_token_count == len(policy_ids)


def test_budget_exhausted_after_c_calls(tok) -> None:
    segments = ["<code>print(1)</code>", "<code>print(2)</code>", "<code>print(3)</code>", "<answer>3</answer>"]
    tool = PythonEval()
    eng, _ = engine(tok, segments, {"code": tool}, max_tool_calls=2, max_turns=8)
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    assert len(tool.calls) == 2
    assert [c.result.ok for c in traj.tool_calls] == [True, True, False]
    assert traj.tool_calls[2].result.output == BUDGET_EXHAUSTED
    assert traj.finish_reason == "answer"


def test_max_turns_ends_trajectory(tok) -> None:
    segments = ["<code>print(1)</code>"] * 5
    eng, _ = engine(tok, segments, max_tool_calls=9, max_turns=3)
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    assert traj.finish_reason == "max_turns" and traj.turns == 3 and len(traj.tool_calls) == 2


@pytest.mark.parametrize(("segment", "error"), [("<code>   </code>", "empty <code> call"),
                                                  ("print(1)</code>", "without '<code>'")])
def test_malformed_calls_get_error_output(tok, segment: str, error: str) -> None:
    eng, _ = engine(tok, [segment, "<answer>1</answer>"])
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    (call,) = traj.tool_calls
    assert not call.result.ok and error in call.result.output
    assert traj.finish_reason == "answer"


def test_policy_token_budget(tok) -> None:
    eng, _ = engine(tok, ["<think>" + "fox " * 100 + "</think><answer>1</answer>"], max_policy_tokens=20)
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    assert traj.finish_reason == "max_tokens" and traj.policy_token_count == 20


def test_tool_error_is_an_observation(tok) -> None:
    eng, _ = engine(tok, ["<code>print(x)</code>", "<answer>0</answer>"])
    traj = eng.rollout([problem()], 1).groups[0].trajectories[0]
    assert traj.tool_calls[0].result.output.startswith("NameError")
    assert "NameError" in traj.text


def test_tools_offered_by_problem_type(tok) -> None:
    """A fact problem is not offered the code tool, so </code> is not a stop string for it."""
    eng, _ = engine(tok, ["<code>print(1)</code><answer>1</answer>"])
    traj = eng.rollout([problem(type_="fact")], 1).groups[0].trajectories[0]
    assert traj.tool_calls == () and traj.finish_reason == "answer"


def test_slow_tool_does_not_block_others(tok) -> None:
    """Trajectories waiting on a slow tool wait together, not one after another."""
    tool = PythonEval(latency_s=0.5)
    eng, _ = engine(tok, CALL_THEN_ANSWER, {"code": tool}, max_batch_sequences=8)
    result = eng.rollout([problem(i) for i in range(4)], 2)
    assert tool.max_in_flight > 1
    assert all(t.finish_reason == "answer" for g in result.groups for t in g.trajectories)
    assert result.stats.calls_per_trajectory["code"] == 1.0


def test_groups_keep_problem_order(tok) -> None:
    eng, _ = engine(tok, CALL_THEN_ANSWER)
    result = eng.rollout([problem(i) for i in range(3)], 2)
    assert [g.problem.id for g in result.groups] == ["p0", "p1", "p2"]
    assert all(len(g.trajectories) == 2 and {t.problem_id for t in g.trajectories} == {g.problem.id}
               for g in result.groups)


class LoggedTool(PythonEval):
    """Problem p0's call is slow; every completion is logged in a shared event list."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def __call__(self, code: str) -> ToolResult:
        await asyncio.sleep(0.6 if "print(6 * 0)" in code else 0.0)
        self.log.append("tool_done")
        return await super().__call__(code)


class LoggedLM(ScriptedLM):
    def __init__(self, tok, segments, log: list[str]) -> None:
        super().__init__(tok, segments)
        self.log = log


def test_turn_synchronous_waits_for_the_slowest_tool(tok) -> None:
    """Problem p0's tool is slow. Turn-synchronous: nobody resumes before it answers;
    continuous on arrival (readmit_after_steps 0): p1 resumes as soon as its own (fast) tool answers;
    on the decoding clock, calls made at the same step resume together, at a step fixed in advance."""
    for schedule, readmit, done_before_first_resume in (("turn-synchronous", 8, 2), ("continuous", 0, 1),
                                                        ("continuous", 8, 2)):
        log: list[str] = []
        model = _ByQuestion(tok, {
            "What is 6 * 0?": LoggedLM(tok, ["<code>print(6 * 0)</code>", "<answer>0</answer>"], log),
            "What is 6 * 1?": LoggedLM(tok, ["<code>print(6 * 1)</code>", "<answer>6</answer>"], log),
        })
        cfg = RolloutConfig(max_policy_tokens=200, max_total_tokens=2000, schedule=schedule,
                            readmit_after_steps=readmit)
        result = RolloutEngine(model, tok, {"code": LoggedTool(log)}, cfg).rollout([problem(0), problem(1)], 1)
        assert [t.text[-10:] for g in result.groups for t in g.trajectories] == ["0</answer>", "6</answer>"]
        assert log[: log.index("resumed")].count("tool_done") == done_before_first_resume, (schedule, log)


class _ByQuestion(torch.nn.Module):
    """Routes each row to the scripted model of its question (the engine sees one model)."""

    def __init__(self, tok, models: dict) -> None:
        super().__init__()
        self.tok, self.models = tok, models
        self.dummy = torch.nn.Parameter(torch.zeros(1))
        self.generation_config = next(iter(models.values())).generation_config

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        keys = input_ids.float()[:, None, :, None] if cache is None else torch.cat(
            [cache.layers[0].keys, input_ids.float()[:, None, :, None]], dim=2)
        rows = []
        for b in range(input_ids.shape[0]):
            context = keys[b, 0, :, 0][attention_mask[b].bool()].long()
            text = self.tok.decode(context)
            model = next((m for q, m in self.models.items() if q in text), None)
            if model is None:  # the shared system turn alone, prefilled once for every row: its logits go unread
                rows.append(self.tok.eos_token_id)
                continue
            if input_ids.shape[1] > 1 and "<response>" in text[text.rfind("assistant"):]:
                model.log.append("resumed")
            rows.append(model._next_token(context.tolist()))
        logits = torch.full((input_ids.shape[0], 1, len(self.tok)), -1e4)
        for b, token in enumerate(rows):
            logits[b, 0, token] = 0.0
        return _Out(logits, DynamicCache(ddp_cache_data=[(keys, keys)]))


@pytest.mark.parametrize("tools", [("search", "code"), ("code", "search"), ("search",), ("code",), ()])
def test_tapo_system_prompt_lists_and_shows_exactly_the_offered_tools(tools) -> None:
    """One example per offered tool: with a single example a small model copied it on questions
    that needed the other tool."""
    prompt = TapoProtocol().system_prompt(tools)
    for tool in ("search", "code"):
        shown = f"<{tool}>" in prompt
        assert shown == (tool in tools), (tool, prompt)
    assert prompt.count("Question:") == max(len(tools), 1)
    assert ("Examples:" in prompt) == (len(tools) > 1)  # a one-tool prompt is unchanged: "Example:"


@pytest.mark.parametrize("tools", [("search", "code"), ("code",)])
def test_the_shared_prefix_is_the_system_turn_every_prompt_opens_with(tok, tools) -> None:
    protocol = TapoProtocol()
    prompts = [encode_prompt(tok, protocol, problem(i), tools) for i in (1, 2)]
    n = system_turn_length(tok, protocol, problem(1), tools, prompts[0])
    assert n == system_turn_length(tok, protocol, problem(2), tools, prompts[1]) > 0
    assert prompts[0][:n] == prompts[1][:n] and prompts[0][n] == prompts[1][n]  # the turn ends; the user's begins
    assert tok.decode(prompts[0][:n]).endswith("<|im_end|>\n") and "What is 6 * 1?" in tok.decode(prompts[0][n:])
    assert system_turn_length(tok, protocol, problem(1), tools, prompts[0][:n]) == 0  # nothing after it: no prefix


def test_decoding_steps_count_the_rows_decoded_together(tok) -> None:
    """Copies of one prompt decode side by side: every step carries all of them, and the first token of each
    comes from the prefill, not from a decoding step."""
    eng, _ = engine(tok, ["<think>six sevens</think><answer>42</answer>"])
    result = eng.rollout([problem()], 4)
    tokens = {t.policy_token_count for t in result.groups[0].trajectories}
    metrics = result.stats.as_metrics()
    assert len(tokens) == 1 and metrics["rollout/decode_steps"] == tokens.pop() - 1
    assert metrics["rollout/rows_per_decode_step"] == 4


# --- refill: a rollout that grows while it runs (dynamic sampling's replacements) -----------------

class GatedTool(PythonEval):
    """p0's call answers only once `gate` is set (no wall-clock race: the test says when)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def __call__(self, code: str) -> ToolResult:
        if "print(6 * 0)" in code:
            await self.gate.wait()
        return await super().__call__(code)


def _by_question_engine(tok, questions: range, slow_tool_for: str | None = None, tool=None, **cfg) -> RolloutEngine:
    log: list[str] = []
    model = _ByQuestion(tok, {f"What is 6 * {i}?": LoggedLM(tok, [f"<code>print(6 * {i})</code>",
                                                                f"<answer>{6 * i}</answer>"], log)
                              for i in questions})
    tool = tool or (LoggedTool(log) if slow_tool_for == "p0" else PythonEval())
    config = RolloutConfig(**{"max_policy_tokens": 200, "max_total_tokens": 2000, **cfg})
    return RolloutEngine(model, tok, {"code": tool}, config)


def test_a_refill_joins_the_running_rollout_and_groups_stay_in_draw_order(tok) -> None:
    """p0's tool is slow. p1's group finishes first and the refill starts p2 (then p3 after p2): both
    decode while p0 still waits on its tool, so they finish before it (rows rejoining on arrival: on the
    decoding clock p1 would wait for p0's call of the same step); the result lists draw order."""
    gated = GatedTool()
    eng = _by_question_engine(tok, range(4), tool=gated, readmit_after_steps=0)
    finished: list[str] = []

    def refill(group):
        assert all(t.finish_reason == "answer" for t in group.trajectories)  # handed over complete
        finished.append(group.problem.id)
        if group.problem.id == "p3":
            gated.gate.set()  # p0's tool answers only now: p1, p2 and p3 decoded while it waited
        return {"p1": [problem(2)], "p2": [problem(3)]}.get(group.problem.id, [])

    result = eng.rollout([problem(0), problem(1)], 2, refill=refill)
    assert finished == ["p1", "p2", "p3", "p0"]
    assert [g.problem.id for g in result.groups] == ["p0", "p1", "p2", "p3"]
    assert [t.text[-11:] for g in result.groups for t in g.trajectories][-2:] == ["18</answer>"] * 2
    assert result.stats.trajectories == 8 and result.stats.calls_per_trajectory["code"] == 1.0


def test_a_refilled_problem_samples_the_tokens_of_its_place_in_the_draw_order(tok) -> None:
    """A sequence's generator is seeded by its position among the rollout's draws, so a problem that
    joins mid-rollout samples what it would have sampled had it been drawn up front."""
    model = tiny_llama(len(tok), seed=3)
    model.generation_config.eos_token_id = None
    config = RolloutConfig(max_policy_tokens=12, max_total_tokens=2000, temperature=1.0)
    problems = [problem(i, "math") for i in range(3)]
    up_front = RolloutEngine(model, tok, {}, config, seed=5).rollout(problems, 3)
    refilled = RolloutEngine(model, tok, {}, config, seed=5).rollout(
        problems[:2], 3, refill=lambda g: [problems[2]] if g.problem.id == "p0" else [])
    ids = [[t.response_ids for t in g.trajectories] for g in up_front.groups]
    assert [[t.response_ids for t in g.trajectories] for g in refilled.groups] == ids
    assert len({r for group in ids for r in group}) == 9  # the rows did sample different tokens


@pytest.mark.parametrize("world", [2, 3])
def test_a_problem_samples_the_same_tokens_on_whichever_rank_samples_it(tok, world: int) -> None:
    """Data parallelism samples each rank's share of a batch with the run's seed and each problem's place in the
    whole batch as its key: the union of the ranks' groups is what one process samples, token for token, and
    a rank that refills from its reserve samples each spare as its place in the window says."""
    model = tiny_llama(len(tok), seed=3)
    model.generation_config.eos_token_id = None
    config = RolloutConfig(max_policy_tokens=10, max_total_tokens=2000, temperature=1.0)
    problems = [problem(i, "math") for i in range(5)]
    whole = RolloutEngine(model, tok, {}, config, seed=5).rollout(problems, 2)
    expected = {g.problem.id: [t.response_ids for t in g.trajectories] for g in whole.groups}
    sampled: dict[str, list] = {}
    for rank in range(world):
        mine = list(range(rank, len(problems), world))
        part = RolloutEngine(model, tok, {}, config, seed=5).rollout([problems[i] for i in mine], 2, keys=mine)
        sampled |= {g.problem.id: [t.response_ids for t in g.trajectories] for g in part.groups}
    assert sampled == expected
    assert len({r for group in expected.values() for r in group}) == 10  # the rows did sample different tokens
    head, spare = [problems[0]], problems[world]  # a reserve problem joining mid-rollout on rank 0
    refilled = RolloutEngine(model, tok, {}, config, seed=5).rollout(
        head, 2, keys=[0, world], refill=lambda g: [spare] if g.problem.id == "p0" else [])
    assert [[t.response_ids for t in g.trajectories] for g in refilled.groups] == [expected["p0"], expected[spare.id]]
    with pytest.raises(ValueError, match="drew 2 problems but was given 1 keys"):
        RolloutEngine(model, tok, {}, config, seed=5).rollout(head, 1, keys=[0], refill=lambda g: [spare])


def test_a_failing_refill_is_raised_from_the_rollout_not_lost_on_the_event_loop(tok) -> None:
    eng = _by_question_engine(tok, range(2))

    def refill(group):
        raise KeyError(f"no score for {group.problem.id}")

    with pytest.raises(KeyError, match="no score for p"):
        eng.rollout([problem(0), problem(1)], 1, refill=refill)


def test_turn_synchronous_rounds_refuse_a_refill(tok) -> None:
    eng = _by_question_engine(tok, range(1), schedule="turn-synchronous")
    with pytest.raises(ValueError, match="rollout.schedule: continuous"):
        eng.rollout([problem(0)], 1, refill=lambda g: [])
