"""How an answer is typeset changes no score, in any kind: markup around the whole answer, the script its digits
are written in, typographic digit-group spaces. Found when `**42**` scored 0 as math and 1 as complex,
`\\mathbf{42}` 1 as math and 0 as calculator, `٤٢` 1 as math and 0 as em, and `1 000` (narrow no-break
space) 0 in every text kind. The properties compare each typeset form with the plain one, for every kind, with the
typeset form as the answer and as the gold; markup inside an answer stays, so hedges stay visible."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.reward import VERIFIER_KINDS, verify
from pipeline.reward.presentation import ascii_digits, readable, unwrapped

# the layers an answer is typeset in, innermost first: LaTeX wrappers, math delimiters, markdown, a label
LATEX = ["\\boxed{{{}}}", "\\fbox{{{}}}", "\\text{{{}}}", "\\textbf{{{}}}", "\\mathbf{{{}}}", "\\mathrm{{{}}}",
         "{{{}}}"]
MATH_MODE = ["${}$", "$${}$$", "\\({}\\)", "\\[{}\\]"]
MARKDOWN = ["**{}**", "__{}__", "*{}*", "_{}_", "`{}`", "```{}```", "***{}***", " {} "]
LABELS = ["Answer: {}", "answer: {}", "**Answer:** {}", "**Final Answer:** {}", "__Answer__: {}", "The answer is {}",
          "The final answer is: {}", "= {}", "Final answer = {}"]
# (answer, gold) pairs of every kind's usual shapes, right and wrong
PAIRS = [
    ("42", "42"), ("41", "42"), ("-5", "-5"), ("5", "-5"), ("3.5", "3.5"), ("\\frac{1}{2}", "0.5"), ("1/3", "0.5"),
    ("1000", "1,000"), ("25%", "0.25"), ("x = 3", "3"), ("(1, 2)", "(1,2)"), ("2\\sqrt{2}", "\\sqrt{8}"),
    ("Paris", "Paris"), ("Lyon", "Paris"), ("Eiffel Tower", "the Eiffel Tower"), ("3.5 million", "3500000"),
    ("1.2e3", "1200"), ("New York City", "New York"),
]  # fmt: skip
ZEROS = [0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0xFF10, 0x1D7CE]  # Arabic-Indic, Persian, Devanagari, Bengali, Thai,
# fullwidth, mathematical bold
GROUP_SPACES = ["\u00a0", "\u202f", "\u2009", "\u2007"]


def in_script(text: str, zero: int) -> str:
    return "".join(chr(zero + int(ch)) if ch.isdigit() else ch for ch in text)


@st.composite
def typesetting(draw: st.DrawFn) -> list[str]:
    """Wrappers, innermost first: some LaTeX, maybe a math mode, some markdown, maybe a label, maybe a full stop."""
    layers = draw(st.lists(st.sampled_from(LATEX), max_size=2, unique=True))
    layers += draw(st.lists(st.sampled_from(MATH_MODE), max_size=1))
    layers += draw(st.lists(st.sampled_from(MARKDOWN), max_size=2, unique=True))
    layers += draw(st.lists(st.sampled_from(LABELS), max_size=1))
    return layers + draw(st.lists(st.sampled_from(["{}.", "{};", "{},", "{} ."]), max_size=1))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(VERIFIER_KINDS), st.sampled_from(PAIRS), typesetting(), st.booleans())
def test_markup_around_an_answer_changes_no_score(kind: str, pair: tuple[str, str], wrappers: list[str],
                                                  on_gold: bool) -> None:
    answer, gold = pair
    plain = verify(kind, answer, gold)
    typeset = answer if not on_gold else gold
    for wrapper in wrappers:
        typeset = wrapper.format(typeset)
    got = verify(kind, answer, typeset) if on_gold else verify(kind, typeset, gold)
    assert got == plain, (kind, typeset, answer if on_gold else gold)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(VERIFIER_KINDS), st.sampled_from(PAIRS), st.sampled_from(ZEROS), st.booleans())
def test_digits_of_every_script_score_as_ascii(kind: str, pair: tuple[str, str], zero: int, on_gold: bool) -> None:
    answer, gold = pair
    plain = verify(kind, answer, gold)
    got = verify(kind, answer, in_script(gold, zero)) if on_gold else verify(kind, in_script(answer, zero), gold)
    assert got == plain, (kind, zero, pair)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(VERIFIER_KINDS), st.integers(1000, 10**12), st.sampled_from(GROUP_SPACES))
def test_typographic_digit_groups_read_as_one_number(kind: str, value: int, space: str) -> None:
    grouped = f"{value:,}".replace(",", space)
    assert verify(kind, grouped, str(value)) == 1.0, (kind, grouped)
    assert verify(kind, str(value), grouped) == 1.0, (kind, grouped)
    assert verify(kind, grouped, str(2 * value + 1)) < 1.0, (kind, grouped)


@pytest.mark.parametrize("kind", VERIFIER_KINDS)
@pytest.mark.parametrize("hedge", [
    "$42$ or $43$", "**42** or **43**", "\\boxed{42} or \\boxed{43}", "`42` or `43`", "Answer: 42 or 43",
    "**42 or 43**", "\\[42\\] or \\[43\\]", "{42} or {43}",
])  # fmt: skip
def test_markup_does_not_hide_a_hedge(kind: str, hedge: str) -> None:
    assert verify(kind, hedge, "42") == 0.0


@pytest.mark.parametrize(("text", "expected"), [
    ("$a$ or $b$", "$a$ or $b$"), ("**a** and **b**", "**a** and **b**"),
    ("\\text{a} + \\text{b}", "\\text{a} + \\text{b}"),
    ("{a}{b}", "{a}{b}"), ("**", "**"), ("Answer:", "Answer:"), ("answer", "answer"), ("$$", "$$"), ("**$42$**", "42"),
    ("\\boxed{\\boxed{\\textbf{42}}}", "42"), ("Answer: **42**", "42"), ("2*3*4", "2*3*4"), ("*2*3*", "*2*3*"),
    ("\\{1, 2\\}", "\\{1, 2\\}"), ("1, 2, 3, ...", "1, 2, 3, ..."), ("**42**.", "42"), ("\\boxed{42}.", "42"),
    ("The answer is not 42", "not 42"), ("answers: 42", "answers: 42"),
])  # fmt: skip
def test_only_markup_around_the_whole_answer_goes(text: str, expected: str) -> None:
    assert unwrapped(text) == expected


@pytest.mark.parametrize(("kind", "predicted", "gold", "expected"), [
    ("math", "Answer: not 42", "42", 0.0), ("math", "The answer is 98, not 97", "98", 0.0),
    ("em", "The answer is Paris", "Paris", 1.0), ("em", "The answer is not Paris", "Paris", 0.0),
    ("math", "٣٫٥", "3.5", 1.0), ("em", "٣٫٥", "3.5", 1.0), ("complex", "٥٠٪", "0.5", 1.0),
    ("em", "1 2", "12", 0.0),  # a plain space may separate two numbers: no digit group
    ("em", "12\u202f34", "1234", 0.0),  # not a group of three
    ("calculator", "\\mathbf{42}", "42", 1.0), ("calculator", "**42**", "42", 1.0), ("math", "`42`", "42", 1.0),
])  # fmt: skip
def test_typeset_answers(kind: str, predicted: str, gold: str, expected: float) -> None:
    assert verify(kind, predicted, gold) == expected


def test_ascii_digits_keeps_superscripts_and_ascii() -> None:
    assert ascii_digits("2² + ٣") == "2² + 3"  # a superscript is a power (unicode_math), not a digit
    text = "plain ASCII 1 2, 3.5"
    assert ascii_digits(text) is text
    assert readable("\u200b**٤٢**\u200b") == "42"
