"""Words and symbols beside a number that change what it says, so that no verifier credits the bare number.

A reader that takes "the number in the answer" (the complex kind's first number, the math kind's number in a
sentence, the unit-word stripping of the math and calculator kinds) credited wrong statements: "42 squared",
"half of 42", "more than 42", "at least 42", "≥ 42", "x < 42", "42+", "42 or more" and "42 is wrong" all scored 1
against 42 in some kind. Two classes are refused here, judged only from the words next to the number:
- operations no reader here computes: "42 squared", "42 cubed", "3 tenths", "half of 42", "twice 42", "the square
  root of 42", "the reciprocal of 42", and to a reader of one number in text (not of expressions) also "42^2" and
  "\\sqrt{42}";
- bounds and denials: a relation before the number (`>`, `≥`, `\\geq`, `x <`), a word that bounds or denies it
  right before ("more than", "at least", "nearly", "not") or in the two words after ("or more", "at most", "is
  wrong", "isn't"), and a trailing "+" that is no sum ("42+").
What a reader can apply is read instead (`numeric.number_span_in_text`): scale words ("42 million") and sign
words ("negative 42"). Words further away, and after the end of the number's clause ("3.5 million, not counting
the suburbs"), are context, not qualifiers.
"""

from __future__ import annotations

import re

from pipeline.reward.numeric import DENIALS, VALUE_WORDS

# read as the words just before the number (lower case, single spaces), "of" taken off
_OPERATIONS_BEFORE = ("twice", "double", "triple", "thrice", "half", "halve", "square root", "cube root", "root",
                      "reciprocal", "inverse", "logarithm")
# math a reader of expressions evaluates (`\\sqrt{16}` is 4), right before the number: `\\sqrt{42}`, `sqrt 42`, `\\log(42)`
_NOTATION_BEFORE_RE = re.compile(r"(?<![A-Za-z])\\?(?:sqrt|log|ln|exp)(?:\[[^\]]{0,8}\])?\s*[{(]?\s*$")
_BOUNDS_BEFORE = DENIALS - {"no"}  # "no more than 42" is caught by "more"; "No. 42" is a number
_DENIALS_AFTER = frozenset({"not", "never", "wrong", "incorrect", "isn't", "aren't", "wasn't"})
_BOUNDS_AFTER = frozenset({"more", "less", "fewer", "greater", "above", "below", "over", "under", "higher", "lower",
                           "up", "least", "most"})
_WINDOW = 40  # characters looked at on each side: enough for three words, and constant time on any answer
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+(?:'[a-z]+)?")  # words, not LaTeX commands: `42 \\text{ or more}`
_RELATION_BEFORE_RE = re.compile(r"(?:[<>≤≥≠≪≫⩽⩾]=?|\\(?:[gl]eq?(?:slant)?|[gl]t|neq?|ngtr|nless)(?![A-Za-z]))\s*$")
_PLUS_AFTER_RE = re.compile(r"\s*\+(?!\s*[\w(\\{$])")  # "42+" bounds; "42 + 1" is a sum
_POWER_AFTER_RE = re.compile(r"\s*(?:\^|\*\*)")  # "42^2" (a power of ten after a mantissa is read before this)
_CLAUSE_END_RE = re.compile(r"[,.;:!?()\[\]]")


def is_qualified(text: str, start: int, end: int, *, evaluates_notation: bool) -> bool:
    """Whether the number written at `text[start:end]` is changed, bounded or denied by what stands beside it.
    `evaluates_notation`: the reader computes math notation (`42^2`, `\\sqrt{42}`), so only words qualify."""
    return (_qualified_before(text[max(0, start - _WINDOW):start], evaluates_notation)
            or _qualified_after(text[end:end + _WINDOW], evaluates_notation))


def _qualified_before(before: str, evaluates_notation: bool) -> bool:
    if _RELATION_BEFORE_RE.search(before):
        return True
    words = [w.lower() for w in _WORD_RE.findall(_CLAUSE_END_RE.split(before)[-1])][-3:]
    if words and (words[-1] in _BOUNDS_BEFORE or words[-1].endswith("n't")):
        return True  # every bound ends next to its number: "more than", "at least", "not", "over", "isn't"
    lead = " ".join(words[:-1] if words[-1:] == ["of"] else words)
    if any(lead == op or lead.endswith(" " + op) for op in _OPERATIONS_BEFORE):
        return True
    return not evaluates_notation and _NOTATION_BEFORE_RE.search(before) is not None


def _qualified_after(after: str, evaluates_notation: bool) -> bool:
    if _PLUS_AFTER_RE.match(after) or (not evaluates_notation and _POWER_AFTER_RE.match(after)):
        return True
    words = [w.lower() for w in _WORD_RE.findall(_CLAUSE_END_RE.split(after, maxsplit=1)[0])][:2]
    if words[:1] and words[0] in VALUE_WORDS or any(w in _DENIALS_AFTER for w in words):
        return True
    return len(words) == 2 and words[0] in ("or", "and", "at") and words[1] in _BOUNDS_AFTER
