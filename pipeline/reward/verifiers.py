"""Verifiers: f_T(prediction, gold aliases) -> [0, 1] for each answer kind, cached.

Kinds (TAPO Tables 4-5 plus the QA metrics of Search-R1 and ARPO):
- math: equivalence. Exact numeric comparison first (numeric.py: 1/2 == 0.5 == \\frac{1}{2},
  50% ~ 0.5, 1,000 == 1000, `x = 3` == 3, `\\text{}` units dropped, tuples and intervals
  element-wise); what that cannot decide goes to math-verify in a killable worker under
  a time limit (symbolic.py). `math_mode="strict"` is TAPO's paper/code rule instead:
  equality of `tapo_normalize`d strings.
- fact: TAPO Eq. 8 (normalised Levenshtein), em: exact match, f1: token F1 (textmatch.py).
- calculator: |pred - gold| < abs_tol, or relative error < rel_tol for large magnitudes.
- complex: relative error < 5%, reading the first number of the prediction (with a scale
  word such as "million"). TAPO's code instead deletes every non-digit character, which
  turns "3.5 million (2020)" into 3.52020; this reads the number that was written.

These rules hold for every kind:
- Answers and golds are read as a reader sees them (`presentation.readable`): invisible format characters
  dropped, digits of every script as ASCII digits, markup around the whole answer (`**42**`, `$42$`,
  `\\boxed{42}`, `Answer: 42`) taken off; the numeric kinds (math, calculator, complex) then read
  Unicode math notation (`−5`, `3 × 10⁴`, `√16`, `½`, `≈ 3.14`) as the ASCII/LaTeX their parsers read
  (`unicode_math.ascii_math`).
- No credit for hedging (hedging.py): an answer that names several different candidate values
  ("1000 or 5000", "between 960 and 5000", "Paris or London") scores 0 against a gold that names
  one, whatever the kind would read out of it.
- A number is what its neighbours make it (qualifiers.py): "42 million" is 4.2e7 to the numeric kinds, and
  "negative 42" is -42 to those that read sentences (math, complex); a bound, denial or uncomputed operation
  beside it ("more than 42", "\\geq 42", "42+", "42 is wrong", "42 squared", "half of 42") is not 42 in any
  numeric kind.
- Percentages: "p%" is p / 100 ("0.42%" is not 0.42), unless the problem asks for a percentage,
  that is its gold is written with % or its question names percent (`asks_for_percentage`); then
  the number of percent matches too ("25%" for gold 25, "25" for gold "25%").

Every score is the max over gold aliases. Results are cached per (kind, prediction, sorted
aliases): a group of G samples usually repeats a handful of answers, and the expensive
symbolic check then runs once per distinct pair.
"""

from __future__ import annotations

import cmath
import re
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache, partial

from pipeline.config.reward import RewardConfig
from pipeline.reward.hedging import is_hedged
from pipeline.reward.numeric import (
    DENIALS,
    Number,
    normalize_math,
    number_in_text,
    number_span_in_text,
    numbers_equal,
    parse_number,
    percent_readings,
    split_top_level,
    tapo_normalize,
)
from pipeline.reward.numeval import evaluate
from pipeline.reward.presentation import readable
from pipeline.reward.qualifiers import is_qualified
from pipeline.reward.symbolic import SymbolicChecker
from pipeline.reward.textmatch import exact_match, fact_score, token_f1
from pipeline.reward.unicode_math import ascii_math

VERIFIER_KINDS: tuple[str, ...] = ("math", "fact", "calculator", "complex", "em", "f1")

PairScore = Callable[[str, str, bool], float]  # (predicted, gold, percent asked) -> score
# A run of 3+ letters that is not a LaTeX command (`\\sqrt`) nor a function name: a word.
_SCIENTIFIC_RE = re.compile(r"^([-+]?\d+(?:\.\d+)?)(?:\\times|\\cdot|\*|x)10\^\{?([-+]?\d+)\}?$")
_NUMBER_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?|\d+(?:\.\d*)?|\.\d+")
# prose: words of two or more letters (or `a`, `I`) and sentence punctuation, no variable, operator or LaTeX
_PROSE_RE = re.compile(r"(?:[A-Za-z]{2,}|\b[aAI]\b|[\s,.;:!?'\"’()])*+")
_NEGATION_RE = re.compile(rf"\b(?:{'|'.join(map(re.escape, sorted(DENIALS)))})\b|n't\b", re.IGNORECASE)
_PLAIN_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_FUNCTION_NAMES = frozenset(
    {"sin", "cos", "tan", "cot", "sec", "csc", "log", "exp", "sqrt", "inf", "infty", "arcsin", "arccos", "arctan"}
)


