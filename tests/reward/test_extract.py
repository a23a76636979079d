"""Answer extraction per protocol: last <answer>, last \\boxed{} with nested braces, boxes inside <answer>."""

from __future__ import annotations

import pytest

from pipeline.protocols import protocol_for
from pipeline.protocols.answers import last_boxed

EXTRACT_CASES = [
    # (text, protocol, expected)
    ("<think>x</think><answer>42</answer>", "tapo", "42"),
    ("<answer>1</answer> then <answer> 2 </answer>", "tapo", "2"),
    ("<answer>\\boxed{\\frac{1}{2}}</answer>", "tapo", "\\frac{1}{2}"),
    ("<answer>The answer is \\boxed{7} and \\boxed{8}</answer>", "tapo", "8"),
    ("<answer>\n  Wilhelm Conrad Röntgen\n</answer>", "tapo", "Wilhelm Conrad Röntgen"),
    ("<answer></answer>", "tapo", ""),
    ("no answer here", "tapo", None),
    ("<answer>unclosed", "tapo", None),
    ("<answer> Beijing </answer>", "search-r1", "Beijing"),
    ("<answer>\\boxed{Paris}</answer>", "search-r1", "Paris"),
    ("So the result is \\boxed{5}.", "torl", "5"),
    ("\\boxed{1} then \\boxed{2}", "torl", "2"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "torl", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\left\\{1,2\\right\\}}", "torl", "\\left\\{1,2\\right\\}"),
    ("\\boxed{a^{b^{c^{d}}}}", "torl", "a^{b^{c^{d}}}"),
    ("\\boxed{x} and an unclosed \\boxed{y", "torl", "x"),
    ("\\fbox{12}", "torl", "12"),
    ("\\boxed 5", "torl", "5"),
    ("no box", "torl", None),
    ("<answer>42</answer>", "torl", None),
]


@pytest.mark.parametrize(("text", "protocol", "expected"), EXTRACT_CASES)
def test_extract_answer(text: str, protocol: str, expected: str | None) -> None:
    assert protocol_for(protocol).extract_answer(text) == expected


def test_unknown_protocol_is_named() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'xml'"):
        protocol_for("xml")


def test_escaped_braces_do_not_close_a_box() -> None:
    assert last_boxed("\\boxed{\\}}") == "\\}"
