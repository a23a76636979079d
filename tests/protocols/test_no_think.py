"""tapo-no-think (TAPO Table 3's "w/o think" arm) is tapo less the think block, and nothing else.

Any tapo response that passes the format check passes it here once its think blocks are taken out, and fails
here wherever a think block stands; the prompt and what the protocol writes (the cold start's traces) hold none.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocols import protocol_for
from pipeline.reward import check_format

TAPO, NO_THINK = protocol_for("tapo"), protocol_for("tapo-no-think")
plain = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>`\\{}\x00"),
                max_size=30)
filled = plain.filter(str.strip)


@st.composite
def tapo_responses(draw) -> tuple[str, list[str]]:
    """A tapo response: calls (each with its think block and tool output), free think blocks, one answer."""
    parts, outputs = [], []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            parts.append(f"<think>{draw(plain)}</think>\n")
        else:
            output = draw(plain)
            parts.append(TAPO.render_call(draw(st.sampled_from(TAPO.tools)), draw(filled), draw(plain))
                         + TAPO.wrap_output(output))
            outputs.append(output)
    return "".join(parts) + TAPO.render_answer(draw(filled)), outputs


@settings(max_examples=200, deadline=None)
@given(tapo_responses())
def test_a_tapo_response_passes_without_its_think_blocks_and_fails_with_any(drawn) -> None:
    text, outputs = drawn
    assert check_format(text, TAPO, outputs).ok
    stripped = re.sub(r"<think>.*?</think>\n?", "", text, flags=re.S)
    assert check_format(stripped, NO_THINK, outputs).ok
    result = check_format(text, NO_THINK, outputs)
    assert result.ok == ("<think>" not in text)
    if "<think>" in text:
        assert "think" in result.reason


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(TAPO.tools), filled, plain)
def test_what_it_writes_and_teaches_holds_no_think(tool: str, call_input: str, thought: str) -> None:
    assert "think>" not in NO_THINK.render_call(tool, call_input, thought)
    for tools in ((), ("code",), ("search",), ("search", "code")):
        prompt = NO_THINK.system_prompt(tools)
        assert "think" not in prompt.lower()
        # the same rules and examples as tapo's, less the think rule and blocks
        tapo = re.sub(r"<think>.*?</think>\n?", "", TAPO.system_prompt(tools)).splitlines()
        assert prompt.splitlines()[2:] == tapo[2:] and prompt.splitlines()[0] == tapo[0]
