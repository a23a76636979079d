"""No verifier kind pays for hedging, and the percentage rule is the one stated in verifiers.py."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pipeline.config.reward import RewardConfig
from pipeline.protocols import protocol_for
from pipeline.reward import VERIFIER_KINDS, score_trajectory, verify
from pipeline.reward.hedging import is_hedged
from pipeline.reward.verifiers import asks_for_percentage
from pipeline.types import Problem, Trajectory

HEDGES = ["{a} or {b}", "{b} or {a}", "between {a} and {b}", "between {b} and {a}", "{a} (or {b})",
          "{a} to {b}", "from {a} to {b}", "either {a} or {b}", "{a} or maybe {b}", "x = {a} or x = {b}",
          "\\boxed{{{a}}} or \\boxed{{{b}}}", "{a} \\text{{ or }} {b}",
          # separators found by an outside audit: each was credited by some kind
          "{a} vs {b}", "{a} versus {b}", "{a} and/or {b}", "{a} | {b}", "{a} ∨ {b}", "{a} \\lor {b}", "{a}? {b}?",
          "{a} … {b}", "{a} – {b}", "{a}—{b}", "{a} oder {b}", "{a} ou {b}"]
NUMERIC_TEXT_HEDGES = ["{a}, {b}", "{a}-{b}", "{a} – {b}", "{a}; {b}", "{a} and {b}", "{a}\n{b}", "{a}! {b}!",
                       "{a} ± {b}", "{a}\\pm{b}"]
TEXT_HEDGES = ["{a}/{b}", "{a} | {b}", "{a}\n{b}", "{a} vs. {b}", "{a} (or {b})"]

numbers = st.one_of(st.integers(-10**6, 10**6).map(str),
                    st.decimals(-10**4, 10**4, places=2, allow_nan=False, allow_infinity=False).map(str))
words = st.sampled_from(["Paris", "London", "Canberra", "Sydney", "Marie Curie", "Pierre Curie", "Jupiter", "Mars"])


def different(a: str, b: str) -> bool:
    try:
        return Decimal(a) != Decimal(b)
    except ArithmeticError:
        return a != b


@settings(max_examples=300, deadline=None)
@given(gold=numbers, other=numbers, form=st.sampled_from(HEDGES), kind=st.sampled_from(VERIFIER_KINDS))
def test_naming_a_second_number_earns_nothing_in_any_kind(gold: str, other: str, form: str, kind: str) -> None:
    assume(different(gold, other))
    hedge = form.format(a=gold, b=other)
    assert verify(kind, gold, gold) == 1.0 or kind in ("fact", "em", "f1")  # the gold alone is right
    assert verify(kind, hedge, gold) == 0.0, hedge


@settings(max_examples=200, deadline=None)
@given(gold=numbers, other=numbers, form=st.sampled_from(NUMERIC_TEXT_HEDGES),
       kind=st.sampled_from(["complex", "calculator"]))
def test_numeric_text_lists_and_ranges_earn_nothing(gold: str, other: str, form: str, kind: str) -> None:
    assume(different(gold, other))
    assert verify(kind, form.format(a=gold, b=other), gold) == 0.0


# a list of numbers in any typesetting, for a text kind asked for one number (token F1 gave "42 43" 0.67)
NUMBER_LISTS = ["{a} {b}", "{a}, {b}", "{a}; {b}", "{a}\n{b}", "**{a}** **{b}**", "{a} (also {b})", "{a} maybe {b}",
                "The answer is {a}. The answer is {b}.", "Answer: {a}. Answer: {b}", "\\boxed{{{a}}}\\boxed{{{b}}}",
                "{a}\\quad {b}", "probably {a}, possibly {b}", "[{a}, {b}]", "{a} and {b}"]


@settings(max_examples=200, deadline=None)
@given(gold=numbers, other=numbers, form=st.sampled_from(NUMBER_LISTS), kind=st.sampled_from(["fact", "em", "f1"]),
       gold_first=st.booleans())
def test_a_list_of_numbers_earns_nothing_in_a_text_kind(gold: str, other: str, form: str, kind: str,
                                                         gold_first: bool) -> None:
    assume(different(gold, other))
    a, b = (gold, other) if gold_first else (other, gold)
    assert verify(kind, form.format(a=a, b=b), gold) == 0.0, form.format(a=a, b=b)


@pytest.mark.parametrize(("kind", "predicted", "gold", "expected"), [
    ("em", "1,000", "1000", 1.0), ("f1", "42 apples", "42", 2 / 3), ("f1", "New York City", "New York", 0.8),
    ("f1", "7 7", "7", 2 / 3),  # one number twice is no second candidate
    ("f1", "Paris 1900", "Paris", 2 / 3),  # the gold is no number: the F1 of tokens decides
])  # fmt: skip
def test_one_number_in_a_text_answer_keeps_its_credit(kind: str, predicted: str, gold: str, expected: float) -> None:
    assert verify(kind, predicted, gold) == pytest.approx(expected)


@settings(max_examples=200, deadline=None)
@given(gold=words, other=words, form=st.sampled_from(HEDGES[:3] + HEDGES[7:9]), kind=st.sampled_from(VERIFIER_KINDS))
def test_naming_a_second_answer_earns_nothing_in_any_kind(gold: str, other: str, form: str, kind: str) -> None:
    assume(gold != other)
    assert verify(kind, form.format(a=gold, b=other), gold) == 0.0


@settings(max_examples=100, deadline=None)
@given(gold=words, other=words, form=st.sampled_from(TEXT_HEDGES), kind=st.sampled_from(["fact", "em", "f1"]))
def test_text_answers_listed_with_slashes_bars_or_lines_earn_nothing(gold: str, other: str, form: str,
                                                                     kind: str) -> None:
    assume(gold != other)
    assert verify(kind, form.format(a=gold, b=other), gold) == 0.0


@pytest.mark.parametrize(("kind", "answer"), [("fact", "AC/DC"), ("em", "AC/DC"), ("f1", "AC/DC"),
                                              ("math", "1/2"), ("math", "|x|"), ("calculator", "1/3")])
def test_a_gold_written_with_a_separator_is_its_own_answer(kind: str, answer: str) -> None:
    assert verify(kind, answer, answer) == 1.0


@pytest.mark.parametrize(("predicted", "gold"), [("1000 or 5000", "1000"), ("between 960 and 5000", "1000"),
                                                 ("1000 (or 5000)", "1000"), ("960-5000", "1000")])
def test_the_complex_verifier_reads_no_first_number_out_of_a_hedge(predicted: str, gold: str) -> None:
    assert verify("complex", predicted, gold) == 0.0


@pytest.mark.parametrize(("kind", "predicted", "gold"), [
    ("complex", "3.5 million (2020)", "3500000"), ("complex", "8,104.4 people/km²", "8104.4"),
    ("complex", "1000 or 1,000", "1000"), ("math", "(1, 2]", "(1,2]"), ("math", "x^2-1", "x^2-1"),
    ("math", "\\frac{1}{2}", "0.5"), ("fact", "Paris", "Paris"), ("calculator", "3 \\times 10^{4}", "30000"),
    ("calculator", "1/3", "0.3333333"), ("complex", "98 million people in 2020", "98000000"),
    ("math", "|-3|", "3")])
def test_one_value_with_qualifiers_or_repeats_is_not_a_hedge(kind: str, predicted: str, gold: str) -> None:
    assert not is_hedged(predicted, gold, kind)
    assert verify(kind, predicted, gold) == 1.0


@pytest.mark.parametrize(("predicted", "gold"), [("2 or 3", "2, 3"), ("x = 2 or x = 3", "x = 3 or x = 2")])
def test_a_gold_that_lists_values_leaves_lists_to_the_kind(predicted: str, gold: str) -> None:
    assert not is_hedged(predicted, gold, "math")


values = st.decimals(Decimal("0.01"), 10**4, places=2).map(lambda d: d.normalize())


@settings(max_examples=200, deadline=None)
@given(value=values, kind=st.sampled_from(["math", "calculator", "complex"]), sign=st.sampled_from(["%", "\\%"]))
def test_a_percentage_is_its_value_over_100_unless_a_percentage_is_asked(value: Decimal, kind: str, sign: str) -> None:
    as_percent = f"{value:f}{sign}"
    assert verify(kind, as_percent, f"{value:f}") == 0.0  # "0.42%" is not 0.42
    assert verify(kind, as_percent, f"{value / 100:f}") == 1.0
    assert verify(kind, as_percent, f"{value:f}", percent_asked=True) == 1.0  # "25%" for "what percent?" 25
    assert verify(kind, f"{value:f}", f"{value:f}{sign}") == 1.0  # a gold written as a percentage asks for one
    assert verify(kind, f"{value / 100:f}", f"{value:f}{sign}") == 1.0


@pytest.mark.parametrize(("question", "asked"), [
    ("What percentage of 80 is 20?", True), ("By what percent did it rise?", True), ("How many per cent?", True),
    ("What is 20% of 80?", False), ("What is 6 * 7?", False)])
def test_which_questions_ask_for_a_percentage(question: str, asked: bool) -> None:
    assert asks_for_percentage(question) is asked


def answer_only(text: str) -> Trajectory:
    return Trajectory("p", (1,), (2,) * 8, (1,) * 8, (-0.1,) * 8, (), "answer", text, 1)


@pytest.mark.parametrize(("question", "reward"), [("What percentage of 80 is 20?", 1.0), ("What is 100 / 4?", 0.0)])
def test_the_scorer_reads_the_question_for_the_percentage_rule(question: str, reward: float) -> None:
    problem = Problem("p", question, ("25",), "math", "gsm8k", "train")
    text = "<think>compute</think><answer>25%</answer>"
    assert score_trajectory(problem, answer_only(text), RewardConfig(), protocol=protocol_for("tapo"),
                            max_policy_tokens=100).accuracy == reward


# Any separator at all between two different numbers, not only the spellings listed above: the only strings that
# join two digit runs into one number are a decimal point, and a comma or typographic group space before three digits
# (all excluded here).
SEPARATOR_CHARS = " \t\n.,;:!?-–—_/|\\&+*~^'\"`()[]{}<>=·•…、，；　\u00a0\u2009abcxyzAORor"


@settings(max_examples=400, deadline=None)
@given(a=st.integers(0, 10**6), b=st.integers(0, 10**6), separator=st.text(SEPARATOR_CHARS, min_size=1, max_size=5),
       kind=st.sampled_from(["fact", "em", "f1"]))
def test_two_numbers_with_any_separator_earn_nothing_in_a_text_kind(a: int, b: int, separator: str, kind: str) -> None:
    assume(a != b and separator not in (".", ","))
    assume(not (separator.startswith(".") and separator[1:2].isalpha()))  # "42.e5" and kin: not two plain numbers
    assume(not (separator[-1] in ",\u00a0\u2009" and len(str(b)) == 3))
    predicted = f"{a}{separator}{b}"
    assert verify(kind, predicted, str(a)) == 0.0, predicted
    assert verify(kind, predicted, str(b)) == 0.0, predicted


@settings(max_examples=300, deadline=None)
@given(a=st.integers(1, 999), b=st.integers(1, 999), separator=st.text(SEPARATOR_CHARS, min_size=1, max_size=4),
       kind=st.sampled_from(VERIFIER_KINDS))
def test_no_separator_lets_one_answer_collect_both_candidates(a: int, b: int, separator: str, kind: str) -> None:
    """Whatever a kind reads out of "a<sep>b", naming both never raises the expected reward over committing to one
    (the hedge a policy under RL would find): unsure between a and b, committing earns 1/2 on average, so the two
    scores of the hedge must not sum past 1 (the fact kind's partial credit for similar strings may split it)."""
    assume(abs(a - b) > 0.1 * max(a, b))  # the complex kind's 5 % tolerance would accept both honestly
    predicted = f"{a}{separator}{b}"
    assert verify(kind, predicted, str(a)) + verify(kind, predicted, str(b)) <= 1.0, predicted
