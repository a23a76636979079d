"""The scorer finds the engine's tool outputs in one pass, as the search over every wrapper did, and what the engine
shows of an output is valid text it can recompute.

Finding the k-th output tried every closer after every opener (`<response>x</response>` repeated 100,000
characters: 18 s of CPU). Now the k-th output is looked for in the first wrapper after the previous one only
(a wrapper the model wrote fails the grammar anyway): the properties below check that the split is the one the
nearest-closer search of that wrapper finds, and that the verdict is the one the full search gave.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocols import OUTPUT_MARK, ToolProtocol, Wrapper, protocol_for
from pipeline.reward.format import CUT_MARK, check_format, shown_as, split_engine_outputs
from pipeline.tools.shown import cut_middle, shown_text

TAG_PIECES = ["<response>", "</response>", "\n", " ", "x", "y", "xy", CUT_MARK, "<", "<answer>1</answer>",
              "<code>c</code>", "```output", "```", "\\boxed{1}", "..."]
outputs = st.lists(st.text(alphabet="xy\n. <>`", max_size=12), max_size=3)


def nearest_closer_split(text: str, wrapper: Wrapper, found: Sequence[str]) -> tuple[list[str], str | None]:
    """The reference: each output in the first wrapper after the previous one, at its nearest closer whose
    content shows it (the old search, restricted to that wrapper), compared slice by slice."""
    segments, pos = [], 0
    for k, output in enumerate(found):
        start = text.find(wrapper.opener, pos)
        stop = None
        if start >= 0:
            body = start + len(wrapper.opener)
            close = text.find(wrapper.closer, body)
            while close >= 0 and stop is None:
                if shown_as(text[body:close], output.strip()):
                    stop = close + len(wrapper.closer)
                close = text.find(wrapper.closer, close + 1)
        if stop is None:
            return [], f"tool output #{k + 1} is not in the text"
        segments.append(text[pos:start])
        pos = stop
    return segments + [text[pos:]], None


def every_wrapper_split(text: str, wrapper: Wrapper, found: Sequence[str]) -> tuple[list[str], str | None]:
    """The search before the one-pass reading: every wrapper after the previous output, every closer of each."""
    segments, pos = [], 0
    for k, output in enumerate(found):
        start, stop = text.find(wrapper.opener, pos), None
        while start >= 0 and stop is None:
            body = start + len(wrapper.opener)
            close = text.find(wrapper.closer, body)
            while close >= 0 and stop is None:
                if shown_as(text[body:close], output.strip()):
                    stop = close + len(wrapper.closer)
                close = text.find(wrapper.closer, close + 1)
            if stop is None:
                start = text.find(wrapper.opener, start + 1)
        if stop is None:
            return [], f"tool output #{k + 1} is not in the text"
        segments.append(text[pos:start])
        pos = stop
    return segments + [text[pos:]], None


def full_search_ok(text: str, protocol: ToolProtocol, found: Sequence[str]) -> bool:
    segments, error = every_wrapper_split(text, protocol.output, found)
    return error is None and protocol.grammar_violation(OUTPUT_MARK.join(segments), strict=True,
                                                        eos_strings=()) is None


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(TAG_PIECES), max_size=16), found=outputs,
       name=st.sampled_from(["tapo", "search-r1", "torl"]))
def test_repetition_of_tag_pairs_splits_as_the_nearest_closer_search(pieces: list[str], found: list[str],
                                                                      name: str) -> None:
    protocol = protocol_for(name)
    text = "".join(pieces).replace("<response>", protocol.output.opener).replace("</response>", protocol.output.closer)
    assert split_engine_outputs(text, protocol, found) == nearest_closer_split(text, protocol.output, found)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(TAG_PIECES), max_size=16), found=outputs,
       name=st.sampled_from(["tapo", "search-r1", "torl"]))
def test_repetition_of_tag_pairs_gets_the_verdict_of_the_full_search(pieces: list[str], found: list[str],
                                                                      name: str) -> None:
    """Looking in the first wrapper alone never changes whether a response passes: a wrapper before the engine's
    is the model's, and the grammar refuses it wherever it stands."""
    protocol = protocol_for(name)
    text = "".join(pieces).replace("<response>", protocol.output.opener).replace("</response>", protocol.output.closer)
    assert check_format(text, protocol, found).ok == full_search_ok(text, protocol, found)


@settings(max_examples=200, deadline=None)
@given(calls=st.lists(st.tuples(st.text(alphabet="abc\n. <>", min_size=1, max_size=8), st.text(max_size=300)),
                      min_size=1, max_size=3), limit=st.integers(32, 120), name=st.sampled_from(["tapo", "torl"]))
def test_an_engine_trajectory_is_found_whatever_its_outputs_hold(calls: list[tuple[str, str]], limit: int,
                                                                 name: str) -> None:
    """Outputs of any text (surrogates, NUL, wrappers and cut marks of their own), cut as the engine cuts them."""
    protocol = protocol_for(name)
    tool = protocol.tools[0]
    text = "".join(protocol.render_call(tool, code.strip() or "c", "t") + ("\n" if name == "torl" else "")
                   + protocol.wrap_output(cut_middle(output.strip() or "[no output]", limit)) for code, output in calls)
    text += protocol.render_answer("1")
    found = [output or "[no output]" for _, output in calls]
    result = check_format(text, protocol, found)
    assert result.ok, result.reason


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(["a", "\U0001f600", "\ud83d", "\ude00", "\x00", "\n", "é"]),
                    max_size=80), limit=st.integers(0, 60))
def test_lone_surrogate_and_nul_are_never_shown_nor_split(text: str, limit: int) -> None:
    """What the engine shows is valid text without NUL (the scorer's output mark): no cut splits a surrogate
    pair into two invalid halves, and a cut output is no longer than the limit."""
    shown = cut_middle(text, limit)
    shown.encode("utf-8")
    assert "\x00" not in shown
    assert shown == shown_text(text) or len(shown) <= limit
    if limit >= len(CUT_MARK) + 2:  # the scorer recomputes what was shown (the engine shows outputs stripped)
        assert shown_as(cut_middle(text.strip(), limit), text.strip())


def test_lone_surrogate_pair_written_as_two_code_points_is_one_character() -> None:
    assert shown_text("a\ud83d\ude00b") == "a\U0001f600b"
    assert shown_text("a\ud83db\ude00") == "a\ufffdb\ufffd"
    assert cut_middle("\ud83d\ude00" * 100, 33) == "\U0001f600" * 14 + CUT_MARK + "\U0001f600" * 14


def test_nul_in_a_tool_output_keeps_the_format() -> None:
    """A tool output holding NUL was shown as NUL, and the check refused the whole response for it."""
    protocol = protocol_for("tapo")
    output = "a\x00b"
    text = protocol.render_call("code", "print('a\\0b')", "t") + protocol.wrap_output(cut_middle(output, 1024))
    result = check_format(text + protocol.render_answer("1"), protocol, [output])
    assert result.ok, result.reason
