"""The scorer recognises the engine's head...tail cut of a long tool output whatever the output holds,
its own `\\n...\\n` lines included, because it compares with the cut the engine made."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.reward.format import CUT_MARK, check_format, cut_middle, shown_as
from pipeline.protocols import protocol_for

line = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00<>`"), max_size=30)


@st.composite
def long_outputs(draw) -> tuple[str, int]:
    """An output over the limit with the cut marker (and look-alikes) anywhere, head included."""
    pieces = draw(st.lists(st.one_of(line, st.just(CUT_MARK), st.just("\n..."), st.just("...\n")), min_size=1,
                           max_size=40))
    limit = draw(st.integers(32, 200))
    body = "".join(pieces)
    head_marker_at = draw(st.integers(0, 10))
    text = ("x" + body[:head_marker_at] + CUT_MARK + body[head_marker_at:] + "y" * (limit + 1)).strip()
    return text, limit


@settings(max_examples=300, deadline=None)
@given(long_outputs())
def test_the_engines_own_cut_is_recognised(case: tuple[str, int]) -> None:
    output, limit = case
    shown = cut_middle(output, limit)
    assert shown != output
    assert shown_as(shown, output)


@settings(max_examples=200, deadline=None)
@given(long_outputs(), st.sampled_from(["tapo", "search-r1", "torl"]))
def test_a_correct_trajectory_with_a_cut_output_is_well_formed(case: tuple[str, int], protocol_name: str) -> None:
    output, limit = case
    protocol = protocol_for(protocol_name)
    if protocol_name == "torl":
        text = f"```python\nprint(1)\n```\n{protocol.wrap_output(cut_middle(output, limit))}\\boxed{{1}}"
    else:
        call = protocol.render_call("search", "q", "look it up")
        text = f"{call}{protocol.wrap_output(cut_middle(output, limit))}<answer>1</answer>"
    result = check_format(text, protocol, [output])
    assert result.ok, result.reason


def test_a_head_holding_the_marker_is_not_split_there() -> None:
    """The issue's case: a re-parse splits at the first `\\n...\\n`, which is in the head."""
    output = "start\n...\nmiddle " + "a" * 200 + " end"
    shown = cut_middle(output, 64)
    assert shown.count(CUT_MARK) == 2
    assert shown_as(shown, output)


@given(long_outputs(), st.integers(1, 5))
def test_any_other_cut_of_the_output_is_not_the_engines(case: tuple[str, int], shift: int) -> None:
    """Only the engine's exact cut passes: a forged wrapper with a different head or tail does not."""
    output, limit = case
    half = (limit - len(CUT_MARK)) // 2
    forged = f"{output[:half + shift]}{CUT_MARK}{output[-half:]}"
    assert forged == cut_middle(output, limit) or not shown_as(forged, output) or len(forged) >= len(output)
