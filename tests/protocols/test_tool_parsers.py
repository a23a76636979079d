"""Each model family's parser reads back every call it writes, in order, and names what it cannot read; the
chat-tools protocol reads turns, answers and its format grammar through it."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols import OUTPUT_MARK, protocol_for
from pipeline.protocols.reading import MAX_JSON_DEPTH
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
@example(calls=[("A", {m: m}) for m in MARKERS], thought="")  # every family's delimiters inside the arguments
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


# --- hostile calls: every family reads any turn to a value or a typed refusal, never an exception ---------------

def _call(family: str, arguments_json: str) -> str:
    """A turn of `family` that calls `f` with `arguments_json` written as is (any text, valid JSON or not)."""
    key = PARSERS[family].arguments_key
    body = f'{{"name": "f", "{key}": {arguments_json}}}'
    return {"hermes": f"<tool_call>{body}</tool_call>", "llama3": body, "mistral": f"[TOOL_CALLS] [{body}]"}[family]


def _nested(depth: int, opener: str) -> str:
    """A JSON value `depth` levels deep, of lists, objects or both."""
    if opener == "[":
        return "[" * depth + "]" * depth
    if opener == "{":
        return '{"a": ' * depth + "1" + "}" * depth
    return '[{"a": ' * (depth // 2) + "1" + "}]" * (depth // 2)


@pytest.mark.parametrize("family", sorted(PARSERS))
@pytest.mark.parametrize("opener", ["[", "{", "[{"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH, 990, 5_000, 100_000])
def test_deep_nesting_is_refused_at_any_depth(family: str, opener: str, depth: int) -> None:
    """A call nested ~990 levels deep raised RecursionError out of every parser (and the rollout with it)."""
    (call,) = PARSERS[family].parse(_call(family, _nested(depth, opener)))
    assert call.error is not None and "nested too deeply" in call.error, call.error


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_deep_nesting_within_the_bound_is_read(family: str) -> None:
    depth = MAX_JSON_DEPTH - 3  # the call object (and mistral's list) count
    (call,) = PARSERS[family].parse(_call(family, '{"x": ' + _nested(depth - 1, "[") + "}"))
    assert call.error is None and call.name == "f"


def test_deep_nesting_deeper_than_the_stack_is_refused_by_the_protocol() -> None:
    """Read through chat-tools, as the rollout and the scorer do: a refusal answered as malformed."""
    for family in sorted(PARSERS):
        protocol = protocol_for("chat-tools", ChatToolsConfig(parser=family))
        turn = _call(family, _nested(50_000, "["))
        (call,) = protocol.read_segment(turn, ("code",), at_eos=True).calls
        assert call.error is not None and "nested too deeply" in call.error and call.status == "malformed"
        assert "nested too deeply" in protocol.grammar_violation(OUTPUT_MARK.join([turn, "42"]), strict=True,
                                                                 eos_strings=())
        assert protocol.extract_answer(turn) is None


SURROGATE_PLACES = ['{"x": "\\ud83d"}', '{"\\udc00": 1}', '{"x": ["a", {"y": "b\\ud800c"}]}', '{"x": "\ud83d"}',
                    '{"x": "\\ude00\\ud83d"}']


@pytest.mark.parametrize("family", sorted(PARSERS))
@pytest.mark.parametrize("arguments", SURROGATE_PLACES)
def test_lone_surrogate_anywhere_in_the_arguments_is_refused(family: str, arguments: str) -> None:
    """A lone surrogate reached the tool, and through its echo the tokenizer, which raised."""
    (call,) = PARSERS[family].parse(_call(family, arguments))
    assert call.arguments is None and call.error is not None and "lone surrogate" in call.error, call


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_lone_surrogate_in_the_name_is_refused_and_a_pair_is_read(family: str) -> None:
    parser = PARSERS[family]
    key = parser.arguments_key
    named = {"hermes": '<tool_call>{{"name": "f\\udfff", "{k}": {{}}}}</tool_call>', "llama3": '{{"name": "f\\udfff", '
             '"{k}": {{}}}}', "mistral": '[TOOL_CALLS] [{{"name": "f\\udfff", "{k}": {{}}}}]'}[family].format(k=key)
    assert "lone surrogate" in parser.parse(named)[0].error
    (paired,) = parser.parse(_call(family, '{"x": "\\ud83d\\ude00"}'))  # a pair is one character: read
    assert paired.error is None and paired.arguments == {"x": "\U0001f600"}


def _with_surrogate(value: Any, target: int, surrogate: str) -> tuple[Any, int]:
    """`value` with `surrogate` put into its `target`-th string (keys included, in order), and how many strings
    came before (the target is reached when that count passes it)."""
    if isinstance(value, str):
        return (value + surrogate if target == 0 else value), 1
    seen, out = 0, None
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            new_key, n = _with_surrogate(key, target - seen, surrogate)
            seen += n
            new_item, n = _with_surrogate(item, target - seen, surrogate)
            seen += n
            out[new_key] = new_item
        return out, seen
    if isinstance(value, list):
        out = []
        for item in value:
            new_item, n = _with_surrogate(item, target - seen, surrogate)
            seen += n
            out.append(new_item)
        return out, seen
    return value, 0


@settings(max_examples=200, deadline=None)
@given(arguments=arguments, family=st.sampled_from(sorted(PARSERS)), target=st.integers(0, 12),
       surrogate=st.integers(0xD800, 0xDFFF), escaped=st.booleans())
def test_lone_surrogate_property_no_invalid_unicode_reaches_a_tool(arguments: dict, family: str, target: int,
                                                                   surrogate: int, escaped: bool) -> None:
    """Whatever the arguments, a lone surrogate put into any of their strings (a key or a value, at any depth,
    escaped as JSON writes it or raw) gets the call refused; without one the call is read."""
    hostile, strings = _with_surrogate(arguments, target, chr(surrogate))
    (call,) = PARSERS[family].parse(_call(family, json.dumps(hostile, ensure_ascii=escaped)))
    if target < strings:
        assert call.arguments is None and "lone surrogate" in call.error, call
    else:
        assert call.error is None and call.arguments == arguments
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("family", sorted(PARSERS))
@pytest.mark.parametrize(("value", "why"), [("NaN", "NaN"), ("-Infinity", "Infinity"), ("1e999", "too large"),
                                            ("1" * 5000, "not valid JSON")])
def test_json_numbers_no_writer_writes_back_are_refused(family: str, value: str, why: str) -> None:
    """`NaN` and `1e999` decoded to floats `json.dumps` writes as invalid JSON; 5,000 digits raised ValueError."""
    (call,) = PARSERS[family].parse(_call(family, f'{{"x": {value}}}'))
    assert call.error is not None and why in call.error, call.error


HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", '{"name": "f", "arguments": {}}', "x", "\n",
                                 "<tool_call", "tool_call>", "</"]), max_size=14))
def test_unclosed_tags_hermes_blocks_are_those_the_lazy_pattern_finds(pieces: list[str]) -> None:
    """The linear reading of `<tool_call>` blocks finds what `<tool_call>(.*?)</tool_call>` found (it scanned to the
    end from every unclosed opener: quadratic), and names an unclosed or a stray tag as before."""
    text = "".join(pieces)
    read = PARSERS["hermes"].parse(text)
    blocks = HERMES_BLOCK.findall(text)
    assert [c.source for c in read[:len(blocks)]] == [b.strip() for b in blocks]
    tail = HERMES_BLOCK.sub("", text)
    extra = read[len(blocks):]
    if "<tool_call>" in tail:
        assert [c.error for c in extra] == ["a <tool_call> block is not closed with </tool_call>"]
    elif "</tool_call>" in tail:
        assert [c.error for c in extra] == ["</tool_call> without a <tool_call>"]
    else:
        assert extra == ()


@pytest.mark.parametrize("family", sorted(PARSERS))
def test_lone_surrogate_is_never_written_into_a_turn(family: str) -> None:
    """What a parser writes is text a tokenizer can encode: a lone surrogate is escaped, and read back refused."""
    parser = PARSERS[family]
    turn = parser.render([("search", {"query": "q\ud83d"})], "thought")
    turn.encode("utf-8")
    (call,) = parser.parse(turn)
    assert call.error is not None and "lone surrogate" in call.error
    assert "é" in parser.render([("search", {"query": "é"})], "")  # valid text is written as itself
