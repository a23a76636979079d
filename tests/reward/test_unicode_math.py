"""Math written with Unicode symbols scores as its ASCII/LaTeX form, in every numeric kind (math, calculator,
complex). Found when `−5` (U+2212, what many tokenizers' models print) scored 1 as math and 0 as calculator, and
`√16`, `2²`, `½` scored 0 everywhere."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.reward import verify
from pipeline.reward.unicode_math import ascii_math

NUMERIC_KINDS = ("math", "calculator", "complex")
SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


@pytest.mark.parametrize(("unicode", "ascii"), [
    ("−5", "-5"), ("√16", "\\sqrt{16}"), ("∛8", "\\sqrt[3]{8}"), ("√(2)/2", "\\sqrt{2}/2"), ("2²", "2^{2}"),
    ("10⁻³", "10^{-3}"), ("x₁ = 2", "x_{1} = 2"), ("½", "\\frac{1}{2}"), ("1¾", "1\\frac{3}{4}"), ("≈ 3.14", "3.14"),
    ("x ≈ 3.14", "x = 3.14"), ("2π", "2\\pi"), ("−∞", "-\\infty"), ("３", "3"), ("1–2", "1–2"), ("plain 1-2", "plain 1-2"),
])
def test_ascii_math_forms(unicode: str, ascii: str) -> None:
    assert ascii_math(unicode).replace(" ", "") == ascii.replace(" ", "")


@pytest.mark.parametrize(("kind", "predicted", "gold", "expected"), [
    ("calculator", "−5", "-5", 1.0), ("calculator", "-5", "−5", 1.0), ("calculator", "−5", "5", 0.0),
    ("calculator", "≈ 3.14159", "3.14159", 1.0), ("calculator", "1.2345 × 10³", "1234.5", 1.0),
    ("calculator", "3 \\times 10^{4}", "30000", 1.0), ("calculator", "2^{10}", "1000", 0.0),
    # scientific notation only: an answer repeating the problem's arithmetic has not computed it
    ("calculator", "17 + 25", "42", 0.0), ("calculator", "6 \\times 7", "42", 0.0), ("calculator", "2^{10}", "1024", 0.0),
    ("math", "√16", "4", 1.0), ("math", "2²", "4", 1.0), ("math", "½", "0.5", 1.0), ("math", "1½", "1.5", 1.0),
    ("math", "1½", "0.5", 0.0), ("math", "π/2", "\\frac{\\pi}{2}", 1.0), ("math", "10⁻³", "0.001", 1.0),
    ("math", "1–2", "-1", 0.0),  # an en dash is a range, not a minus
    ("complex", "−3.5 million", "-3500000", 1.0),
])
def test_unicode_answers_score_as_written(kind: str, predicted: str, gold: str, expected: float) -> None:
    assert verify(kind, predicted, gold) == expected


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(NUMERIC_KINDS), st.integers(-(10**6), 10**6), st.integers(-6, 6), st.booleans())
def test_minus_signs_and_superscript_powers_score_as_ascii(kind: str, mantissa: int, exponent: int,
                                                           gold_is_unicode: bool) -> None:
    """-m x 10^e written with U+2212 and superscripts scores against its value as the ASCII form does, whichever
    side (answer or gold) is the Unicode one."""
    ascii_form = f"{mantissa} \\times 10^{{{exponent}}}"
    unicode_form = f"{mantissa}".replace("-", "−") + " × 10" + str(exponent).translate(SUPERSCRIPT)
    value = str(mantissa * 10**exponent) if exponent >= 0 else f"{mantissa}e{exponent}"
    for wrong in (False, True):
        gold = value if not wrong else str(3 * abs(mantissa) * 10 ** abs(exponent) + 7)
        expected = verify(kind, ascii_form, gold)
        got = verify(kind, gold, unicode_form) if gold_is_unicode else verify(kind, unicode_form, gold)
        if gold_is_unicode:
            expected = verify(kind, gold, ascii_form)
        assert got == expected, (kind, unicode_form, gold)
        if kind != "complex":  # the complex kind reads the first number written, not an expression
            assert got == (0.0 if wrong else 1.0), (kind, unicode_form, gold)
