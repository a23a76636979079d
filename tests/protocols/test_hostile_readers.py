"""Every reader of text the policy writes or a tool returns is a total function of bounded cost.

A third red-team round crashed the rollout through its readers: a call nested ~990 levels deep raised
RecursionError out of the call parsers and `extract_answer`, a lone surrogate in call arguments reached the tools
and the tokenizer, and two readers were quadratic. Here generated hostile strings (deep nesting of `[ { ( \\boxed{`
and `<tool_call>`, lone surrogates, NUL, unclosed tags, repeated tag pairs, huge numbers, and random mixtures of
all of them) go to every reader, for every protocol: the call parsers of each model family, each protocol's
`read_segment`, `extract_answer` and format grammar, the format check with the engine's outputs to find, the
scorer of a whole trajectory, the verifiers and the engine's cut of a tool output. Each call must return a value
of its type (a refusal is a value: a malformed call, a format violation, no answer), within a CPU-time and a
memory bound, and what a call reader hands a tool must be text a UTF-8 writer can write.

The readers run in a child process, each call under a CPU-time timer of its own (not wall time, so a busy machine
does not fail it) and with `tracemalloc` measuring its peak. The math kind's symbolic check runs in its own worker
processes under their own CPU and memory limits (`reward.symbolic`); its in-process part (`fast_math_equal`) runs
here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config.tools import ChatToolsConfig
from pipeline.protocols import PROTOCOLS, SegmentEnd, protocol_for
from pipeline.protocols.reading import MAX_JSON_DEPTH
from pipeline.protocols.tool_parsers import PARSERS, RawCall

pytestmark = pytest.mark.integration  # generated hostile strings to every reader: half a minute

SIZE = 12_000  # characters of each hostile string: nesting far past Python's recursion limit
CALL_LIMIT_S = 2.0  # CPU seconds for one reader on one string (linear readers need milliseconds)
MEMORY_LIMIT = 64 * 2**20 + 400 * SIZE  # bytes one call may hold at its peak

# the pieces hostile strings are made of (the random mixtures draw from these)
PIECES = ["[", "]", "{", "}", "(", ")", '{"a": ', '"', "\\", "\\boxed{", "<tool_call>", "</tool_call>", "<answer>",
          "</answer>", "<think>", "</think>", "<code>", "</code>", "<search>", "</search>", "<response>", "</response>",
          "<information>", "```python\n", "```\n", "```output\n", "[TOOL_CALLS] ", "<|python_tag|>", "\ud83d", "\ude00",
          "\udc80", "\x00", "9", "1e999", "NaN", ",", ":", " or ", " eller ", "x", "\n", "\\\\", '"\\ud83d"']

CHILD = textwrap.dedent("""
    import json, math, random, resource, signal, sys, tracemalloc
    from pipeline.config.reward import RewardConfig
    from pipeline.config.tools import ChatToolsConfig
    from pipeline.protocols import PROTOCOLS, SegmentEnd, protocol_for
    from pipeline.protocols.tool_parsers import PARSERS
    from pipeline.reward import RewardScorer, Verifier, check_format, hedging, verifiers
    from pipeline.reward.format import FormatResult
    from pipeline.tools.shown import cut_middle
    from pipeline.types import Problem, RewardBreakdown, ToolCall, ToolResult, Trajectory

    pieces, size, limit_s, limit_bytes, mixtures = json.loads(sys.argv[1])
    families = sorted(PARSERS)

    def deep_call(family, inner):
        key = PARSERS[family].arguments_key
        body = '{"name": "f", "%s": {"x": %s}}' % (key, inner)
        return {"hermes": "<tool_call>" + body + "</tool_call>", "llama3": body, "mistral": "[TOOL_CALLS] [" + body + "]"}[family]

    def times(piece, n=size):
        return piece * max(1, n // len(piece))

    hostile = {
        "deep [": times("["), "deep {": times("{"), "deep [ ]": times("[", size // 2) + times("]", size // 2),
        "deep objects": times('{"a": ', size // 2) + "1" + times("}", size // 12),
        "deep ( )": times("(", size // 2) + "1" + times(")", size // 2), "deep boxes": times("\\\\boxed{", size // 2) + "1" + times("}", size // 16),
        "deep answer": "<answer>" + times("(", size // 2) + "1" + times(")", size // 2) + "</answer>",
        "unclosed <tool_call>": times("<tool_call>"), "stray </tool_call>": times("</tool_call>"),
        "unclosed <answer>": times("<answer>"), "unclosed <think>": times("<think>"), "unclosed <code>": times("<code>"),
        "unclosed <response>": times("<response>"), "unclosed fences": times("```python\\n"),
        "repeated <response>x</response>": times("<response>x</response>"),
        "repeated <answer>1</answer>": times("<answer>1</answer>"),
        "repeated calls": times('<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
        "repeated fenced calls": times("```python\\nx\\n```\\n```output\\nx\\n```\\n"),
        "lone surrogates": times("\\ud83d"), "split pairs": times("\\ude00\\ud83d"),
        "surrogate answer": "<answer>\\udc80</answer>\\\\boxed{\\ud83d}", "NUL": times("\\x00"),
        "NUL answer": "<answer>\\x00</answer>", "digits": times("9"), "spaces": times(" "),
    }
    for family in families:
        hostile[f"deep call ({family})"] = deep_call(family, times("[", size // 2) + times("]", size // 2))
        hostile[f"deep unclosed call ({family})"] = deep_call(family, times("{", size))
        hostile[f"surrogate call ({family})"] = deep_call(family, '"\\\\ud83d"')
        hostile[f"raw surrogate call ({family})"] = deep_call(family, '"\\ud83d"')
        hostile[f"huge number call ({family})"] = deep_call(family, "9" * 5000)
        hostile[f"NaN call ({family})"] = deep_call(family, "NaN")
    rng = random.Random(56)
    for k in range(mixtures):
        hostile[f"mixture {k}"] = "".join(rng.choice(pieces) for _ in range(size // 4))[:size]

    protocols = dict(PROTOCOLS)
    for family in families:
        protocols[f"chat-tools ({family})"] = protocol_for("chat-tools", ChatToolsConfig(parser=family))
    config = RewardConfig()
    scorer = RewardScorer(config)
    verifier = Verifier(config)

    def trajectory(s):
        call = ToolCall("code", "c", ToolResult(s, True), (0, 1), (1, 2))
        return Trajectory("p", (1,), (2, 3), (1, 0), (0.0, 0.0), (call,), "stop", s, 2, segments=(s, s))

    def valid(text):
        text.encode("utf-8")  # raises on a lone surrogate
        return True

    def calls_are_valid(calls):
        return all(c.error is not None or (valid(c.name) and valid(json.dumps(c.arguments, ensure_ascii=False)))
                   for c in calls)

    def segment_is_valid(end):
        return isinstance(end, SegmentEnd) and all(c.error is not None or valid(c.input) for c in end.calls)

    def optional_text(value):
        return value is None or isinstance(value, str)

    readers = {"cut_middle": lambda s: (lambda shown: valid(shown) and "\\x00" not in shown)(cut_middle(s, 1024)),
               "is_hedged": lambda s: all(isinstance(hedging.is_hedged(s, "1", k), bool) for k in verifiers.VERIFIER_KINDS),
               "fast_math_equal": lambda s: verifiers.fast_math_equal(s, "1") in (True, False, None)}
    for kind in verifiers.VERIFIER_KINDS:
        if kind != "math":
            readers[f"verify ({kind})"] = lambda s, k=kind: 0.0 <= verifier.score(k, s, "1") <= 1.0
    for family in families:
        readers[f"parse ({family})"] = lambda s, f=family: calls_are_valid(PARSERS[f].parse(s))
    for name, protocol in protocols.items():
        readers[f"read_segment ({name})"] = lambda s, p=protocol: all(
            segment_is_valid(p.read_segment(s, ("code", "search"), at_eos=e)) for e in (False, True))
        readers[f"extract_answer ({name})"] = lambda s, p=protocol: optional_text(p.extract_answer(s))
        readers[f"grammar_violation ({name})"] = lambda s, p=protocol: all(
            optional_text(p.grammar_violation(s, strict=strict, eos_strings=("<|im_end|>",))) for strict in (True, False))
        for kind_type in ("complex", "fact"):
            problem = Problem("p", "q", ("1",), kind_type, "s", "train")
            readers[f"score ({name}, {kind_type})"] = lambda s, p=protocol, pr=problem: (
                lambda b: isinstance(b, RewardBreakdown) and math.isfinite(b.total))(
                scorer.score(pr, trajectory(s), protocol=p, max_policy_tokens=100))
        if name in PROTOCOLS:
            readers[f"check_format ({name})"] = lambda s, p=protocol: all(
                isinstance(check_format(s, p, found), FormatResult) for found in ([], [s[:100]], [s]))

    class TooSlow(Exception):
        pass

    def too_slow(*_):
        raise TooSlow

    signal.signal(signal.SIGPROF, too_slow)
    tracemalloc.start()
    failures = []
    for label, text in hostile.items():
        for name, read in readers.items():
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            signal.setitimer(signal.ITIMER_PROF, limit_s)  # this process's CPU time only
            try:
                ok = read(text)
            except TooSlow:
                failures.append(f"{name} on {label}: over {limit_s} s of CPU")
                continue
            except BaseException as error:  # noqa: BLE001 - what the test is about
                failures.append(f"{name} on {label}: {type(error).__name__}: {str(error)[:200]}")
                continue
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            peak = tracemalloc.get_traced_memory()[1] - before
            if not ok:
                failures.append(f"{name} on {label}: a value of the wrong type or invalid text")
            if peak > limit_bytes:
                failures.append(f"{name} on {label}: {peak / 2**20:.0f} MiB at its peak")
    print(json.dumps(failures, ensure_ascii=True))
""")


def test_every_reader_is_total_bounded_and_valid_on_hostile_strings(repo_root: Path) -> None:
    """The matrix: every hostile class (and random mixtures of their pieces) x every reader x every protocol."""
    child = subprocess.run([sys.executable, "-c", CHILD,
                            json.dumps([PIECES, SIZE, CALL_LIMIT_S, MEMORY_LIMIT, 24])],
                           cwd=repo_root, env=dict(os.environ, PYTHONPATH=str(repo_root)), capture_output=True,
                           text=True, timeout=1800)
    assert child.returncode == 0, child.stderr[-3000:]
    failures = json.loads(child.stdout.strip().splitlines()[-1])
    assert failures == [], f"{len(failures)} failures, the first: {failures[:20]}"


# --- the same property in process, on small generated strings, for shrinking to a minimal case -----------------

CHAT = [protocol_for("chat-tools", ChatToolsConfig(parser=family)) for family in sorted(PARSERS)]
# a call of every protocol around hostile content
CALL_SHAPES = [("<code>", "</code>"), ("<search>", "</search>"), ("```python\n", "\n```\n"),
               ('<tool_call>{"name": "code", "arguments": {"code": "', '"}}</tool_call>'),
               ('{"name": "code", "parameters": {"code": "', '"}}'),
               ('[TOOL_CALLS] [{"name": "code", "arguments": {"code": "', '"}}]')]
pieces = st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=30).map("".join)
calls = st.builds(lambda shape, inner: shape[0] + inner + shape[1], st.sampled_from(CALL_SHAPES), pieces)
hostile_strings = st.lists(pieces | calls, min_size=1, max_size=3).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=hostile_strings)
def test_any_string_is_read_to_a_value_by_every_protocol(text: str) -> None:
    for protocol in [*PROTOCOLS.values(), *CHAT]:
        for at_eos in (False, True):
            end = protocol.read_segment(text, ("code", "search"), at_eos=at_eos)
            assert isinstance(end, SegmentEnd)
            assert all(c.error is not None or c.input.encode("utf-8") for c in end.calls)
        assert protocol.extract_answer(text) is None or isinstance(protocol.extract_answer(text), str)
        violation = protocol.grammar_violation(text, strict=True, eos_strings=())
        assert violation is None or isinstance(violation, str)


@pytest.mark.parametrize("family", sorted(PARSERS))
@settings(max_examples=300, deadline=None)
@given(text=hostile_strings)
def test_any_string_is_parsed_to_calls_or_refusals(family: str, text: str) -> None:
    calls = PARSERS[family].parse(text)
    assert all(isinstance(c, RawCall) for c in calls)
    for call in calls:
        if call.error is None:  # what a tool would receive
            assert isinstance(call.name, str) and isinstance(call.arguments, dict)
            json.dumps([call.name, call.arguments], ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("family", sorted(PARSERS))
@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 30_000), opener=st.sampled_from(["[", '{"a": ', '[{"a": ']), closed=st.booleans())
def test_deep_nesting_of_any_depth_is_a_value(family: str, depth: int, opener: str, closed: bool) -> None:
    """Read up to the bound, refused past it, whatever the depth (the stack never sees it)."""
    closer = "".join({"[": "]", "{": "}"}[ch] for ch in reversed(opener) if ch in "[{")
    inner = opener * depth + ("1" if opener.endswith(" ") else "") + (closer * depth if closed else "")
    (call,) = PARSERS[family].parse(deep_call_text(family, inner))
    levels = depth * len(closer) + 2 + (family == "mistral")  # the call object and its arguments, mistral's list
    assert isinstance(call, RawCall)
    assert (call.error is None) == (closed and levels <= MAX_JSON_DEPTH), (levels, call.error)
    assert call.error is None or levels <= MAX_JSON_DEPTH or "nested too deeply" in call.error


def deep_call_text(family: str, inner: str) -> str:
    key = PARSERS[family].arguments_key
    body = f'{{"name": "f", "{key}": {{"x": {inner}}}}}'
    return {"hermes": f"<tool_call>{body}</tool_call>", "llama3": body, "mistral": f"[TOOL_CALLS] [{body}]"}[family]