_ASKS_PERCENT_RE = re.compile(r"\bper\s?cent(?:age)?s?\b", re.IGNORECASE)


def asks_for_percentage(question: str) -> bool:
    """Whether a question asks for its answer in percent (it names percent or percentage)."""
    return _ASKS_PERCENT_RE.search(question) is not None


def _has_plain_word(normalized: str) -> bool:
    return any(m.group().lower() not in _FUNCTION_NAMES for m in _PLAIN_WORD_RE.finditer(normalized))


def fast_math_equal(pred: str, gold: str, percent_asked: bool = False) -> bool | None:
    """Decide equivalence without sympy when possible; None means "ask the symbolic checker"."""
    p, g = normalize_math(pred), normalize_math(gold)
    if not p:
        return False
    p_num, g_num = parse_number(p), parse_number(g)
    if g_num is not None and _qualified(pred, evaluates_notation=True):
        # "≥ 42", "42 and up", "42 squared", "half of 42": a bound or another value, not 42 (qualifiers.py); before
        # comparing the normalised forms, whose unit stripping reads "and up" as a unit
        return False
    if p == g:
        return True
    if p_num is not None and g_num is not None:
        return numbers_equal(p_num, g_num, percent_asked)
    wordy, as_written = (p, pred) if g_num is not None else (g, gold)
    if (p_num is None) != (g_num is None) and _has_plain_word(wordy):
        if len(_NUMBER_RE.findall(as_written)) != 1 or _NEGATION_RE.search(as_written):
            # words against a number: "Paris" is not 48, nor is a sentence naming several numbers ("97 is wrong,
            # the answer is 98": math-verify would credit whichever it reads, a channel for hedges) or denying its
            # number ("the answer is not 48")
            return False
        said = _number_said(as_written)
        # prose around one number ("so the result is 48."): that number, its sign and % kept; exactly one of
        # p_num and g_num is a number here
        if said is not None and g_num is not None:
            return numbers_equal(said, g_num, percent_asked)
        if said is not None and p_num is not None:
            return numbers_equal(p_num, said, percent_asked)
    # a number already read stays read: `1e-3` is no expression to the evaluator (nor to math-verify: 1*e - 3)
    p_val, g_val = _value_of(p_num, p), _value_of(g_num, g)
    if p_val is not None and g_val is not None:
        scale = max(abs(p_val), abs(g_val))  # relative: 10^{-12} is not 2*10^{-12}
        if abs(p_val - g_val) <= 1e-9 * scale:
            return True
        if abs(p_val - g_val) > 1e-6 * scale:
            return False
    elif _differ_at_some_point(p, g):
        return False
    p_items, g_items = split_top_level(p), split_top_level(g)
    if p_items is not None and g_items is not None:
        if (p[0], p[-1]) != (g[0], g[-1]) or len(p_items) != len(g_items):
            return None if len(p_items) == len(g_items) else False
        verdicts = [fast_math_equal(a, b, percent_asked) for a, b in zip(p_items, g_items, strict=True)]
        if all(v is True for v in verdicts):
            return True
        if any(v is False for v in verdicts) and all(parse_number(normalize_math(x)) for x in p_items + g_items):
            return False
    return None


def _number_said(text: str) -> Number | None:
    """The number a sentence says when it says one number and nothing else of math: words of two or more letters
    and sentence punctuation around it ("So the result is 48.", "It is 5% of them"); None when anything else is
    there (`2x`, `is x`, an operator, LaTeX), which is left to the symbolic checker."""
    found = number_span_in_text(text)
    if found is None:
        return None
    number, start, end = found
    return number if _PROSE_RE.fullmatch(text, 0, start) and _PROSE_RE.fullmatch(text, end) else None


