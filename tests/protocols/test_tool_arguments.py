"""A tool's argument schema is compiled at start-up and a call's arguments are checked totally, at a cost the
policy does not control (issue 56, point 4; `pipeline.protocols.arguments`).

Schemas that cannot be used are refused when the renderer binds (before anything samples), naming the tool and
its origin, one class each: invalid, unresolvable / remote / self / recursive references, regexes outside RE2,
too deep, exponentially expanding, unsupported keywords. Arguments, for any JSON value (depth, surrogates,
repetition), give an accepted value or a typed refusal, never an exception; the ReDoS pattern of the red-team
round costs microseconds (a CPU-time alarm fails the test instead of waiting out a backtracking engine).
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols import ParsedCall, protocol_for
from pipeline.protocols.arguments import (MAX_ARGUMENT_DEPTH, MAX_SCHEMA_NODES, ToolSchemaError, compile_arguments,
                                          json_depth)
from pipeline.types import BUILTIN_SPECS, ToolSpec
from tests.protocols.chat_helpers import smollm2_tokenizer

ORIGIN = "MCP server 'files'"


def spec(parameters: dict, name: str = "read_file") -> ToolSpec:
    return ToolSpec(name, "Read a file.", parameters, origin=ORIGIN)


def obj(**properties) -> dict:
    return {"type": "object", "properties": properties}


def diamond(levels: int) -> dict:
    """Each definition refers to the next twice: 2**levels subschemas once expanded."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(levels)}
    defs[f"d{levels}"] = {"type": "string"}
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = obj(a=schema)
    return schema


