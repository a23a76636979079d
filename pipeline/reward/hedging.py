"""Hedged answers: a prediction that names several different candidate values earns nothing.

Without this rule a verifier that reads one value out of the answer pays for listing candidates:
the complex verifier read the first number, so "1000 or 5000" and "between 960 and 5000" scored
1 for gold 1000, and token F1 gives "Paris or London" 0.5 for gold Paris. RL finds such a hack.

Candidates are found two ways, for every verifier kind:
- alternatives in words: parts joined by " or " / " nor " / " vs " / " and/or " (also `\\text{ or }`, `\\lor`,
  `\\vee`, "∨", "oder", "ou"), or an answer "between A and B"; in the text kinds (fact, em, f1) also parts joined
  by "/" or "|" or set on separate lines;
- to a text kind (fact, em, f1) asked for one number (the gold is one), any two different numbers: token F1 gave
  "42 43" 0.67 against 42;
- numbers as alternatives: two numbers joined only by a connective: "or", "to", "and" after
  "between", "nor", "vs", "~", "|", "?", an ellipsis or an en or em dash ("98 – 99"), and for the numeric-text
  kinds (complex, calculator, which read one number) also "and", a comma, a semicolon, "±", an ASCII dash
  ("960-5000"; in math "x-1" is an expression, so not there), "/" for the complex kind (which reads the first
  number of "98/99"; to the others it is a fraction), a gap of separating punctuation alone ("98? 99?"), or
  a line break. A number in
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

# Every pattern here reads text a policy wrote, so none may backtrack more than linearly: runs of whitespace are
# taken whole (possessive `++`, and `(?<!\s)` so that a match starts only where a run does); "between" is split
# in code. The former patterns took hours on an answer of a few thousand spaces.
_WORD_ALTERNATIVE_RE = re.compile(
    r"(?<!\s)\s++(?:or|nor|vs\.?|versus|and/or|oder|ou)\s++|(?<!\s)\s*+\((?:or|nor)\s++|(?<!\s)\s*+∨\s*+"
    r"|\\text\{\s*+or\s*+\}|\\lor\b|\\vee\b", re.IGNORECASE)
# in text answers also "Paris/London", "Paris | London" and one per line; in math these are 1/2, |x| and layout
_TEXT_ALTERNATIVE_RE = re.compile(_WORD_ALTERNATIVE_RE.pattern + r"|(?<![ \t])[ \t]*+[/|\n][ \t\n]*+", re.IGNORECASE)
TEXT_KINDS = frozenset({"fact", "em", "f1"})
_BETWEEN_START_RE = re.compile(r"\W*+(?:somewhere\s++)?between\s++", re.IGNORECASE)
_AND_RE = re.compile(r"(?<!\s)\s++and\s++", re.IGNORECASE)
_NUMBER_RE = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?(?!,*+\d)",
                        re.ASCII)
_ONE_NUMBER_RE = re.compile(r"\s*+[-+]?(?:\d{1,3}(?:,\d{3})++|\d++)(?:\.\d+)?%?\s*")
# comma digit groups (a plain space separates two numbers: "42 430" is two); a chain starts only at its head, so
# one that fails at its end is scanned once
_DIGIT_GROUPS_RE = re.compile(r"(?<![\d.])(?<!\d,)[1-9]\d{0,2}(?:,\d{3})++(?!\d)")
_DOT_RUN_RE = re.compile(r"\.{2,}")  # "42..97" is a range, not 42 and a fraction part ".97"
_PLAIN_NUMBER_RE = re.compile(r"(?<![\d.])-?(?:\d+(?:\.\d+)?|\.\d+)", re.ASCII)
_LIST_RE = re.compile(r"[,;]|(?<!\s)\s++and\s++")
_SCALE_RE = re.compile(r"\s*(?:%|\\%|thousand|million|billion|trillion)?", re.IGNORECASE)
_CONNECTIVES = {"or", "to", "nor", "~", "or maybe", "or perhaps", "or possibly", "or about", "or so", "or else",
                "and/or", "vs", "vs.", "versus", "oder", "ou", "o", "|", "||", "∨", "\\lor", "\\vee", "?", "…", "...",
                "–", "—"}  # fmt: skip
_NUMERIC_TEXT_CONNECTIVES = {",", ";", "-", "and"}
_SEPARATING = frozenset("?!…:|;,\"'")
_PLUS_MINUS_RE = re.compile(r"±|∓|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])")  # 98 ± 1 is an interval: two candidates to a reader of one number
_MAX_NUMBERS = 64  # an answer with more numbers than this is judged on its first ones


def is_hedged(predicted: str, gold: str, kind: str) -> bool:
    """Whether `predicted` names several different candidate values where `gold` names one."""
    if _names_several(gold, kind):
        return False
    if kind in TEXT_KINDS and _ONE_NUMBER_RE.fullmatch(gold):
        # asked for one number, a text kind gave partial credit to a list of numbers ("42 43" was 0.67 in F1
        # against 42, more than a wrong guess): an answer naming two different numbers names candidates
        return _several_candidates(predicted, kind) or _names_two_numbers(predicted)
    return _several_candidates(predicted, kind)


def _names_two_numbers(text: str) -> bool:
    """Whether `text` names two different numbers (comma digit groups joined first: `1,000` is one)."""
    joined = _DOT_RUN_RE.sub(" ", _DIGIT_GROUPS_RE.sub(lambda m: m.group().replace(",", ""), text))
    values: set[str] = set()
    for match in _PLAIN_NUMBER_RE.finditer(joined):
        sign, _, digits = match.group().rpartition("-")
        whole, _, fraction = digits.partition(".")
        value = (whole.lstrip("0") or "0") + "." + fraction.rstrip("0")  # as a string: 10^5 digits are no int
        values.add(sign + value if value != "0." else value)
        if len(values) > 1:
            return True
    return False


def _names_several(gold: str, kind: str) -> bool:
    """A gold that lists values itself (alternatives, a comma or semicolon list, "a and b"), read as broadly as
    the kind reads answers ("AC/DC" names two to a text kind: its own spelling must not be a hedge)."""
    return (any(_several_candidates(gold, reading) for reading in {"complex", kind})
            or len(_LIST_RE.split(gold.strip())) > 1)


def _several_candidates(text: str, kind: str) -> bool:
    between = _between(text)
    splitter = _TEXT_ALTERNATIVE_RE if kind in TEXT_KINDS else _WORD_ALTERNATIVE_RE
    parts = [_canonical(p) for p in (between or splitter.split(text))]
    if len({p for p in parts if p}) > 1:
        return True
    if kind in NUMERIC_TEXT_KINDS and _PLUS_MINUS_RE.search(text):
        return True
    return len(set(_alternative_numbers(text, kind))) > 1


def _between(text: str) -> tuple[str, str] | None:
    """The two ends of an answer "between A and B" (A up to the first " and "), or None."""
    start = _BETWEEN_START_RE.match(text)
    if start is None:
        return None
    ends = _AND_RE.split(text[start.end():], maxsplit=1)
    if len(ends) != 2:
        return None
    low, high = ends[0], _without_trailing_non_word(ends[1])
    return (low, high) if low and high else None


def _without_trailing_non_word(text: str) -> str:
    end = len(text)
    while end and not (text[end - 1].isalnum() or text[end - 1] == "_"):
        end -= 1
    return text[:end]


def _canonical(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text.casefold())  # 1,000 is 1000
    return " ".join(re.sub(r"[^\w.%]+", " ", text).split()).strip(" .")


def _alternative_numbers(text: str, kind: str) -> list[Fraction]:
    """The values of numbers that stand as alternatives to a neighbour (empty when none do)."""
    matches = list(_NUMBER_RE.finditer(text))[:_MAX_NUMBERS]
    connectives = _CONNECTIVES | (_NUMERIC_TEXT_CONNECTIVES if kind in NUMERIC_TEXT_KINDS else set())
    if kind == "complex":  # reads the first number of "98/99"; to the calculator kind it is a fraction
        connectives = connectives | {"/"}
    found: list[Fraction] = []
    for left, right in zip(matches, matches[1:]):
        after_left = _SCALE_RE.match(text, left.end()).end()
        gap = " ".join(text[after_left:right.start()].casefold().split())
        before = text[max(0, left.start() - 40):left.start()].rstrip().casefold()
        between = gap == "and" and before.endswith("between") and not before[:-7][-1:].isalnum()
        opens_alternative = gap.startswith("(") and gap[1:].strip() in connectives
        if (gap in connectives or between or opens_alternative or _signed_range(gap, right.group(), kind)
                or _side_by_side(text[left.end():right.start()], gap, kind)):
            found += [_value(left.group()), _value(right.group())]
    return [v for v in found if v is not None]


def _side_by_side(raw_gap: str, gap: str, kind: str) -> bool:
    """In numeric text (which reads one number), two numbers with nothing but separating punctuation between them
    ("98? 99?", "98! 99") or on separate lines are two candidates; operators ("3 \\times 10^{4}", "1/3") and an
    opening parenthesis ("3.5 million (2020)", a qualifier) are not separators."""
    if kind not in NUMERIC_TEXT_KINDS:
        return False
    if "\n" in raw_gap:
        return True
    return bool(gap) and all(ch in _SEPARATING or ch.isspace() for ch in gap)


def _signed_range(gap: str, right: str, kind: str) -> bool:
    """"960 -5000" reads the dash as the second number's sign: still a range in numeric text."""
    return kind in NUMERIC_TEXT_KINDS and gap == "" and right[0] in "-–"


def _value(number: str) -> Fraction | None:
    try:
        return Fraction(number.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None
