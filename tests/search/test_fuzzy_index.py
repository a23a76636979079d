"""The candidate index finds exactly what a full scan with the same guard finds, on real questions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from rapidfuzz import fuzz

from sandbox.search.fuzzy import FuzzyIndex, _intersect_sorted
from sandbox.search.normalize import may_merge, normalize_query, query_terms


def _questions(shared_data: Path, n: int) -> list[str]:
    lines = (shared_data / "nq_open" / "NQ-open.dev.jsonl").read_text().splitlines()[:n]
    return [normalize_query(json.loads(line)["question"]) for line in lines]


def _typo(word: str, rng: random.Random) -> str:
    i = rng.randrange(1, len(word))
    return word[:i] + word[i + 1:] if rng.random() < 0.5 else word[:i] + rng.choice("aeiou") + word[i:]


def _variant(question: str, rng: random.Random) -> str:
    words = question.split()
    long_words = [i for i, w in enumerate(words) if len(w) >= 6 and w.isalpha()]
    roll = rng.random()
    if roll < 0.4 and long_words:
        i = rng.choice(long_words)
        words[i] = _typo(words[i], rng)
    elif roll < 0.6:
        words = [w for w in words if w != "the"] if "the" in words else ["the", *words]
    elif roll < 0.8:
        words.append(str(rng.randrange(1900, 2030)))
    else:
        words[rng.randrange(len(words))] = rng.choice(["who", "what", "when", "year", "first", "name"])
    return " ".join(words)


def _full_scan(query: str, keys: list[str]) -> float:
    """Best ratio among all keys the guard accepts (0 when none): what a linear scan would find."""
    terms = query_terms(query)
    scores = [fuzz.ratio(query, k) for k in keys if k != query and may_merge(terms, query_terms(k), 0.9)]
    return max(scores, default=0.0)


def test_index_matches_full_scan(shared_data: Path) -> None:
    rng = random.Random(0)
    keys = sorted(set(_questions(shared_data, 1500)))
    index = FuzzyIndex(0.9)
    for key in keys:
        index.add(key)
    queries = [_variant(rng.choice(keys), rng) for _ in range(300)]
    found = 0
    for query in queries:
        expected = _full_scan(query, keys)
        matched = index.lookup(query)
        got = fuzz.ratio(query, matched) if matched is not None else 0.0
        assert got == expected, (query, matched)
        found += matched is not None
    assert found >= 60  # the typo and article variants are found


def test_remove_and_readd() -> None:
    index = FuzzyIndex(0.9)
    index.add("who discovered penicillin")
    assert index.lookup("who discovered penicilin") == "who discovered penicillin"
    index.remove("who discovered penicillin")
    assert len(index) == 0 and index.lookup("who discovered penicilin") is None
    index.add("who discovered penicillin")
    assert index.lookup("who discovered penicilin") == "who discovered penicillin"


def test_single_word_typo_and_spacing() -> None:
    index = FuzzyIndex(0.9)
    index.add("photosynthesis")
    index.add("new york city population")
    assert index.lookup("photosynthesys") == "photosynthesis"
    assert index.lookup("einstien") is None  # one edit, but below the 0.9 ratio on a short string
    assert index.lookup("newyork city population") == "new york city population"
    assert index.lookup("photosynthesis") is None  # never returns the query itself


@given(st.sets(st.integers(0, 500)), st.sets(st.integers(0, 500)))
def test_sorted_intersection(a: set[int], b: set[int]) -> None:
    x, y = (np.array(sorted(s), dtype=np.uint32) for s in (a, b))
    assert _intersect_sorted(x, y).tolist() == sorted(a & b)
