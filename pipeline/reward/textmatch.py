"""Answer matching for text answers: TAPO's f_fact (Eq. 8), exact match and token F1.

All three compare normalised strings: Unicode NFKC, case-folded, optionally without
accents, punctuation (any Unicode P* character; but digit-group commas, apostrophes and abbreviation points
are joined, decimal points and a leading minus kept) and the articles a/an/the dropped, number words zero to
twenty written as digits ("two" is "2"), whitespace collapsed (the SQuAD normaliser that Search-R1 and ARPO use, made
Unicode-aware). The score against a list of gold aliases is the max over them, so alias
order never matters.

Departures from the anchors:
1. TAPO's code gives 1.0 whenever the gold is a substring of the prediction; Eq. 8 does
   not, and the substring rule pays a model for listing candidates, so it is left out.
2. TAPO's code normalises only case and number words; here f_fact uses the full
   normaliser, so "The Eiffel Tower." and "eiffel tower" are equal.
3. Token F1 keeps ARPO's yes/no/noanswer rule: such answers score only by exact match.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

from rapidfuzz.distance import Levenshtein

from pipeline.reward.numeric import NUMBER_WORDS

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
_GROUPED_DIGITS_RE = re.compile(r"(?<![\d,])\d{1,3}(?:,\d{3})+(?![\d,])")
_DIGITS_OF_WORD = {word: str(value) for word, value in NUMBER_WORDS.items()}  # "two" is "2", as in TAPO's code
_JOINING = frozenset(".'\u2019\u02bc")  # inside a word: U.S., O'Neil, 1990's


@lru_cache(maxsize=65536)
def normalize_text(text: str, fold_diacritics: bool = True) -> str:
    """NFKC, casefold, (accents dropped), punctuation dropped, articles dropped, number words as digits, spaces
    collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    if fold_diacritics:
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    text = _without_punctuation(text.replace("\u2212", "-"))
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(_DIGITS_OF_WORD.get(token, token) for token in text.split())


def _without_punctuation(text: str) -> str:
    """Punctuation becomes a space, so "Jean-Paul" and "Jean Paul" agree, except where it is part of a word or a
    number: digit-group commas and apostrophes and abbreviation points are dropped ("1,000" is "1000", "U.S." is
    "us", "O'Neil" is "oneil"), and a decimal point or a leading minus is kept ("3.5" is not "35", "-5" not "5")."""
    text = _GROUPED_DIGITS_RE.sub(lambda m: m.group().replace(",", ""), text)
    kept = []
    for i, ch in enumerate(text):
        if not unicodedata.category(ch).startswith("P"):
            kept.append(ch)
            continue
        before, after = text[i - 1] if i else " ", text[i + 1] if i + 1 < len(text) else " "
        if ch == "." and before.isdigit() and after.isdigit():
            kept.append(ch)
        elif ch == "-" and after.isdigit() and not before.isalnum():
            kept.append(ch)
        elif ch in _JOINING and before.isalnum():
            continue
        else:
            kept.append(" ")
    return "".join(kept)


def levenshtein_ratio(a: str, b: str) -> float:
    """lev(a, b) / max(|a|, |b|) in [0, 1]; 0 for two empty strings."""
    longest = max(len(a), len(b))
    return Levenshtein.distance(a, b) / longest if longest else 0.0


def fact_score(predicted: str, gold: str, max_ratio: float = 0.5, fold_diacritics: bool = True) -> float:
    """TAPO Eq. 8: 1 - r if r <= max_ratio else 0, with r the normalised Levenshtein ratio."""
    pred = normalize_text(predicted, fold_diacritics)
    ref = normalize_text(gold, fold_diacritics)
    if not pred or not ref:
        return 0.0
    ratio = levenshtein_ratio(pred, ref)
    return 1.0 - ratio if ratio <= max_ratio else 0.0


def exact_match(predicted: str, gold: str, fold_diacritics: bool = True) -> float:
    """1.0 when the normalised strings are equal (Search-R1 EM), else 0.0."""
    pred = normalize_text(predicted, fold_diacritics)
    return float(bool(pred) and pred == normalize_text(gold, fold_diacritics))


def token_f1(predicted: str, gold: str, fold_diacritics: bool = True) -> float:
    """SQuAD token F1 over normalised whitespace tokens (ARPO's reward)."""
    pred = normalize_text(predicted, fold_diacritics)
    ref = normalize_text(gold, fold_diacritics)
    if (pred in _SPECIAL_ANSWERS or ref in _SPECIAL_ANSWERS) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    common = sum((Counter(pred_tokens) & Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)
