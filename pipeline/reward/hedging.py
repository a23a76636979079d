"""Hedged answers: a prediction that names several different candidate values earns nothing.

Without this rule a verifier that reads one value out of the answer pays for listing candidates:
the complex verifier read the first number, so "1000 or 5000" and "between 960 and 5000" scored
1 for gold 1000, and token F1 gives "Paris or London" 0.5 for gold Paris. RL finds such a hack.

Candidates are found two ways, for every verifier kind, with the joining words of every language the verifiers
read (hedge_words.py: "or", ranges, "and", "between", words that introduce another answer and words of doubt,
compared as a reader sees them: `ᴏʀ`, `ｏｒ` and Cyrillic `оr` are "or"):
- alternatives in words: parts joined by "or" in any language (" or ", " eller ", "或", also `\\text{ or }`,
  `\\lor`, `\\vee`, "∨", " vs ", " and/or ", glued between digits: "3or1"), by a word that introduces another
  answer ("alternatively", "otherwise", "unless", "sinon"), or after a separator by a word of doubt (", maybe X",
  "(perhaps X)"), or an answer "between A and B" ("entre A et B"); in the text kinds (fact, em, f1) also parts
  joined by "/" or "|" or set on separate lines (a newline or a LaTeX line break `\\\\`);
- to a text kind (fact, em, f1) asked for one number (the gold is one), any two different numbers: token F1 gave
  "42 43" 0.67 against 42;
- numbers as alternatives: two numbers joined only by a connective: "or", "to", "and" after
  "between", "nor", "vs", "~", "|", "?", an ellipsis or an en or em dash ("98 – 99"), or by joining words of any
  language with glue among them and punctuation around them ("3 (maybe 1)", "3, but could be 1", "3 eller 1",
  "3 bis 5", "3或1"); for the numeric-text kinds (complex, calculator, which read one number) also "and" in any
  language, a comma, a semicolon, "±", an ASCII dash ("960-5000"; in math "x-1" is an expression, so not
  there), "/" for the complex kind (which reads the first number of "98/99"; to the others it is a fraction), a
  gap of separating punctuation alone ("98? 99?"), or a line break (a LaTeX `\\\\` too). A number in
  parentheses after another ("3.5 million (2020)") is a qualifier, not a candidate, unless a
  joining word opens the parentheses ("1000 (or 5000)").
A word of doubt beside one answer ("3 (possibly)") names no second candidate and is left to the kind.
Candidates that are equal ("1000 or 1,000") are one value. A gold answer that itself names
several values ("2, 3", "x = 2 or x = 3") turns the rule off for that gold alias: the kind's own
comparison decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction

from pipeline.reward.hedge_words import (AND, BETWEEN, DOUBT, GLUE, OR, OR_BETWEEN_NUMBERS, OTHERWISE, TO, fold,
                                         is_unspaced, words)

NUMERIC_TEXT_KINDS = frozenset({"complex", "calculator"})
TEXT_KINDS = frozenset({"fact", "em", "f1"})

_OR, _OR_NUMBERS = words(OR), words(OR_BETWEEN_NUMBERS)
_OTHERWISE, _DOUBT = words(OTHERWISE), words(DOUBT)
_JOINING = _OR | _OR_NUMBERS | words(TO) | _OTHERWISE | _DOUBT  # join two numbers in every kind
_AND = words(AND)  # and in the numeric-text kinds
_GLUE = frozenset(fold(word) for word in GLUE)
_SPLITTERS = _OR | _OTHERWISE | {"vs", "vs.", "versus", "and/or"}  # separate parts wherever they stand


def _alternation(found: Iterable[str]) -> str:
    """A pattern matching any of `found`, the longest first, behind a look-ahead at their first characters (so a
    position where none starts costs one test, not one per word)."""
    ordered = sorted(found, key=lambda w: (-len(w), w))
    firsts = "".join(sorted({re.escape(w[0]) for w in ordered}))
    return rf"(?=[{firsts}])(?:{'|'.join(map(re.escape, ordered))})"


def _spaced(found: Iterable[str]) -> str:
    return _alternation(w for w in found if not is_unspaced(w))


def _unspaced(found: Iterable[str]) -> str:
    """Unspaced words, each but where it begins a longer listed word it does not stand for ("或" is "or", "或许"
    is "perhaps")."""
    found = {w for w in found if is_unspaced(w) and w != "か"}  # kana か is "or" only between numbers
    longer = {w for w in _JOINING | _AND | _GLUE if is_unspaced(w)} - found
    firsts = "".join(sorted({re.escape(w[0]) for w in found}))
    alternatives = "|".join(
        re.escape(w) + "".join(f"(?!{re.escape(u[len(w):])})" for u in sorted(longer) if u.startswith(w))
        for w in sorted(found, key=lambda w: (-len(w), w)))
    return rf"(?=[{firsts}])(?:{alternatives})"


_AFTER_WORD = r"(?![\w'’-])"
_GLUED = [w for w in _JOINING if len(w) > 1 and " " not in w]  # written between digits: "3or1", "3to5"
# Every pattern here reads text a policy wrote, so none may backtrack more than linearly: runs of whitespace are
# taken whole (possessive `++`, and `(?<!\s)` so that a match starts only where a run does); "between" is split
# in code. The former patterns took hours on an answer of a few thousand spaces. They read folded text (`fold`).
_WORD_ALTERNATIVE_RE = re.compile(
    rf"(?<!\s)\s++{_spaced(_SPLITTERS)}{_AFTER_WORD}\s*+"  # " or ", " eller ", " otherwise "
    rf"|(?<!\s)\s*+[(,;:—–]\s*+{_spaced(_SPLITTERS | _DOUBT)}{_AFTER_WORD}\s*+"  # "(or ", ", maybe "
    rf"|(?<!\s)\s*+(?:{_unspaced(_SPLITTERS)})\s*+"  # "或", "または"
    rf"|(?<!\s)\s*+[(,;:、—–]\s*+(?:{_unspaced(_DOUBT)})\s*+"  # "，可能"
    rf"|(?<=\d){_spaced(_GLUED)}(?=[-+]?\.?\d)"  # "3or1"
    rf"|(?<!\s)\s*+∨\s*+|\\text\{{\s*+{_spaced(_SPLITTERS)}\s*+\}}|\\lor\b|\\vee\b")
_LATEX_BREAK = r"\\\\|\\(?:newline|linebreak|cr)(?![A-Za-z])"
_LATEX_BREAK_RE = re.compile(_LATEX_BREAK)
# in text answers also "Paris/London", "Paris | London" and one per line; in math these are 1/2, |x| and layout
_TEXT_ALTERNATIVE_RE = re.compile(_WORD_ALTERNATIVE_RE.pattern + rf"|(?<![ \t])[ \t]*+(?:[/|\n]|{_LATEX_BREAK})[ \t\n]*+")
_BETWEEN_START_RE = re.compile(rf"\W*+(?:somewhere\s++)?{_spaced(words(BETWEEN))}\s++")
_AND_RE = re.compile(rf"(?<!\s)\s++{_spaced(_AND)}\s++")
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
                "–", "—", "〜"}  # fmt: skip
_NUMERIC_TEXT_CONNECTIVES = {",", ";", "-", "and", "&"}
_SEPARATING = frozenset("?!…:|;,\"'、")
_PLUS_MINUS_RE = re.compile(r"±|∓|\\pm(?![a-zA-Z])|\\mp(?![a-zA-Z])")  # 98 ± 1 is an interval: two candidates to a reader of one number
_MAX_NUMBERS = 64  # an answer with more numbers than this is judged on its first ones


_GAP_BLANKS_RE = re.compile(  # what stands around joining words between two numbers without joining anything
    r"[\s,;:()\[\]{}!?.…—–\-\"`*_$|/~、。，；：（）「」【】]++|'(?!\w)|(?<!\w)'"
    r"|\\(?:text[a-z]*+|math[a-z]*+|mbox|quad|qquad)(?![A-Za-z])|\\[,;:! \\]")
_MAX_GAP = 120  # characters between two numbers read for joining words: theirs are short, and each gap is read once
_UNSPACED_JOINING_RE = re.compile(_alternation(w for w in _JOINING | _AND | _GLUE if is_unspaced(w)))
_PHRASE_WORDS = max(w.count(" ") + 1 for w in _JOINING | _AND | _GLUE)


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
    folded = fold(text)  # parts are compared, never read: their folded form is as good
    between = _between(folded)
    splitter = _TEXT_ALTERNATIVE_RE if kind in TEXT_KINDS else _WORD_ALTERNATIVE_RE
    parts = [_canonical(p) for p in (between or splitter.split(folded))]
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
    joining = _JOINING | _AND if kind in NUMERIC_TEXT_KINDS else _JOINING
    found: list[Fraction | None] = []
    for left, right in zip(matches, matches[1:]):
        scale = _SCALE_RE.match(text, left.end())
        assert scale is not None  # every part of the pattern is optional: it matches anywhere
        after_left = scale.end()
        raw = text[after_left:right.start()]
        gap = " ".join(fold(raw).split())
        before = text[max(0, left.start() - 40):left.start()].rstrip().casefold()
        between = gap == "and" and before.endswith("between") and not before[:-7][-1:].isalnum()
        opens_alternative = gap.startswith("(") and gap[1:].strip() in connectives
        if (gap in connectives or between or opens_alternative or _signed_range(gap, right.group(), kind)
                or _side_by_side(_LATEX_BREAK_RE.sub("\n", text[left.end():right.start()]), gap, kind)
                or _joined_by_words(gap, joining)):
            found += [_value(left.group()), _value(right.group())]
    return [v for v in found if v is not None]


def _joined_by_words(gap: str, joining: frozenset[str]) -> bool:
    """Whether the (folded) text between two numbers joins them as alternatives: set apart from the punctuation,
    brackets and LaTeX text wrappers around them, its words are joining words and glue, at least one joining
    ("(maybe", ", but could be", "eller", "或者", "\\text{ or }")."""
    if len(gap) > _MAX_GAP:
        return False
    spaced = _UNSPACED_JOINING_RE.sub(lambda m: f" {m.group()} ", gap)
    tokens = _GAP_BLANKS_RE.sub(" ", spaced).split()
    # reach[i]: None when tokens[:i] cannot be read as joining words and glue, else whether one of them joins
    reach: list[bool | None] = [False] + [None] * len(tokens)
    for i in range(len(tokens)):
        if reach[i] is None:
            continue
        for width in range(1, min(_PHRASE_WORDS, len(tokens) - i) + 1):
            phrase = " ".join(tokens[i:i + width])
            joins = phrase in joining
            if joins or phrase in _GLUE:
                reach[i + width] = bool(reach[i + width]) or joins or bool(reach[i])
    return reach[-1] is True


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
