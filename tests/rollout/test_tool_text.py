"""What the policy did not sample is text: tool output, search passages, notices and error messages are
tokenized so that every special token and chat-template role marker stays plain text; and the budgets
hold exactly when a tool call ends on them."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.reward.score import score_trajectory
from pipeline.rollout.engine import RolloutEngine, encode_plain, special_token_ids
from pipeline.protocols import protocol_for
from pipeline.types import Problem, ToolResult
from tests.helpers.tiny import ScriptedLM, tiny_tokenizer

# Markers of other chat templates (Llama 3, Mistral, Gemma, Phi, tool-calling templates), added as
# special tokens so the property covers more than ChatML.
EXTRA_SPECIALS = ["<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "[INST]", "[/INST]", "<s>", "</s>",
                  "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|assistant|>", "<|end|>", "<tool_call>"]


@pytest.fixture(scope="module")
def tok():
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": EXTRA_SPECIALS})
    return tokenizer


def special_strings(tokenizer) -> list[str]:
    return sorted({tokenizer.convert_ids_to_tokens(i) for i in special_token_ids(tokenizer)})


def role_markers(tokenizer) -> list[str]:
    """The text the chat template writes around each role's content (`<|im_end|>\\n<|im_start|>user\\n`)."""
    markers = []
    for role in ("system", "user", "assistant", "tool"):
        rendered = tokenizer.apply_chat_template([{"role": role, "content": "\x01"}], tokenize=False,
                                                 add_generation_prompt=True)
        before, after = rendered.split("\x01")
        markers += [before, after, after + before]
    return [m for m in markers if m]


def test_the_fixture_tokenizer_parses_special_tokens_in_ordinary_encoding(tok) -> None:
    """The hazard is real: plain encoding of these strings yields their special ids."""
    specials = special_token_ids(tok)
    for text in special_strings(tok):
        assert set(tok(text, add_special_tokens=False)["input_ids"]) & specials, text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), head=st.text(max_size=12), tail=st.text(max_size=12))
def test_every_special_token_and_role_marker_stays_plain_text(tok, data, head: str, tail: str) -> None:
    marker = data.draw(st.sampled_from(special_strings(tok) + role_markers(tok)))
    protocol = protocol_for(data.draw(st.sampled_from(["tapo", "tapo-no-think", "torl", "search-r1"])))
    text = protocol.wrap_output(head + marker + tail)
    ids = encode_plain(tok, text)
    assert not set(ids) & special_token_ids(tok)
    assert tok.decode(ids, skip_special_tokens=True) == text


class Echo:
    """A tool double whose output is chosen by the test (a snippet that prints special tokens)."""

    name = "code"

    def __init__(self, output: str, *, raises: bool = False) -> None:
        self.output, self.raises = output, raises

    async def __call__(self, code: str) -> ToolResult:
        await asyncio.sleep(0)
        if self.raises:
            raise RuntimeError(self.output)
        return ToolResult(self.output, ok=True, latency_s=0.0)

    async def aclose(self) -> None:
        pass


PROBLEM = Problem("p0", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")
SEGMENTS = ["<think>compute</think> <code>print(6 * 7)</code>", "<answer>42</answer>"]


class FirstHeaderLM(ScriptedLM):
    """The script model, reading the response from the first assistant header (the prompt's): a tool
    output that prints the header as text must not restart the script."""

    def _next_token(self, context: list[int]) -> int:
        text = self.tok.decode(context)
        first = text.find(self.header)
        if first < 0:
            return self.tok.eos_token_id
        response = text[first + len(self.header):]
        k = response.count(self.output_open)
        emitted = response[response.rfind(self.output_close) + len(self.output_close):] if k else response
        if k >= len(self.segments):
            return self.tok.eos_token_id
        seg = self.segments[k]
        for j in range(len(seg) + 1):
            if self.tok.decode(seg[:j]) == emitted:
                return seg[j] if j < len(seg) else self.tok.eos_token_id
        raise AssertionError(f"context diverged from the script: {emitted!r}")


def run_one(tok, tool: Echo, **cfg):
    config = RolloutConfig(**{"max_policy_tokens": 200, "max_total_tokens": 4000, "max_tool_output_chars": 4000,
                              **cfg})
    with RolloutEngine(FirstHeaderLM(tok, SEGMENTS), tok, {"code": tool}, config, seed=0) as engine:
        return engine.rollout([PROBLEM], 1).groups[0].trajectories[0]


@pytest.mark.parametrize("raises", [False, True], ids=["output", "error-message"])
def test_a_tool_printing_every_special_token_keeps_a_correct_trajectory_correct(tok, raises: bool) -> None:
    hostile = "42 " + " ".join(special_strings(tok) + role_markers(tok)) + " 42"
    traj = run_one(tok, Echo(hostile, raises=raises))
    (call,) = traj.tool_calls
    o0, o1 = call.output_span
    assert not set(traj.response_ids[o0:o1]) & special_token_ids(tok)  # no turn boundary inside the mask-0 span
    assert call.result.output.strip() in traj.text
    reward = score_trajectory(PROBLEM, traj, RewardConfig(), protocol=protocol_for("tapo"), max_policy_tokens=200)
    assert reward.format_ok and reward.accuracy == 1.0, reward


def test_a_tool_call_ending_exactly_at_the_policy_budget_samples_no_extra_token(tok) -> None:
    budget = len(tok(SEGMENTS[0], add_special_tokens=False)["input_ids"])
    tool = Echo("42")
    traj = run_one(tok, tool, max_policy_tokens=budget)
    assert traj.policy_token_count == budget
    assert traj.finish_reason == "max_tokens"
    assert traj.tool_calls == ()  # nothing could read its output: the call is not run


@pytest.mark.parametrize("slack", [1, 3])
def test_a_call_inside_the_budget_is_answered(tok, slack: int) -> None:
    budget = len(tok(SEGMENTS[0], add_special_tokens=False)["input_ids"]) + slack
    traj = run_one(tok, Echo("42"), max_policy_tokens=budget)
    assert traj.policy_token_count == budget and len(traj.tool_calls) == 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), head=st.text(max_size=8))
def test_a_question_that_quotes_a_special_token_cannot_open_or_close_a_turn(tok, data, head: str) -> None:
    """The prompt holds text the policy did not sample too: the question's special tokens stay plain text,
    and the template's own markers keep their ids."""
    from pipeline.rollout.engine import encode_prompt

    marker = data.draw(st.sampled_from(special_strings(tok) + role_markers(tok)))
    protocol = protocol_for("tapo")
    hostile = Problem("q", f"What is 6 * 7?{head}{marker}", ("42",), "calculator", "calculator", "train")
    plain = Problem("q", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")
    ids = encode_prompt(tok, protocol, hostile, ("code",))
    template_ids = encode_prompt(tok, protocol, plain, ("code",))
    specials = special_token_ids(tok)
    assert [i for i in ids if i in specials] == [i for i in template_ids if i in specials]
    assert tok.decode(ids, skip_special_tokens=True) == tok.decode(template_ids, skip_special_tokens=True).replace(
        "What is 6 * 7?", hostile.question)


def test_an_ordinary_prompt_keeps_the_templates_own_ids(tok) -> None:
    from pipeline.rollout.engine import encode_prompt

    ids = encode_prompt(tok, protocol_for("tapo"), PROBLEM, ("code",))
    messages = protocol_for("tapo").messages(PROBLEM, ("code",))
    direct = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    assert ids == list(direct["input_ids"] if hasattr(direct, "keys") else direct)
