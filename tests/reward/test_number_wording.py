"""A number scores as its value however it is worded, in every kind that reads it: a number word (`two`), a percent
written out (`50 percent`), and, in the complex kind (which reads the first number of free text), a scale as a word,
an abbreviation or a letter (`3.5 million`, `3.5 mn`, `3.5M`, `35k`) or written-out scientific notation
(`3.5 × 10⁶`). Found when `two` scored 0 against 2 in every text kind and complex, `50 percent` 0 against 0.5 in
every numeric kind, and `3.5 × 10⁶` or `3.5M` 0 against 3,500,000 as complex (it read 3.5)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.reward import VERIFIER_KINDS, verify
from pipeline.reward.numeric import NUMBER_WORDS

NUMERIC_KINDS = ("math", "calculator", "complex")
SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
SCALES = {3: ("thousand", "k"), 6: ("million", "M"), 9: ("billion", "B"), 12: ("trillion", None)}
ABBREVIATIONS = {6: ("mn", "mln"), 9: ("bn",), 12: ("tn",)}


def as_decimal(value: Fraction) -> str:
    return f"{float(value):.10g}"


@pytest.mark.parametrize("kind", VERIFIER_KINDS)
@pytest.mark.parametrize(("word", "value"), sorted(NUMBER_WORDS.items()))
def test_a_number_word_scores_as_its_digits(kind: str, word: str, value: int) -> None:
    assert verify(kind, word, str(value)) == 1.0, (kind, word)
    assert verify(kind, str(value), word) == 1.0, (kind, word)
    partial_credit = 0.5 if kind == "fact" else 0.0  # fact is graded by edit distance: "9" against "19" is 0.5
    assert verify(kind, word.capitalize(), str(2 * value + 1)) <= partial_credit, (kind, word)


@pytest.mark.parametrize("kind", ["em", "f1", "fact"])
def test_number_words_inside_a_text_answer(kind: str) -> None:
    assert verify(kind, "The Two Towers", "The 2 Towers") == 1.0
    assert verify(kind, "two or three", "2") == 0.0  # still a hedge


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(NUMERIC_KINDS), st.integers(1, 400), st.sampled_from(["percent", "per cent", "pct",
       "Percent", "\\text{ percent}"]), st.booleans())
def test_a_percent_written_out_scores_as_the_sign(kind: str, number: int, word: str, asked: bool) -> None:
    for gold in (str(number), as_decimal(Fraction(number, 100)), f"{number}%"):
        assert verify(kind, f"{number} {word}", gold, asked) == verify(kind, f"{number}%", gold, asked), (kind, gold)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9999), st.integers(0, 2), st.sampled_from(sorted(SCALES)), st.data())
def test_complex_reads_scales_and_powers_of_ten(digits: int, decimals: int, power: int, data: st.DataObject) -> None:
    mantissa = Fraction(digits, 10**decimals)
    written = as_decimal(mantissa)
    word, letter = SCALES[power]
    forms = [f"{written} {word}", f"about {written} {word.capitalize()} people", f"{written} \\times 10^{{{power}}}",
             f"{written} × 10" + str(power).translate(SUPERSCRIPT), f"{written}e{power}", f"{written} x 10^{power}"]
    forms += [f"{written} {abbreviation}" for abbreviation in ABBREVIATIONS.get(power, ())]
    forms += [f"{written}{letter}"] if letter else []
    form = data.draw(st.sampled_from(forms))
    value = mantissa * 10**power
    assert verify("complex", form, str(value)) == 1.0, form
    assert verify("complex", form, str(value * 2)) == 0.0, form
    assert verify("complex", str(value), form) == 1.0, form


@pytest.mark.parametrize(("predicted", "gold", "expected"), [
    ("300 K", "300", 1.0),  # a letter after a space is a unit (kelvins), not a scale
    ("5m", "5", 1.0),  # a lowercase m is metres
    ("3.5Mb", "3.5", 1.0),  # a letter inside a word is no scale
    ("two million", "2000000", 1.0), ("3.5 millions", "3500000", 1.0), ("1.2 \\times 10^{5000}", "1", 0.0),
])  # fmt: skip
def test_complex_scale_edges(predicted: str, gold: str, expected: float) -> None:
    assert verify("complex", predicted, gold) == expected


def test_complex_tolerance_is_the_decimal_written() -> None:
    """`complex_rel_tol: 0.05` is 1/20: the float 0.05 is a little more, and 19 passed for 20 at "< 5%"."""
    assert verify("complex", "19", "20") == 0.0
    assert verify("complex", "19.01", "20") == 1.0
    assert verify("complex", "21", "20") == 0.0
