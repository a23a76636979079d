"""Hedged answers: a prediction that names several different candidate values earns nothing.

Without this rule a verifier that reads one value out of the answer pays for listing candidates:
the complex verifier read the first number, so "1000 or 5000" and "between 960 and 5000" scored
1 for gold 1000, and token F1 gives "Paris or London" 0.5 for gold Paris. RL finds such a hack.

Candidates are found two ways, for every verifier kind:
- alternatives in words: parts joined by " or " / " nor " (also `\\text{ or }`, `\\lor`, `\\vee`),
  or an answer of the form "between A and B";
- numbers as alternatives: two numbers joined only by a connective: "or", "to", "and" after
  "between", "nor", "/", "~", and for the numeric-text kinds (complex, calculator) also a comma,
  a semicolon or a dash ("960-5000"; in math "x-1" is an expression, so not there). A number in
  parentheses after another ("3.5 million (2020)") is a qualifier, not a candidate, unless a
  connective opens the parentheses ("1000 (or 5000)").
Candidates that are equal ("1000 or 1,000") are one value. A gold answer that itself names
several values ("2, 3", "x = 2 or x = 3") turns the rule off for that gold alias: the kind's own
comparison decides.
"""

from __future__ import annotations

import re
from fractions import Fraction

NUMERIC_TEXT_KINDS = frozenset({"complex", "calculator"})

_WORD_ALTERNATIVE_RE = re.compile(r"\s+(?:or|nor)\s+|\\text\{\s*or\s*\}|\\lor\b|\\vee\b", re.IGNORECASE)
_BETWEEN_RE = re.compile(r"^\W*(?:somewhere\s+)?between\s+(.+?)\s+and\s+(.+?)\W*$", re.IGNORECASE | re.DOTALL)
_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?![\d,]*\d)",
                        re.ASCII)
_SCALE_RE = re.compile(r"\s*(?:%|\\%|thousand|million|billion|trillion)?", re.IGNORECASE)
_CONNECTIVES = {"or", "to", "nor", "~", "or maybe", "or perhaps", "or possibly", "or about", "or so"}
_NUMERIC_TEXT_CONNECTIVES = {",", ";", "-", "–", "—", "and/or"}
_MAX_NUMBERS = 64  # an answer with more numbers than this is judged on its first ones


def is_hedged(predicted: str, gold: str, kind: str) -> bool:
    """Whether `predicted` names several different candidate values where `gold` names one."""
    if _names_several(gold):
        return False
    return _several_candidates(predicted, kind)


def _names_several(gold: str) -> bool:
    """A gold that lists values itself (alternatives, a comma or semicolon list, "a and b")."""
    return _several_candidates(gold, "complex") or len(re.split(r"[,;]|\s+and\s+", gold.strip())) > 1


def _several_candidates(text: str, kind: str) -> bool:
    between = _BETWEEN_RE.match(text)
    parts = [_canonical(p) for p in (between.groups() if between else _WORD_ALTERNATIVE_RE.split(text))]
    if len({p for p in parts if p}) > 1:
        return True
    return len(set(_alternative_numbers(text, kind))) > 1


def _canonical(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.casefold())  # 1,000 is 1000
    return " ".join(re.sub(r"[^\w.%]+", " ", text).split()).strip(" .")


def _alternative_numbers(text: str, kind: str) -> list[Fraction]:
    """The values of numbers that stand as alternatives to a neighbour (empty when none do)."""
    matches = list(_NUMBER_RE.finditer(text))[:_MAX_NUMBERS]
    connectives = _CONNECTIVES | (_NUMERIC_TEXT_CONNECTIVES if kind in NUMERIC_TEXT_KINDS else set())
    found: list[Fraction] = []
    for left, right in zip(matches, matches[1:]):
        after_left = _SCALE_RE.match(text, left.end()).end()
        gap = " ".join(text[after_left:right.start()].casefold().split())
        between = gap == "and" and re.search(r"\bbetween\s*$", text[:left.start()], re.IGNORECASE)
        opens_alternative = gap.startswith("(") and gap[1:].strip() in connectives
        if gap in connectives or between or opens_alternative or _signed_range(gap, right.group(), kind):
            found += [_value(left.group()), _value(right.group())]
    return [v for v in found if v is not None]


def _signed_range(gap: str, right: str, kind: str) -> bool:
    """"960 -5000" reads the dash as the second number's sign: still a range in numeric text."""
    return kind in NUMERIC_TEXT_KINDS and gap == "" and right[0] in "-–"


def _value(number: str) -> Fraction | None:
    try:
        return Fraction(number.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
