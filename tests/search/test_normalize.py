"""Query normalisation and the fuzzy-merge guard, including the guard set of near misses and true variants."""

from __future__ import annotations

import difflib

from hypothesis import given
from hypothesis import strategies as st

from sandbox.search.fuzzy import FuzzyIndex
from sandbox.search.normalize import is_numeric_token, may_merge, normalize_query, plural_stem, query_terms
from tests.search.conftest import read_pairs


def served_from(query: str, cached: str, known_words: frozenset[str]) -> bool:
    """Would the cache answer `query` with the results stored for `cached` (exact or fuzzy)?"""
    index = FuzzyIndex(0.9, known_words=known_words)
    index.add(normalize_query(cached))
    return normalize_query(query) == normalize_query(cached) or index.lookup(normalize_query(query)) is not None


def test_normalize_query() -> None:
    assert normalize_query("  What IS the Capital of France?! ") == "what is the capital of france"
    assert normalize_query("Ｐｏｐｕｌａｔｉｏｎ of China, in 2010") == "population of china in 2010"
    assert normalize_query("3.5 million") == "3.5 million"
    assert normalize_query("1,000 people") == "1000 people"
    assert normalize_query("world-war II") == "world war ii"
    assert normalize_query("what's C#") == "what is c#"
    assert normalize_query("isn't it") == "is not it"
    assert normalize_query("Romeo & Juliet at AT&T") == "romeo and juliet at at&t"


def test_plural_stem_and_numerals() -> None:
    assert plural_stem("presidents") == "president"
    assert plural_stem("countries") == "country"
    assert plural_stem("churches") == "church"
    assert plural_stem("is") == "is"
    assert plural_stem("1990s") == "1990s"
    assert all(is_numeric_token(t) for t in ["i", "ii", "iv", "xiv", "2010", "3.5", "19th"])
    assert not any(is_numeric_token(t) for t in ["war", "civil", "world"])


def test_guard_set_near_misses_never_merge(known_words: frozenset[str]) -> None:
    pairs = read_pairs("near_misses.tsv")
    assert len(pairs) >= 50
    merged = [pair for pair in pairs if served_from(*pair, known_words)]
    assert merged == []
    # The set is meaningful: TAPO's difflib rule (ratio >= 0.9) would merge most of these pairs.
    difflib_merges = sum(difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio() >= 0.9 for a, b in pairs)
    assert difflib_merges >= 40


def test_guard_set_true_variants_merge(known_words: frozenset[str]) -> None:
    pairs = read_pairs("true_variants.tsv")
    assert len(pairs) >= 50
    served = [pair for pair in pairs if served_from(*pair, known_words)]
    assert len(served) / len(pairs) >= 0.95
    fuzzy_only = [p for p in pairs if normalize_query(p[0]) != normalize_query(p[1])]
    assert len(fuzzy_only) >= 30  # most pairs need the fuzzy path, not just normalisation


def test_known_words_are_not_typos_of_each_other() -> None:
    a, b = query_terms("what is the largest planet"), query_terms("what is the largest plant")
    assert may_merge(a, b, 0.9)
    assert not may_merge(a, b, 0.9, known_words=frozenset({"planet", "plant"}))


@given(st.integers(0, 3000), st.integers(0, 3000))
def test_different_numbers_never_merge(x: int, y: int) -> None:
    a = query_terms(normalize_query(f"population of the united kingdom in {x}"))
    b = query_terms(normalize_query(f"population of the united kingdom in {y}"))
    assert may_merge(a, b, 0.5) == (x == y)


@given(st.text(max_size=60))
def test_normalize_is_idempotent(text: str) -> None:
    once = normalize_query(text)
    assert normalize_query(once) == once
