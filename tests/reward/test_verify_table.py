"""Hand-checked verifier cases, one table per kind: equivalences, non-equivalences, Unicode, aliases."""

from __future__ import annotations

import pytest

from pipeline.reward import verify

# (predicted, gold, expected) - expected is exact (0/1) unless the kind is graded.
MATH_CASES = [
    # equivalences the strict string match of TAPO misses
    ("1/2", "\\frac{1}{2}", 1.0),
    ("0.5", "\\frac{1}{2}", 1.0),
    ("0.5", "1/2", 1.0),
    ("\\dfrac{1}{2}", "0.5", 1.0),
    ("\\tfrac12", "0.5", 1.0),
    ("-\\frac{3}{4}", "-0.75", 1.0),
    ("\\frac{-3}{4}", "-0.75", 1.0),
    ("x = 3", "3", 1.0),
    ("x=3", "3", 1.0),
    ("\\theta = 30", "30", 1.0),
    ("50\\%", "0.5", 1.0),
    ("50%", "50", 0.0),  # 50% is 0.5 unless the problem asks for a percentage (test_hedging.py)
    ("0.5", "50\\%", 1.0),
    ("12.5%", "\\frac{1}{8}", 1.0),
    ("1,000", "1000", 1.0),
    ("1,234,567", "1234567", 1.0),
    ("1{,}000", "1000", 1.0),
    ("10\\text{ cm}", "10", 1.0),
    ("18 \\text{ dollars}", "18", 1.0),
    ("\\$18", "18", 1.0),
    ("$18.00$", "18", 1.0),
    ("90^\\circ", "90", 1.0),
    ("90°", "90", 1.0),
    ("\\text{5}", "5", 1.0),
    ("5.", "5", 1.0),
    ("05", "5", 1.0),
    ("5.000", "5", 1.0),
    ("1e3", "1000", 1.0),
    ("10^{-3}", "1e-3", 1.0),  # a number in e-notation against an expression: read as the number (it scored 0)
    ("2^{10}", "1.024e3", 1.0),
    ("2^{10}", "1.025e3", 0.0),
    ("2.5e-1", "\\frac14", 1.0),
    ("0.3333333333", "\\frac{1}{3}", 1.0),
    ("0.30000000000000004", "0.3", 1.0),
    ("999999999", "1000000000", 0.0),
    ("(1, 2]", "(1,2]", 1.0),
    ("(0.5, 3)", "(\\frac{1}{2}, 3)", 1.0),
    ("[1,2]", "\\left[1, 2\\right]", 1.0),
    ("(3,4)", "(3, 4)", 1.0),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", 1.0),
    ("2\\sqrt{3}", "\\sqrt{12}", 1.0),
    # a whole number before a fraction is a mixed number, as competition answers write them (and math-verify reads
    # them); the fast evaluator used to read a product and decide alone (1\frac{1}{2} "equal" to 1/2)
    ("1\\frac{1}{2}", "1.5", 1.0),
    ("1\\frac{1}{2}", "\\frac{3}{2}", 1.0),
    ("1\\frac{1}{2}", "1/2", 0.0),
    ("1.5", "2\\frac{1}{2}", 0.0),
    ("-2\\frac{1}{4}", "-2.25", 1.0),
    ("3 \\dfrac{2}{3}", "\\frac{11}{3}", 1.0),
    ("2\\frac{\\sqrt{3}}{2}", "\\sqrt{3}", 1.0),  # not a fraction of whole numbers: a product
    ("(x+1)^2", "x^2+2x+1", 1.0),
    ("2^{10}", "1024", 1.0),
    ("\\pi/2", "\\frac{\\pi}{2}", 1.0),
    ("\\{1, 2\\}", "\\{2, 1\\}", 1.0),
    ("five", "5", 1.0),
    ("twelve", "12", 1.0),
    ("  42  ", "42", 1.0),
    ("-7", "-7", 1.0),
    ("+7", "7", 1.0),
    ("3.0", "3", 1.0),
    ("\\boxed{5}", "5", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\frac{6}{8}", "\\frac{3}{4}", 1.0),
    ("2/4", "1/2", 1.0),
    ("0.75", "75\\%", 1.0),
    ("100\\%", "1", 1.0),
    ("1\\,000", "1000", 1.0),
    ("10", "10\\text{ meters}", 1.0),
    ("x^2+1", "1+x^2", 1.0),
    ("\\frac{x}{2}", "\\frac{1}{2}x", 1.0),
    ("a", "A", 1.0),
    ("\\sin^2(x)+\\cos^2(x)", "1", 1.0),
    ("2e", "e+e", 1.0),  # e is a constant, never a sampled variable
    ("\\infty", "\\infty", 1.0),
    ("540 meters", "540", 1.0),
    ("18 sq. ft", "18", 1.0),
    ("90 degrees", "90", 1.0),
    ("11\\sqrt2", "\\sqrt{242}", 1.0),
    ("\\sqrt[3]{27}", "3", 1.0),
    ("2^{-1}", "0.5", 1.0),
    # non-equivalences
    ("3", "4", 0.0),
    ("0.51", "0.5", 0.0),
    ("0.333", "\\frac{1}{3}", 0.0),
    ("1/3", "0.33", 0.0),
    ("-5", "5", 0.0),
    ("50", "0.5", 0.0),
    ("(1, 2)", "[1, 2]", 0.0),
    ("(1,2]", "[1,2)", 0.0),
    ("(1, 2)", "(2, 1)", 0.0),
    ("(1, 2, 3)", "(1, 2)", 0.0),
    ("\\sqrt{3}", "\\sqrt{2}", 0.0),
    ("\\pi", "3.14159", 0.0),
    ("x^2", "2x", 0.0),
    ("1000", "100", 0.0),
    ("12", "1,200", 0.0),
    ("", "5", 0.0),
    ("\\frac{1}{0}", "1", 0.0),
    ("seven", "8", 0.0),
    ("1e999999", "1", 0.0),
    ("abc", "5", 0.0),
    ("2/3", "0.67", 0.0),
    ("\\frac{1}{2}", "\\frac{1}{3}", 0.0),
    ("x+1", "x-1", 0.0),
    ("-\\infty", "\\infty", 0.0),
    ("2 pi", "2", 0.0),
    ("\\frac{\\pi}{6}+1", "\\frac{\\pi}{6}", 0.0),
    ("Karl Malone", "187", 0.0),
    ("March 2016", "98", 0.0),
    ("The answer is 98", "98", 1.0),  # a sentence around the number (math-verify's reading); it used to score 0
    ("the answer is 97", "98", 0.0),
    ("97 is wrong, the answer is 98", "98", 0.0),  # a sentence naming two numbers: either could be read
    ("answer: 97, 98", "97", 0.0),
    ("the answer is 98. the answer is 97", "97", 0.0),
    ("The answer is \\boxed{98}", "98", 1.0),
    ("the answer is not 98", "98", 0.0),
    ("98 isn't the answer", "98", 0.0),
    ("98 is not the answer", "98", 0.0),  # no unit words: a denial
    ("The answer is 1,000", "1000", 1.0),
    ("\\sqrt{2}", "1.4142135623730951", 1.0),
    ("11\\sqrt2", "200", 0.0),
    ("p - q+1", "p - q", 0.0),
    ("x^3+3x-6", "x^3+3x+6", 0.0),
    ("A", "B", 0.0),
    ("2x", "x", 0.0),
    ("1e-12", "2e-12", 0.0),
    ("10^{-12}", "2\\cdot10^{-12}", 0.0),
    ("1e-400", "0", 0.0),
    ("9" * 5000, "1", 0.0),
    ("1" * 500, "1", 0.0),
]

FACT_CASES = [
    # TAPO's Röntgen example: partial credit 1 - 7/22 instead of EM's 0
    ("Wilhelm Röntgen", "Wilhelm Conrad Röntgen", 1 - 7 / 22),
    ("Wilhelm Conrad Röntgen", "Wilhelm Conrad Röntgen", 1.0),
    ("wilhelm conrad rontgen", "Wilhelm Conrad Röntgen", 1.0),
    ("WILHELM CONRAD RÖNTGEN", "Wilhelm Conrad Röntgen", 1.0),
    ("The Eiffel Tower.", "Eiffel Tower", 1.0),
    ("eiffel-tower", "Eiffel Tower", 1.0),
    ("Paris", "paris", 1.0),
    ("Paris, France", "Paris", 0.0),  # r = 7/13 > 0.5
    ("Pari", "Paris", 0.8),
    ("London", "Paris", 0.0),
    ("", "Paris", 0.0),
    ("the", "The", 0.0),  # nothing left after dropping the article
    ("Ｔｏｋｙｏ", "Tokyo", 1.0),  # NFKC folds full-width letters
    ("Beyoncé", "Beyonce", 1.0),
    ("Zoë Saldaña", "Zoe Saldana", 1.0),
    ("São Paulo", "Sao Paulo", 1.0),
    ("ﬁsh", "fish", 1.0),  # the fi ligature
    ("Strasse", "Straße", 1.0),  # casefold: ß -> ss
    ("Москва", "москва", 1.0),
    ("北京", "北京", 1.0),
    ("北京", "上海", 0.0),
    ("George Washington", "Washington", 1 - 7 / 17),  # r = 7/17 <= 0.5: partial credit
    ("1969", "1969", 1.0),
    ("1968", "1969", 0.75),
    ("J. K. Rowling", "JK Rowling", 1 - 1 / 11),
    ("Barack Obama", "Barack Hussein Obama", 1 - 8 / 20),
    ("Obama", "Barack Hussein Obama", 0.0),
]

EM_CASES = [
    ("Wilhelm Röntgen", "Wilhelm Conrad Röntgen", 0.0),
    ("the Eiffel Tower.", "Eiffel tower", 1.0),
    ("An apple", "apple", 1.0),
    ("  Paris ", "paris", 1.0),
    ("Paris France", "Paris", 0.0),
    ("", "", 0.0),
    ("Beyoncé", "Beyonce", 1.0),
    ("U.S.", "US", 1.0),  # points and apostrophes inside a word join it (SQuAD drops them too)
    ("O'Neil", "ONeil", 1.0),
    ("1990's", "1990s", 1.0),
    ("Jean-Paul", "Jean Paul", 1.0),  # other punctuation separates
    # numbers keep their meaning: digit groups join, a decimal point and a leading minus stay (SQuAD's
    # normaliser, which drops them all, made 3.5 equal 35 and -5 equal 5)
    ("1,000", "1000", 1.0),
    ("12,000,000 people", "12000000 people", 1.0),
    ("3.5", "35", 0.0),
    ("-5", "5", 0.0),
    ("\u22125", "-5", 1.0),
    ("1, 2", "1 2", 1.0),
    ("yes", "Yes.", 1.0),
    ("no", "yes", 0.0),
    ("The Beatles", "Beatles", 1.0),
    ("Röntgen", "Roentgen", 0.0),
]

F1_CASES = [
    ("Wilhelm Röntgen", "Wilhelm Conrad Röntgen", 0.8),
    ("Wilhelm Conrad Röntgen", "Wilhelm Conrad Röntgen", 1.0),
    ("the cat sat", "cat sat on mat", 2 * (2 / 2) * (2 / 4) / ((2 / 2) + (2 / 4))),
    ("Paris", "London", 0.0),
    ("yes", "no", 0.0),
    ("yes", "yes", 1.0),
    ("no answer", "noanswer", 0.0),
    ("", "Paris", 0.0),
    ("New York City", "New York", 0.8),
]

CALCULATOR_CASES = [
    ("7006652", "7006652", 1.0),
    ("7006652.0004", "7006652", 1.0),
    ("3.14159", "3.1416", 1.0),
    ("3.14", "3.1416", 0.0),
    ("1/3", "0.33333", 1.0),
    ("-2.5", "-2.5", 1.0),
    ("9449772114007", "9449772114007.0", 1.0),
    ("9.44977211e12", "9449772114007", 1.0),  # relative 1e-6 for large magnitudes
    ("9.45e12", "9449772114007", 0.0),
    ("1,024", "1024", 1.0),
    ("3+4j", "3+4j", 1.0),
    ("3+4i", "3+4j", 1.0),
    ("12 apples", "12", 1.0),  # a unit word is not a different number
    ("12 apples", "13", 0.0),
    ("abc", "1", 0.0),
    ("nan", "1", 0.0),
    ("inf", "inf", 0.0),
    ("0.001", "0.0015", 1.0),
    ("0.001", "0.0025", 0.0),
    ("1e-4", "0.0001", 1.0),
    ("1e400", "1", 0.0),
    ("1e300", "1e300", 1.0),
    ("1e-400", "0", 1.0),
    ("9" * 5000, "1", 0.0),
    ("\\frac{22}{7}", "3.142857", 1.0),
]

COMPLEX_CASES = [
    ("8104.4", "8104.4", 1.0),
    ("8,104.4 people/km²", "8104.4", 1.0),
    ("8500", "8104.4", 1.0),  # 4.9% off
    ("8600", "8104.4", 0.0),  # 6.1% off
    ("3.5 million", "3500000", 1.0),
    ("3.5 million (2020)", "3500000", 1.0),
    ("about 2 billion", "1.95 billion", 1.0),
    ("42%", "0.42", 1.0),
    ("no idea", "12", 0.0),
    ("0", "0", 1.0),
    ("0.1", "0", 0.0),
    ("-12", "12", 0.0),
    ("1e400", "1e400", 1.0),  # exact, no float overflow
    ("1e999", "1e999", 0.0),  # past the exponent guard: not read as a number
    ("1e300 exactly", "1e300", 1.0),
    ("1e300 and more", "1e300", 0.0),  # a bound: qualifiers.py
]

ALIAS_CASES = [
    ("fact", "Röntgen", ["Wilhelm Conrad Röntgen", "Röntgen", "W. C. Röntgen"], 1.0),
    ("em", "JFK", ["John F. Kennedy", "JFK"], 1.0),
    ("em", "Kennedy", ["John F. Kennedy", "JFK"], 0.0),
    ("f1", "Kennedy", ["John F. Kennedy", "JFK"], 0.5),
    ("math", "0.5", ["\\frac{1}{2}", "1/2"], 1.0),
    ("math", "2", ["-2", "2"], 1.0),
    ("calculator", "4", ["3", "4"], 1.0),
    ("complex", "100", ["1000", "10"], 0.0),
]


def _cases(kind: str, table: list[tuple[str, str, float]]) -> list[tuple[str, str, str, float]]:
    return [(kind, p, g, e) for p, g, e in table]


ALL_CASES = (
    _cases("math", MATH_CASES)
    + _cases("fact", FACT_CASES)
    + _cases("em", EM_CASES)
    + _cases("f1", F1_CASES)
    + _cases("calculator", CALCULATOR_CASES)
    + _cases("complex", COMPLEX_CASES)
)


@pytest.mark.parametrize(("kind", "predicted", "gold", "expected"), ALL_CASES)
def test_verify_table(kind: str, predicted: str, gold: str, expected: float) -> None:
    assert verify(kind, predicted, gold) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(("kind", "predicted", "golds", "expected"), ALIAS_CASES)
def test_max_over_aliases(kind: str, predicted: str, golds: list[str], expected: float) -> None:
    assert verify(kind, predicted, golds) == pytest.approx(expected, abs=1e-9)


def test_table_is_large_enough() -> None:
    assert len(ALL_CASES) + len(ALIAS_CASES) >= 150


def test_unknown_kind_is_named() -> None:
    with pytest.raises(ValueError, match="unknown verifier kind 'maths'"):
        verify("maths", "1", "1")


def test_empty_gold_list_is_an_error() -> None:
    with pytest.raises(ValueError, match="no gold answer"):
        verify("em", "1", [])