def _qualified(text: str, *, evaluates_notation: bool) -> bool:
    """Whether the first number of `text` is bounded, denied or changed by the words and symbols beside it."""
    found = number_span_in_text(text)
    return found is not None and is_qualified(text, found[1], found[2], evaluates_notation=evaluates_notation)


def _value_of(number: Number | None, text: str) -> float | None:
    if number is None:
        return evaluate(text)
    try:
        return float(number.value)
    except OverflowError:
        return None


def _differ_at_some_point(p: str, g: str) -> bool:
    """Two expressions in variables whose values differ at a fixed point are not equivalent."""
    for point in (0, 1):
        p_val, g_val = evaluate(p, point), evaluate(g, point)
        if p_val is None or g_val is None:
            return False
        if abs(p_val - g_val) > 1e-6 * max(abs(p_val), abs(g_val)):
            return True
    return False


def _exact_or_complex(text: str) -> Fraction | complex | None:
    """An exact real (our parser), else a complex number Python can read ("3+4i"), else a number in written-out
    scientific notation ("1.2 \\times 10^{3}"), else None."""
    number = parse_number(normalize_math(text))
    if number is not None:
        return number.value
    try:
        value = complex(normalize_math(text).replace("i", "j"))
    except ValueError:
        # scientific notation written out (3 \times 10^{4}); no other expression: an answer that repeats the
        # problem's arithmetic ("17 + 25") has not computed it
        scientific = _SCIENTIFIC_RE.match(normalize_math(text))
        if scientific is None:
            return None
        number = parse_number(f"{scientific.group(1)}e{scientific.group(2)}")  # its exponent bound too
        return number.value if number is not None else None
    return value if cmath.isfinite(value) else None


def calculator_score(pred: str, gold: str, percent_asked: bool = False, *, abs_tol: float, rel_tol: float) -> float:
    p_num, g_num = parse_number(normalize_math(pred)), parse_number(normalize_math(gold))
    if p_num is not None and g_num is not None:
        return float(any(_within(x, y, abs_tol, rel_tol) for x, y in _pairs(p_num, g_num, percent_asked)))
    p, g = _exact_or_complex(pred), _exact_or_complex(gold)
    if p is None or g is None:
        return 0.0
    if isinstance(p, complex) or isinstance(g, complex):
        p, g = _as_complex(p), _as_complex(g)  # huge exact values do not fit a float
        if p is None or g is None:
            return 0.0
    return float(_within(p, g, abs_tol, rel_tol))


def _within(p: Fraction | complex, g: Fraction | complex, abs_tol: float, rel_tol: float) -> bool:
    error = _magnitude(p - g)  # exact when both are Fractions: 10^400 vs 10^400 + 1 is not a float question
    # the tolerance exact too: a float times a Fraction past 1.8e308 overflows
    return error < abs_tol or error <= _magnitude(g) * Fraction(rel_tol)


def _magnitude(x: Fraction | complex) -> Fraction | float:
    """|x|: a Fraction's exact, a complex's a float (split so each `abs` has one type to infer)."""
    return abs(x) if isinstance(x, Fraction) else abs(x)


def _pairs(pred: Number, gold: Number, percent_asked: bool) -> list[tuple[Fraction, Fraction]]:
    preds, golds = percent_readings(pred, gold, percent_asked)
    return [(x, y) for x in preds for y in golds]


def _as_complex(value: Fraction | complex) -> complex | None:
    try:
        return complex(value)
    except OverflowError:
        return None


def complex_score(pred: str, gold: str, percent_asked: bool = False, *, rel_tol: float) -> float:
    found = number_span_in_text(pred)  # read once: the number and whether its neighbours qualify it
    qualified = found is not None and is_qualified(pred, found[1], found[2], evaluates_notation=False)
    p = None if found is None or qualified else found[0]
    g = number_in_text(gold)
    if p is None or g is None:
        return 0.0
    # the tolerance as the decimal it is written as: the float 0.05 exceeds 1/20, so 19 passed for 20 at "< 5%"
    tolerance = Fraction(repr(rel_tol))
    return float(any(x == y if y == 0 else abs(x - y) / abs(y) < tolerance for x, y in _pairs(p, g, percent_asked)))


def _math_readable(text: str) -> str:
    return ascii_math(readable(text))


