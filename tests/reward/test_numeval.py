"""The float evaluator of constant LaTeX: values, implicit products, and where it gives up."""

from __future__ import annotations

import math
import time

import pytest

from pipeline.reward.numeval import evaluate

VALUES = [
    ("42", 42.0),
    ("-3.5", -3.5),
    ("\\frac{1}{2}", 0.5),
    ("\\frac12", 0.5),
    ("\\frac{\\pi}{6}+1", math.pi / 6 + 1),
    ("2\\sqrt{3}", 2 * math.sqrt(3)),
    ("11\\sqrt2", 11 * math.sqrt(2)),
    ("\\sqrt[3]{8}", 2.0),
    ("2^{10}", 1024.0),
    ("2^10", 1024.0),  # what the writer meant, not LaTeX's 2^{1}0
    ("3\\cdot4", 12.0),
    ("6\\div4", 1.5),
    ("(1+2)(3+4)", 21.0),
    ("-2^2", -4.0),
    ("\\frac{3\\sqrt{3}}{4}", 3 * math.sqrt(3) / 4),
]


@pytest.mark.parametrize(("text", "value"), VALUES)
def test_values(text: str, value: float) -> None:
    assert evaluate(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text", ["x+1", "(1,2)", "\\{1,2\\}", "\\sqrt{-1}", "\\frac{1}{0}", "1/0", "", "2^{", "\\sin(1)", "10!", "3i",
             "1\\frac{1}{2}", "-2\\frac{3}{4}"]
)
def test_gives_up_outside_its_grammar(text: str) -> None:
    assert evaluate(text) is None


def test_tower_of_powers_gives_up_at_once() -> None:
    start = time.monotonic()
    assert evaluate("9^{9^{9^{9}}}") is None
    assert evaluate("10^{10^{10}}") is None
    assert time.monotonic() - start < 0.1


def test_variables_only_at_a_point_and_never_e_or_i() -> None:
    assert evaluate("x^2+2x+1") is None  # constants only by default
    x = evaluate("x", point=0)
    assert x is not None and 0.5 <= x <= 2.5
    assert evaluate("(x+1)^2", point=0) == pytest.approx(evaluate("x^2+2x+1", point=0))
    assert evaluate("X", point=1) == evaluate("x", point=1)  # case-folded, like math-verify
    assert evaluate("x", point=0) != evaluate("x", point=1)
    assert evaluate("e^{2}", point=0) is None
    assert evaluate("3i", point=0) is None