REFUSED = {
    "invalid schema": ({"type": "objekt"}, "not a valid JSON schema"),
    "invalid regex": (obj(p={"type": "string", "pattern": "(["}), "not RE2 syntax"),
    "unresolvable $ref": (obj(p={"$ref": "#/$defs/missing"}), "does not resolve"),
    "remote $ref": (obj(p={"$ref": "http://127.0.0.1:9/schema.json"}), "not a local JSON pointer"),
    "anchor $ref": (obj(p={"$ref": "#anchor"}), "not a local JSON pointer"),
    "self $ref": ({"type": "object", "$ref": "#"}, "cycle"),
    "recursive $ref": (obj(children={"type": "array", "items": {"$ref": "#"}}), "cycle"),
    "mutual $ref": ({"type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                     "properties": {"x": {"$ref": "#/$defs/a"}}}, "cycle"),
    "look-around regex": (obj(p={"type": "string", "pattern": "^(?=a)a+$"}), "not RE2 syntax"),
    "back-reference regex": (obj(p={"type": "string", "pattern": r"^(a)\1$"}), "not RE2 syntax"),
    "look-around property regex": ({"type": "object", "patternProperties": {"(?!x)": {}}}, "not RE2 syntax"),
    "too deep": (nested(40), "deeper than"),
    "too deep as JSON": (nested(200), "deeper than"),
    "exponential expansion": (diamond(14), f"more than {MAX_SCHEMA_NODES}"),
    "$dynamicRef": (obj(p={"$dynamicRef": "#meta"}), "$dynamicRef is not supported"),
    "nested $id": (obj(p={"$id": "https://example.com/p", "type": "string"}), "$id inside"),
    "unevaluated with pattern properties": ({"type": "object", "patternProperties": {"^a": {}},
                                             "unevaluatedProperties": False}, "unevaluatedProperties"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_schema_that_cannot_be_compiled_is_refused_naming_its_origin_and_tool(case: str) -> None:
    schema, why = REFUSED[case]
    with pytest.raises(ToolSchemaError) as refused:
        compile_arguments(spec(schema))
    message = str(refused.value)
    assert message.startswith(f"{ORIGIN}: tool 'read_file': ") and why in message, message


@pytest.mark.parametrize("case", ["unresolvable $ref", "self $ref", "look-around regex", "exponential expansion"])
def test_the_renderer_refuses_it_at_start_up(case: str) -> None:
    tok = smollm2_tokenizer()
    specs = {**BUILTIN_SPECS, "read_file": spec(REFUSED[case][0])}
    with pytest.raises(ToolSchemaError, match=f"^{ORIGIN}: tool 'read_file'"):
        protocol_for("chat-tools", ChatToolsConfig(template="hermes")).bind(tok, specs, frozenset({tok.eos_token_id}))


def test_a_users_tool_without_origin_is_named_by_its_config_section() -> None:
    with pytest.raises(ToolSchemaError, match=r"^rollout.tools: tool 'lookup'"):
        compile_arguments(ToolSpec("lookup", "d", {"type": "object", "$ref": "#"}))


def test_usable_schemas_compile_local_references_diamonds_and_re2_patterns() -> None:
    compile_arguments(spec(diamond(6)))
    compile_arguments(spec(nested(20)))
    schema = compile_arguments(spec({"type": "object", "$defs": {"word": {"type": "string", "pattern": r"^\p{L}+$"}},
                                     "properties": {"w": {"$ref": "#/$defs/word"}}}))
    assert schema.check({"w": "héllo"})[1] is None and "does not match" in schema.check({"w": "h3llo"})[1]


class CpuAlarm(Exception):
    pass


@pytest.fixture
def cpu_limit():
    """Raise CpuAlarm once the process has used `seconds` more CPU (not wall time: a busy machine passes)."""
    def handler(signum, frame):
        raise CpuAlarm

    previous = signal.signal(signal.SIGPROF, handler)

    def arm(seconds: float) -> None:
        signal.setitimer(signal.ITIMER_PROF, seconds)
    yield arm
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.signal(signal.SIGPROF, previous)


@pytest.mark.parametrize("where", ["pattern", "patternProperties", "additionalProperties"])
def test_a_catastrophic_pattern_costs_the_policy_nothing(where: str, cpu_limit) -> None:
    """^(a+)+$ against 27 a's and a '!' took 3.2 s with jsonschema's backtracking matching; 10,000 a's are
    matched here in linear time, as a value and as a property name."""
    evil, text = "^(a+)+$", "a" * 10_000 + "!"
    schema = {"pattern": obj(x={"type": "string", "pattern": evil}),
              "patternProperties": {"type": "object", "patternProperties": {evil: {"type": "integer"}}},
              "additionalProperties": {"type": "object", "patternProperties": {evil: {}},
                                       "additionalProperties": False}}[where]
    arguments = {"x": text} if where == "pattern" else {text: "v"}
    checker = compile_arguments(spec(schema))
    cpu_limit(2.0)
    start = time.process_time()
    _, error = checker.check(arguments)
    used = time.process_time() - start
    assert used < 2.0 and (error is None) == (where == "patternProperties")


def json_values(max_leaves: int = 30):
    leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(alphabet=st.characters(), max_size=20),  # surrogates included
                       st.sampled_from(["\ud83d", "a\udc00b", "\x00", "<|im_end|>"]))
    return st.recursive(leaves, lambda c: st.one_of(st.lists(c, max_size=4),
                                                      st.dictionaries(st.text(max_size=6), c, max_size=4)),
                        max_leaves=max_leaves)


RICH = {"type": "object", "properties": {
    "word": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 20},
    "items": {"type": "array", "uniqueItems": True, "items": {"anyOf": [{"type": "integer"}, {"type": "object"}]}},
    "pick": {"enum": ["a", 1, [1, 2], {"k": None}]}},
    "patternProperties": {"^x_": {"type": "number"}}, "additionalProperties": {"type": "string"}}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=json_values())
def test_checking_any_arguments_gives_a_value_or_a_refusal_never_an_exception(arguments) -> None:
    valid, error = compile_arguments(spec(RICH)).check(arguments)
    assert error is None or isinstance(error, str)
    json.dumps(valid, ensure_ascii=False).encode("utf-8")  # what reaches the tool is valid Unicode


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 990, 100_000])
def test_arguments_nested_past_the_bound_are_refused_without_recursing(depth: int) -> None:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    _, error = compile_arguments(spec(RICH)).check({"items": value})
    assert error == f"the arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels"
    assert json_depth(value, 10) == 11  # the measure stops at the bound


def test_unique_items_is_linear_and_compares_as_json_schema_does(cpu_limit) -> None:
    checker = compile_arguments(spec(obj(items={"type": "array", "uniqueItems": True})))
    assert "non-unique" in checker.check({"items": [1, 1.0]})[1]
    assert checker.check({"items": [1, True, {"a": [1]}, {"a": [True]}]})[1] is None
    cpu_limit(2.0)
    assert checker.check({"items": [{"k": i} for i in range(50_000)]})[1] is None  # pairwise: 10**9 comparisons


def test_a_lone_surrogate_in_the_arguments_reaches_the_tool_as_a_replacement_character() -> None:
    tok = smollm2_tokenizer()
    renderer = protocol_for("chat-tools", ChatToolsConfig(template="hermes")).bind(
        tok, {**BUILTIN_SPECS, "read_file": spec(obj(path={"type": "string"}))}, frozenset({tok.eos_token_id}))
    code = renderer._checked(ParsedCall("code", json.dumps({"code": "print('\ud83d')"})))
    assert code.error is None and code.input == "print('\ufffd')"
    read = renderer._checked(ParsedCall("read_file", '{"path": "a\\ud83d"}'))
    assert read.error is None and json.loads(read.input) == {"path": "a\ufffd"}
    refused = renderer._checked(ParsedCall("read_file", "[" * 5000 + "]" * 5000))
    assert refused.error is not None  # unreadable or refused: a typed refusal either way