# what each kind reads: every kind the answer without its typesetting (`presentation`), the numeric kinds also
# Unicode math notation as ASCII/LaTeX (`unicode_math`)
_READERS = {"math": _math_readable, "calculator": _math_readable, "complex": _math_readable}


class Verifier:
    """All verifier kinds with one config, resolved once; `score` is cached and thread-safe."""

    def __init__(self, cfg: RewardConfig, checker: SymbolicChecker | None = None) -> None:
        self.checker = checker or SymbolicChecker(cfg.verify_timeout_s, cfg.symbolic_workers)
        fold = cfg.fold_diacritics
        self._symbolic_math = cfg.math_mode == "equivalent"
        math_score: PairScore = self._math_equivalent if self._symbolic_math else _math_strict
        self._pair_scores: dict[str, PairScore] = {
            "math": math_score,
            "fact": partial(_fact, max_ratio=cfg.fact_max_ratio, fold=fold),
            "em": partial(_em, fold=fold),
            "f1": partial(_f1, fold=fold),
            "calculator": partial(calculator_score, abs_tol=cfg.calculator_abs_tol, rel_tol=cfg.calculator_rel_tol),
            "complex": partial(complex_score, rel_tol=cfg.complex_rel_tol),
        }
        self._cached = lru_cache(maxsize=cfg.cache_size)(self._score_uncached) if cfg.cache_size else self._score_uncached

    def score(self, kind: str, predicted: str, gold: str | Sequence[str], percent_asked: bool = False) -> float:
        """max over gold aliases of f_kind(predicted, alias), in [0, 1]; 0 for an alias the prediction hedges
        against (hedging.py). `percent_asked`: the problem asks for a percentage (`asks_for_percentage`)."""
        if kind not in self._pair_scores:
            raise ValueError(f"unknown verifier kind {kind!r}; expected one of {VERIFIER_KINDS}")
        golds = (gold,) if isinstance(gold, str) else tuple(gold)
        if not golds:
            raise ValueError("no gold answer given")
        read = _READERS.get(kind, readable)
        return self._cached(kind, read(predicted), tuple(sorted({read(g) for g in golds})), percent_asked)

    def needs_symbolic(self, kind: str, predicted: str, golds: Sequence[str], percent_asked: bool = False) -> bool:
        """Whether scoring this answer would call the symbolic checker (the slow path)."""
        if kind != "math" or not self._symbolic_math:
            return False
        predicted, golds = _math_readable(predicted), [_math_readable(gold) for gold in golds]
        verdicts = [fast_math_equal(predicted, gold, percent_asked) for gold in golds if not is_hedged(predicted, gold, kind)]
        return True not in verdicts and None in verdicts

    def cache_info(self) -> str:
        return str(self._cached.cache_info()) if hasattr(self._cached, "cache_info") else "no cache"

    def _score_uncached(self, kind: str, predicted: str, golds: tuple[str, ...], percent_asked: bool) -> float:
        pair_score = self._pair_scores[kind]
        best = 0.0
        for gold in golds:
            if is_hedged(predicted, gold, kind):
                continue
            best = max(best, pair_score(predicted, gold, percent_asked))
            if best >= 1.0:
                break
        return min(1.0, max(0.0, best))

    def _math_equivalent(self, pred: str, gold: str, percent_asked: bool = False) -> float:
        fast = fast_math_equal(pred, gold, percent_asked)
        if fast is not None:
            return float(fast)
        # math-verify gets the raw strings: the space-free form above would turn `\sin x` into `\sinx`.
        return float(self.checker.equivalent(pred.strip(), gold.strip()))


def _math_strict(pred: str, gold: str, percent_asked: bool = False) -> float:
    return float(bool(pred.strip()) and tapo_normalize(pred) == tapo_normalize(gold))


def _fact(pred: str, gold: str, percent_asked: bool, max_ratio: float, fold: bool) -> float:
    return fact_score(pred, gold, max_ratio, fold)


def _em(pred: str, gold: str, percent_asked: bool, fold: bool) -> float:
    return exact_match(pred, gold, fold)


def _f1(pred: str, gold: str, percent_asked: bool, fold: bool) -> float:
    return token_f1(pred, gold, fold)
