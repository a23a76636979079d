"""Fast, exact handling of numeric and near-numeric math answers (no sympy).

`normalize_math` strips presentation (`$`, `\\left`, `\\text{}` units, `^\\circ`, `x =`,
thousands separators, `\\dfrac`) and `parse_number` reads integers, decimals, scientific
notation, `a/b`, `\\frac{a}{b}`, percentages and number words as exact `Fraction`s. Most
graded answers (GSM8K, AIME, calculator) are decided here in microseconds; only what this
module cannot decide goes to the symbolic checker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from pipeline.protocols.answers import last_boxed_span

NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
}  # fmt: skip
_SCALE_WORDS = {"hundred": 10**2, "thousand": 10**3, "lakh": 10**5, "million": 10**6, "crore": 10**7,
                "billion": 10**9, "trillion": 10**12}
# what may follow a number in free text (`number_in_text`): a scale word or its abbreviation (`3.5 mn`, `2bn`), a
# scale letter written against the number (`35k`, `3.5M`, `2B`: a lone lowercase `m` is metres, and `300 K` with a
# space is kelvins), written-out scientific notation (`3.5 \times 10^{6}`, `3.5 x 10^6`), a percent (`12 percent`)
_SCALE_WORD_RE = re.compile(r"\s*(?:(hundred|thousand|lakh|million|crore|billion|trillion)s?|(mn|mln|bn|tn))\b",
                            re.IGNORECASE)
# a sign written as a word just before a number ("negative 42", "minus 3.5"), looked for in the few characters there
_SIGN_WORD_RE = re.compile(r"\b(?:negative|minus)\s+$", re.IGNORECASE)
_SCALE_ABBREVIATIONS = {"mn": "million", "mln": "million", "bn": "billion", "tn": "trillion"}
_SCALE_LETTER_RE = re.compile(r"([kKMB])\b")
_SCALE_LETTERS = {"k": 10**3, "K": 10**3, "M": 10**6, "B": 10**9}
_TIMES_POWER_RE = re.compile(r"\s*(?:\\times|\\cdot|\*|x)\s*10\s*\^\s*\{?\s*([-+]?\d{1,4})\s*\}?")
_PERCENT_WORD = r"(?:\\text\{\s*)?(?:per\s?cent|pct)\b\.?(?:\s*\})?"
_PERCENT_AFTER_RE = re.compile(rf"\s*(?:\\?%|{_PERCENT_WORD})", re.IGNORECASE)
_PERCENT_WORD_RE = re.compile(rf"(?<=\d)\s*{_PERCENT_WORD}", re.IGNORECASE)
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)

_DROP_TOKENS = (
    "\\left", "\\right", "\\displaystyle", "\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\$", "$",
    "^{\\circ}", "^\\circ", "°", "{,}",
)  # fmt: skip
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox|operatorname)\{([^{}]*)\}")
_TRAILING_UNIT_RE = re.compile(r"(?<=[\d}.])\s*\\(?:text|mbox|mathrm)\{[^{}]*\}\s*$")
_VARIABLE_PREFIX_RE = re.compile(r"^\s*(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?\w+\}?)?\s*=\s*(?=\S)")
_THOUSANDS_RE = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC_RE = re.compile(r"^([-+]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}$")
_FRAC_SHORT_RE = re.compile(r"^([-+]?)\\[dt]?frac(\d)(\d)$")
_PLAIN_NUMBER_RE = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?$", re.IGNORECASE)
_MAX_NUMBER_CHARS = 400
_MAX_EXPONENT = 400
# atomic and possessive parts: the former `[\d,]*\.?\d+\s+` backtracked quadratically on a long run of digits
_UNIT_WORDS_RE = re.compile(r"^([-+]?(?>[\d,]*)(?>\.\d+)?)(?<=\d)\s++([A-Za-z][A-Za-z\s./]*+)$")
_MATH_WORDS = frozenset({"pi", "sqrt", "ln", "log", "sin", "cos", "tan", "exp", "inf", "infinity"})
_JOINING_WORDS = frozenset({"and", "or", "at", "up", "plus", "to"})  # "42 and up", "42 or so": never a unit
# words after a number that change its value and that no reader here computes: unit stripping keeps them, and the
# readers of free text refuse the number (`qualifiers`)
VALUE_WORDS = frozenset({"squared", "cubed", "factorial", "halves", "thirds", "quarters", "fourths", "fifths", "sixths",
                         "sevenths", "eighths", "ninths", "tenths", "hundredths", "thousandths", "millionths",
                         "billionths", "dozen", "dozens"})
_NUMBER_TOKEN_RE = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+", re.ASCII)


@dataclass(frozen=True)
class Number:
    """An exact value; `percent` is True when written with a % sign (value already divided by 100)."""

    value: Fraction
    percent: bool = False


@lru_cache(maxsize=65536)
def normalize_math(text: str) -> str:
    """Presentation-free form of a math answer (still a string; no evaluation)."""
    s = _PERCENT_WORD_RE.sub("%", text.strip())  # `50 percent` is `50%`, not 50 with a unit word
    span = last_boxed_span(s) if s.startswith("\\boxed{") else None
    if span is not None and span[1] == len(s) - 1 and span[0] == len("\\boxed{"):
        s = s[span[0] : span[1]]  # the whole answer is one box: \boxed{a} -> a
    for token in _DROP_TOKENS:
        s = s.replace(token, "")
    s = _TRAILING_UNIT_RE.sub("", s)
    s = _TEXT_RE.sub(r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _VARIABLE_PREFIX_RE.sub("", s, count=1)
    s = s.strip().rstrip(".").strip()
    s = _strip_unit_words(s)
    if _THOUSANDS_RE.match(s.replace(" ", "")):
        s = s.replace(",", "")
    return s.replace(" ", "")


# words that deny or bound the number beside them, so that it is not the answer: no unit ("98 is not the answer",
# "42 at least"), and no answer in a sentence (verifiers: "less than 5" is not 5)
DENIALS = frozenset({"not", "no", "never", "neither", "nor", "isn't", "except", "wrong", "incorrect",
                     "less", "fewer", "more", "greater", "least", "most", "over", "under", "above", "below", "than",
                     "exceeds", "exceeding", "beyond", "nearly", "almost"})


def _strip_unit_words(text: str) -> str:
    """`540 meters` -> `540`, `42 million people` -> `42e6`; single letters (`2 x`), math words (`2 pi`), denials
    and words that change the value (`42 squared`, `3 tenths`) are kept: none of them is a unit."""
    match = _UNIT_WORDS_RE.match(text)
    if match is None:
        return text
    number, words = match.group(1).replace(",", ""), match.group(2).lower().replace(".", " ").replace("/", " ").split()
    scale = _SCALE_WORD_RE.fullmatch(words[0])
    if scale is not None:  # a scale word multiplies: the number is not what it says without it
        number, words = f"{number}e{len(str(_scale_factor(scale))) - 1}", words[1:]
    if any(len(w) < 2 or w in _MATH_WORDS or w in DENIALS or w in VALUE_WORDS or w in _JOINING_WORDS for w in words):
        return text  # "98 is not the answer", "42 squared", "42 and up": no unit
    return number


def _plain_number(text: str) -> Fraction | None:
    # Guard 1e999999 and 5,000-digit strings: exact values that large are a denial of
    # service, not an answer (and Python refuses int() of over 4,300 digits).
    if len(text) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER_RE.match(text):
        return None
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and abs(int(exponent)) > _MAX_EXPONENT:
        return None
    return Fraction(mantissa) * (Fraction(10) ** int(exponent or 0))


def _ratio(sign: str, top: str, bottom: str) -> Fraction | None:
    num, den = _plain_number(top), _plain_number(bottom)
    if num is None or den is None or den == 0:
        return None
    return -num / den if sign == "-" else num / den


@lru_cache(maxsize=65536)
def parse_number(text: str) -> Number | None:
    """Exact value of a normalised answer that is a single number, else None."""
    s = text.strip()
    percent = s.endswith("%")
    if percent:
        s = s.rstrip("%").rstrip("\\")
    value = _plain_number(s)
    if value is None and s.lower() in NUMBER_WORDS:
        value = Fraction(NUMBER_WORDS[s.lower()])
    if value is None:
        frac = _FRAC_RE.match(s) or _FRAC_SHORT_RE.match(s)
        if frac:
            value = _ratio(*frac.groups())
    if value is None and s.count("/") == 1:
        top, bottom = s.split("/")
        sign = "-" if top.startswith("-") else ""
        value = _ratio(sign, top.lstrip("-+"), bottom)
    if value is None:
        return None
    return Number(value / 100, True) if percent else Number(value)


def numbers_equal(pred: Number, gold: Number, percent_asked: bool = False) -> bool:
    """Exact equality of a predicted and a gold number, under the percentage rule.

    A percentage is its value divided by 100 ("0.42%" is 0.0042, not 0.42), unless the problem asks
    for a percentage: then the number of percent also counts ("25%" for gold 25). A problem asks for
    one when the caller says so (`percent_asked`: its question names percent) or its gold is written
    as one ("50%": 0.5 and 50 both match it)."""
    preds, golds = percent_readings(pred, gold, percent_asked)
    for x in preds:
        for y in golds:
            if x == y:
                return True
            # Float-printed decimals (0.3333333333 for 1/3, 0.30000000000000004 for 0.3)
            # differ from the exact value in the last digits; 1e-9 relative absorbs that.
            # Two integers are compared exactly (999999999 is not 10^9); relative, not
            # absolute, so 1e-12 is not 2e-12.
            both_integers = x.denominator == 1 and y.denominator == 1
            if not both_integers and abs(x - y) <= Fraction(1, 10**9) * max(abs(x), abs(y)):
                return True
    return False


def percent_readings(pred: Number, gold: Number, percent_asked: bool = False) -> tuple[set[Fraction], set[Fraction]]:
    """The values a predicted and a gold number may stand for under the percentage rule (`numbers_equal`)."""
    asked = percent_asked or gold.percent
    preds = {pred.value, pred.value * 100} if pred.percent and asked else {pred.value}
    return preds, ({gold.value, gold.value * 100} if gold.percent else {gold.value})


def split_top_level(text: str) -> list[str] | None:
    """Items of a bracketed tuple/interval `(a,b]` split at top-level commas, else None."""
    if len(text) < 2 or text[0] not in "([" or text[-1] not in ")]":
        return None
    items, depth, start = [], 0, 1
    for i, ch in enumerate(text[1:-1], start=1):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:-1])
    return items if len(items) > 1 else None


def number_in_text(text: str) -> Number | None:
    """The first number written in free text with what follows it: a scale ("3.5 million", "2bn", "35k"),
    written-out scientific notation ("3.5 \\times 10^{6}") or a percent ("12%", "12 percent"), and a sign word
    before it ("negative 42"). Without a digit in the text, a number word ("two million")."""
    found = number_span_in_text(text)
    return None if found is None else found[0]


def number_span_in_text(text: str) -> tuple[Number, int, int] | None:
    """`number_in_text` with the span of `text` the number takes, its scale or percent included."""
    match = _NUMBER_TOKEN_RE.search(text)
    if match is not None:
        value = _plain_number(match.group().replace(",", ""))
    else:
        match = _NUMBER_WORD_RE.search(text)
        value = None if match is None else Fraction(NUMBER_WORDS[match.group(1).lower()])
    if match is None or value is None:
        return None
    start = match.start()
    sign = _SIGN_WORD_RE.search(text, max(0, start - 16), start)
    if sign is not None and match.group()[:1] not in "-+":  # "negative 42" is -42
        value, start = -value, sign.start()
    scaled = _scaled(value, text, match.end())
    return None if scaled is None else (scaled[0], start, scaled[1])


def _scale_factor(word: re.Match[str]) -> int:
    """The power of ten a `_SCALE_WORD_RE` match names ("million", "mn" -> 10**6)."""
    name = word.group(1) or _SCALE_ABBREVIATIONS[word.group(2).lower()]
    return _SCALE_WORDS[name.lower()]


def _scaled(value: Fraction, text: str, at: int) -> tuple[Number, int] | None:
    """`value` read with the scale, power of ten or percent written at `text[at:]`, and where that ends."""
    power = _TIMES_POWER_RE.match(text, at)
    if power is not None:
        exponent = int(power.group(1))
        if abs(exponent) > _MAX_EXPONENT:
            return None
        value, at = value * Fraction(10) ** exponent, power.end()
    percent = _PERCENT_AFTER_RE.match(text, at)  # LaTeX writes \%
    if percent is not None:
        return Number(value / 100, True), percent.end()
    letter = _SCALE_LETTER_RE.match(text, at)
    if letter is not None:
        return Number(value * _SCALE_LETTERS[letter.group(1)]), letter.end()
    word = _SCALE_WORD_RE.match(text, at)
    if word is not None:
        return Number(value * _scale_factor(word)), word.end()
    return Number(value), at


def tapo_normalize(text: str) -> str:
    """TAPO code's `normalize_answer`: strip, lower, number words 1-12, drop commas in digit strings."""
    s = text.strip().lower()
    words = {w: str(n) for w, n in NUMBER_WORDS.items() if 1 <= n <= 12}
    s = words.get(s, s)
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s
