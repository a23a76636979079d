"""Each model family's parser reads back every call it writes, in order, and names what it cannot read; the
chat-tools protocol reads turns, answers and its format grammar through it."""

from __future__ import annotations

import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols import OUTPUT_MARK, protocol_for
from pipeline.protocols.tool_parsers import PARSERS

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=6)
arguments = st.dictionaries(st.text(max_size=10), values, max_size=4)
MARKERS = ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "{", OUTPUT_MARK)
thoughts = st.text(max_size=40).filter(lambda t: not any(m in t for m in MARKERS))


def test_the_parsers_are_the_configs_choices() -> None:
    assert set(PARSERS) == set(typing.get_args(ChatToolsConfig.model_fields["parser"].annotation))


@pytest.mark.parametrize("family", sorted(PARSERS))
@settings(max_examples=150, deadline=None)
@given(calls=st.lists(st.tuples(names, arguments), min_size=1, max_size=4), thought=thoughts)
def test_what_a_parser_writes_it_reads_back_in_order(family: str, calls: list, thought: str) -> None:
    parser = PARSERS[family]
    read = parser.parse(parser.render(calls, thought))
    assert [(c.name, c.arguments, c.error) for c in read] == [(n, a, None) for n, a in calls]


@pytest.mark.parametrize("family", sorted(PARSERS))
@given(text=thoughts)
def test_prose_is_no_call(family: str, text: str) -> None:
    assert PARSERS[family].parse(text) == ()


@pytest.mark.parametrize(("family", "text", "error"), [
    ("hermes", '<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>', "not valid JSON"),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "needs a \"name\""),
    ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}, "id": 3}</tool_call>', "unexpected key(s) ['id']"),
    ("hermes", '<tool_call>{"name": "f", "arguments": {}}', "not closed"),
    ("hermes", 'x</tool_call>', "without a <tool_call>"),
    ("hermes", '<tool_call>["f"]</tool_call>', "must be a JSON object, got list"),
    ("llama3", '{"name": "f", "parameters": {"x": 1}', "not valid JSON"),
    ("llama3", '{"name": "f", "parameters": {}} and then prose', "not valid JSON"),
    ("llama3", "<|python_tag|>print(1)", "must be followed by a JSON call"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}', "not valid JSON"),
    ("mistral", "[TOOL_CALLS] []", "non-empty JSON list"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {}}] more', "text after"),
])
def test_a_call_that_cannot_be_read_says_why(family: str, text: str, error: str) -> None:
    read = PARSERS[family].parse(text)
    assert read and read[-1].error is not None and error in read[-1].error, read


def test_llama3_takes_arguments_for_parameters_and_several_calls() -> None:
    read = PARSERS["llama3"].parse('<|python_tag|>{"name": "f", "arguments": {"x": 1}}; {"name": "g", "parameters": {}}')
    assert [(c.name, c.arguments) for c in read] == [("f", {"x": 1}), ("g", {})]


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_the_protocol_reads_turns_answers_and_grammar_through_the_parser(family: str) -> None:
    protocol = protocol_for("chat-tools", ChatToolsConfig(parser=family))
    call = protocol.render_call("code", "print(6 * 7)", "Let me compute.")
    end = protocol.read_segment(call, ("code",), at_eos=True)
    assert [(c.tool, c.input, c.error) for c in end.calls] == [("code", '{"code": "print(6 * 7)"}', None)]
    assert protocol.read_segment(call, ("code",)).calls == ()  # mid-turn: nothing to read
    assert protocol.read_segment(call, ("search",), at_eos=True).calls[0].error.startswith("unknown tool 'code'")
    answer = protocol.render_answer("42")
    assert protocol.read_segment(answer, ("code",), at_eos=True).answered
    text = OUTPUT_MARK.join([call, answer])
    assert protocol.grammar_violation(text, strict=True, eos_strings=()) is None
    assert protocol.extract_answer(text) == "42"
    assert protocol.grammar_violation(OUTPUT_MARK.join([answer, answer]), strict=True, eos_strings=()) is not None
    assert "instead of answering" in protocol.grammar_violation(call, strict=True, eos_strings=())
    assert protocol.extract_answer(call) is None


def test_an_answer_tool_answers_and_must_be_the_last_turn_alone() -> None:
    protocol = protocol_for("chat-tools", ChatToolsConfig(answer_tool="final_answer"))
    answer = protocol.render_answer("Canberra")
    assert protocol.read_segment(answer, ("search",), at_eos=True).answered
    assert protocol.extract_answer(answer) == "Canberra"
    assert protocol.grammar_violation(answer, strict=True, eos_strings=()) is None
    assert "not one call of the answer tool" in protocol.grammar_violation("Canberra", strict=True, eos_strings=())
    early = OUTPUT_MARK.join([answer, answer])
    assert "before the last turn" in protocol.grammar_violation(early, strict=True, eos_strings=())
    assert protocol.answer_spec.parameters["required"] == ["answer"]
