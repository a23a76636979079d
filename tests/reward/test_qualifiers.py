"""A number with words or symbols beside it that change, bound or deny it is not that number (qualifiers.py), and
what a reader can apply (scale and sign words) it applies, in every numeric kind and in any sentence around it."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.reward import verify
from pipeline.reward.numeric import normalize_math, number_in_text
from pipeline.reward.qualifiers import is_qualified

NUMERIC_KINDS = ("math", "calculator", "complex")

# {n} is the number; each form says something else than n
BOUNDS = ["more than {n}", "less than {n}", "fewer than {n}", "at least {n}", "at most {n}", "no more than {n}",
          "over {n}", "under {n}", "above {n}", "below {n}", "nearly {n}", "almost {n}", "not {n}", "never {n}",
          "it isn't {n}", "> {n}", ">= {n}", "≥ {n}", "≤{n}", "< {n}", "x > {n}", "x \\geq {n}", "x \\le {n}",
          "\\gt {n}", "{n}+", "{n} or more", "{n} or less", "{n} or fewer", "{n} at least", "{n} at most",
          "{n} and up", "{n} is wrong", "{n} is not the answer", "{n} isn't right", "{n} is incorrect",
          "{n} \\text{{ or more}}", "\\text{{at least }} {n}"]  # LaTeX command names are no words
OPERATIONS = ["{n} squared", "{n} cubed", "{n} tenths", "{n} thousandths", "half of {n}", "twice {n}", "double {n}",
              "the square root of {n}", "the reciprocal of {n}", "{n} factorial", "{n} dozen"]
NOTATION = ["{n}^2", "\\sqrt{{{n}}}", "sqrt {n}"]  # computed by the math kind, not read as one number elsewhere
SENTENCES = ["{a}", "The answer is {a}.", "So the result is {a}", "Answer: {a}", "I think it is {a}."]

numbers = st.integers(2, 10**6)


@settings(max_examples=300, deadline=None)
@given(n=numbers, form=st.sampled_from(BOUNDS + OPERATIONS), sentence=st.sampled_from(SENTENCES),
       kind=st.sampled_from(NUMERIC_KINDS))
def test_a_bounded_denied_or_operated_number_earns_nothing(n: int, form: str, sentence: str, kind: str) -> None:
    answer = sentence.format(a=form.format(n=n))
    assert verify(kind, answer, str(n)) == 0.0, answer


@settings(max_examples=100, deadline=None)
@given(n=numbers, form=st.sampled_from(NOTATION), kind=st.sampled_from(["calculator", "complex"]))
def test_notation_is_no_bare_number_to_the_readers_of_one_number(n: int, form: str, kind: str) -> None:
    assert verify(kind, form.format(n=n), str(n)) == 0.0


@pytest.mark.parametrize(("answer", "gold"), [("\\sqrt{16}", "4"), ("2^{10}", "1024"), ("\\ln(e^{2})", "2")])
def test_the_math_kind_still_computes_notation(answer: str, gold: str) -> None:
    assert verify("math", answer, gold) == 1.0


SCALES = {"hundred": 10**2, "thousand": 10**3, "lakh": 10**5, "million": 10**6, "crore": 10**7, "billion": 10**9,
          "trillion": 10**12, "mn": 10**6, "bn": 10**9}


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 999), scale=st.sampled_from(sorted(SCALES)), unit=st.sampled_from(["", " people", " dollars"]),
       kind=st.sampled_from(NUMERIC_KINDS))
def test_a_scale_word_multiplies_in_every_numeric_kind(n: int, scale: str, unit: str, kind: str) -> None:
    answer = f"{n} {scale}{unit}"
    assert verify(kind, answer, str(n * SCALES[scale])) == 1.0, answer
    assert verify(kind, answer, str(n)) == 0.0, answer  # "42 million" was 42 to math and calculator


@settings(max_examples=200, deadline=None)
@given(n=numbers, word=st.sampled_from(["negative", "minus", "Negative"]), sentence=st.sampled_from(SENTENCES),
       kind=st.sampled_from(["math", "complex"]))
def test_a_sign_word_is_a_sign(n: int, word: str, sentence: str, kind: str) -> None:
    answer = sentence.format(a=f"{word} {n}")
    assert verify(kind, answer, str(-n)) == 1.0, answer
    assert verify(kind, answer, str(n)) == 0.0, answer  # "negative 42" scored 1 against 42


@pytest.mark.parametrize(("kind", "answer", "gold"), [
    ("complex", "3.5 million, not counting the suburbs", "3500000"),  # a denial past the clause is context
    ("complex", "As computed above, 42", "42"), ("complex", "about 42", "42"), ("math", "approximately 42", "42"),
    ("complex", "42 more apples", "42"), ("math", "x = 42", "42"), ("math", "42 + 0", "42"),
    ("complex", "98 million people in 2020", "98000000"), ("math", "42 meters", "42"), ("math", "No. 42", "42"),
    ("complex", "42 times", "42"),  # "how many times": the count is the answer
])  # fmt: skip
def test_context_and_units_are_no_qualifiers(kind: str, answer: str, gold: str) -> None:
    assert verify(kind, answer, gold) == 1.0, answer


def test_unit_stripping_applies_a_scale_and_keeps_value_words() -> None:
    assert normalize_math("42 million people") == "42e6"
    assert normalize_math("1,234 thousand") == "1234e3"
    assert normalize_math("42 squared") == "42squared"  # no unit: the math kind must not read 42
    assert number_in_text("minus 3.5 million") is not None and number_in_text("minus 3.5 million").value == Fraction(-3500000)


@settings(max_examples=200, deadline=None)
@given(text=st.text(" abcnotmrhsqu<>=+^\\{}0123456789.,", max_size=60), start=st.integers(0, 60), width=st.integers(0, 5))
def test_qualifier_check_reads_any_text(text: str, start: int, width: int) -> None:
    start = min(start, len(text))
    for notation in (True, False):
        assert is_qualified(text, start, min(len(text), start + width), evaluates_notation=notation) in (True, False)
