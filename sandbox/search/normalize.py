"""Query normalisation and the guard that decides whether two cached queries may share results.

`normalize_query` gives the exact-cache key text: Unicode NFKC, lower case, hyphens/slashes/dashes
turned into spaces, other punctuation dropped (a decimal point between digits is kept, so "3.5"
never becomes "35"; thousands commas go, so "1,000" == "1000"; "#%&@" and symbols such as "+" stay,
so "c#" and "c++" keep apart from "c"), whitespace collapsed. Question-word contractions are
expanded ("what's" -> "what is", "isn't" -> "is not", "can't" -> "can not") and a free-standing
"&" reads "and", so those spellings share a key.

`may_merge(a, b)` is the fuzzy rule. TAPO accepts any cached query whose difflib ratio is >= 0.9,
which merges "population of china in 2010" with "... in 2020" and "world war i" with "world war ii".
Here a fuzzy hit needs ALL of:

1. every number token (anything with a digit: "2010", "1990s", "3.5", "19th") and every Roman
   numeral token ("i", "ii", "iv", "xiv", ...) identical, in the same order;
2. the same words in the same order once articles (a, an, the) are dropped, where two words count as
   the same when they are equal after plural stripping ("presidents" = "president",
   "countries" = "country"), or when both have >= 5 letters, start with the same letter and are one
   edit apart (insert, delete, substitute, swap neighbours): "einstien" = "einstein". At most one
   such typo per query, and not when both words are real words of the known vocabulary (the BM25
   index's vocabulary when one is built): "planet"/"plant" and "carter"/"carver" are one edit apart
   but are different words. Words under 5 letters ("who"/"how", "is"/"was", "not", "of") must match
   exactly, which keeps question words, tense and negation apart;
   - spacing variants pass too: the words, joined without spaces, are equal ("new york" = "newyork");
3. the Indel similarity of the normalised strings (rapidfuzz `fuzz.ratio`, the same number as
   difflib's ratio on these inputs) is at least the threshold (0.9 by default).

So "austria"/"australia" (two edits), "2010"/"2020", "war i"/"war ii", "is"/"is not" never merge.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from rapidfuzz import fuzz
from rapidfuzz.distance import OSA

ARTICLES = frozenset({"a", "an", "the"})
TYPO_MIN_LETTERS = 5

_DIGIT = re.compile(r"\d")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
# Punctuation that changes what is asked ("c#" vs "c", "at&t", "100%") is kept.
_KEPT_PUNCTUATION = frozenset("#%&@")
_CONTRACTIONS = [
    (re.compile(r"\b(can|won)['’]t\b"), lambda m: {"can": "can not", "won": "will not"}[m.group(1)]),
    (re.compile(r"n['’]t\b"), lambda m: " not"),
    (re.compile(r"\b(what|who|where|when|how|why|which|it|that|there)['’]s\b"), lambda m: m.group(1) + " is"),
    (re.compile(r"['’]re\b"), lambda m: " are"),
]
_AMPERSAND = re.compile(r"(?<!\w)&(?!\w)")  # "romeo & juliet", not "at&t"
_SEPARATORS = re.compile(r"[-\u2010-\u2015/\\_]+")
_ROMAN = re.compile(r"^(?=[mdclxvi]+$)m{0,4}(cm|cd|d?c{0,3})(xc|xl|l?x{0,3})(ix|iv|v?i{0,3})$")


def _drop_punctuation(text: str) -> str:
    out = []
    for i, ch in enumerate(text):
        if unicodedata.category(ch).startswith("P") and ch not in _KEPT_PUNCTUATION:
            # A decimal point between two digits is part of the number.
            if ch == "." and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit():
                out.append(ch)
            continue
        out.append(ch)
    return "".join(out)


def normalize_query(query: str) -> str:
    """The cache key text of a query (see the module docstring)."""
    text = unicodedata.normalize("NFKC", query).lower()
    text = _THOUSANDS.sub("", text)
    for pattern, expand in _CONTRACTIONS:
        text = pattern.sub(expand, text)
    text = _SEPARATORS.sub(" ", text)  # first: "&_" must meet the "&" rule as the "& " it becomes (idempotence)
    text = _AMPERSAND.sub(" and ", text)
    text = _drop_punctuation(text)
    return " ".join(text.split())


@lru_cache(maxsize=1 << 18)  # words repeat across queries; this is the hot path of building the index
def plural_stem(word: str) -> str:
    """Strip an English plural/possessive ending; applied to both sides, so over-stripping is harmless."""
    if len(word) < 4 or _DIGIT.search(word):
        return word
    if word.endswith("ies") and len(word) >= 5:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@lru_cache(maxsize=1 << 18)
def is_numeric_token(token: str) -> bool:
    """Numbers and Roman numerals: tokens that must be identical for a fuzzy merge."""
    return bool(_DIGIT.search(token) or _ROMAN.match(token))


@dataclass(frozen=True)
class QueryTerms:
    """The parts of a normalised query the guard compares."""

    text: str  # normalised query
    raw: tuple[str, ...]  # non-article tokens as written
    words: tuple[str, ...]  # the same, plural-stemmed (numbers kept verbatim)
    numbers: tuple[str, ...]  # number and Roman-numeral tokens, in order

    @property
    def compact(self) -> str:
        return "".join(self.words)


def query_terms(normalized: str) -> QueryTerms:
    tokens = [t for t in normalized.split() if t not in ARTICLES]
    return QueryTerms(
        text=normalized,
        raw=tuple(tokens),
        words=tuple(plural_stem(t) for t in tokens),
        numbers=tuple(t for t in tokens if is_numeric_token(t)),
    )


def is_typo(a: str, b: str, known_words: frozenset[str] = frozenset()) -> bool:
    """Two different words that are one edit apart, long enough, same first letter, not both real words."""
    if is_numeric_token(a) or is_numeric_token(b) or a[0] != b[0]:
        return False
    if len(a) < TYPO_MIN_LETTERS or len(b) < TYPO_MIN_LETTERS:
        return False
    if a in known_words and b in known_words:
        return False
    return OSA.distance(a, b, score_cutoff=1) <= 1


def words_match(a: QueryTerms, b: QueryTerms, known_words: frozenset[str] = frozenset()) -> bool:
    """Rule 2 of the module docstring: aligned words equal up to plural and one typo, or spacing."""
    if a.compact == b.compact:
        return True
    if len(a.words) != len(b.words):
        return False
    typos = 0
    for stem_a, stem_b, raw_a, raw_b in zip(a.words, b.words, a.raw, b.raw):
        if stem_a == stem_b:
            continue
        if not (is_typo(raw_a, raw_b, known_words) or is_typo(stem_a, stem_b, known_words)):
            return False
        typos += 1
    return typos <= 1


def may_merge(a: QueryTerms, b: QueryTerms, threshold: float, known_words: frozenset[str] = frozenset()) -> bool:
    """Whether a cached result for `b` may answer query `a` (the full rule of the module docstring)."""
    if a.numbers != b.numbers or not words_match(a, b, known_words):
        return False
    return fuzz.ratio(a.text, b.text, score_cutoff=threshold * 100.0) > 0.0
