"""A candidate index over cached queries, so a fuzzy lookup never scans every key.

TAPO's cache SCANs up to 200 Redis keys and runs difflib on each: slow (seconds at 100k keys with a
full scan) and arbitrary (it only sees whichever 200 keys SCAN returns). This index finds every
cached query that can pass the guard of `sandbox.search.normalize.may_merge`, and only those:

- Rule 2 of the guard says a match has the same words as the query, except at most one typo'd word
  (or the same words joined differently: a spacing variant). So a match contains at least
  (m - 1) of the query's m words exactly, and therefore at least 2 of its 3 rarest words
  (or 1 of its 2 when m = 2). Postings (word -> sorted entry ids) are intersected with numpy.
- A one-word query may be one typo away from a one-word entry: one-word entries are also indexed
  under their single-deletion variants (SymSpell), which catch any single edit.
- Spacing variants are found through a dict keyed by the words joined without spaces.

Candidates are then cut by two exact bounds, both vectorised: the same number of words (the guard
aligns words one to one), and |len(a) - len(b)| <= (1 - threshold) * (len(a) + len(b)) (the Indel
distance is at least the length difference). The survivors are ranked with rapidfuzz's C++
`fuzz.ratio` and the best one that passes the guard wins.
`max_candidates` bounds the work for queries made only of very common words (documented trade-off:
such a query may miss a fuzzy hit, never get a wrong one).
"""

from __future__ import annotations

from array import array
from collections import defaultdict

import numpy as np
from rapidfuzz import fuzz, process

from sandbox.search.normalize import TYPO_MIN_LETTERS, QueryTerms, may_merge, query_terms


def _deletions(word: str) -> set[str]:
    return {word[:i] + word[i + 1 :] for i in range(len(word))} | {word}


def _intersect_sorted(small: np.ndarray, big: np.ndarray) -> np.ndarray:
    """Ids in both sorted postings, in O(|small| log |big|): a common word's posting can hold a
    quarter of all entries, and a merge-style intersection would walk all of it."""
    if len(small) > len(big):
        small, big = big, small
    if len(small) == 0:
        return small
    at = np.searchsorted(big, small).clip(max=len(big) - 1)
    return small[big[at] == small]


def _single_word_deletions(terms: QueryTerms) -> set[str]:
    """SymSpell keys of a one-word query, for the word as written and plural-stripped (the guard accepts
    a typo in either form)."""
    if len(terms.words) != 1:
        return set()
    return set().union(*(_deletions(w) for w in {terms.words[0], terms.raw[0]} if len(w) >= TYPO_MIN_LETTERS))


class FuzzyIndex:
    """Normalised cached queries with a guarded nearest-match lookup. Not thread-safe; one per event loop."""

    def __init__(self, threshold: float = 0.9, max_candidates: int = 5000,
                 known_words: frozenset[str] = frozenset()) -> None:
        self.threshold = threshold
        self.known_words = known_words
        self.max_candidates = max_candidates
        self._texts: list[str | None] = []  # entry id -> normalised query (None once removed)
        self._word_counts = array("H")  # entry id -> number of words (the guard aligns words one to one)
        self._lengths = array("I")  # entry id -> characters (the ratio bounds the length difference)
        self._ids: dict[str, int] = {}
        self._postings: dict[str, array] = defaultdict(lambda: array("I"))
        # arrays, not lists: they are invisible to the cyclic GC, which otherwise rescans millions of
        # containers while a big index is built
        self._compact: dict[str, array] = defaultdict(lambda: array("I"))

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, normalized: str) -> bool:
        return normalized in self._ids

    def add(self, normalized: str) -> None:
        if normalized in self._ids or not normalized:
            return
        entry = len(self._texts)
        self._texts.append(normalized)
        self._ids[normalized] = entry
        terms = query_terms(normalized)
        self._word_counts.append(min(len(terms.words), 65535))
        self._lengths.append(len(normalized))
        for word in set(terms.words):
            self._postings[word].append(entry)
        for variant in _single_word_deletions(terms):
            self._postings["\x00" + variant].append(entry)
        self._compact[terms.compact].append(entry)

    def remove(self, normalized: str) -> None:
        """Forget an entry (expired in Redis). Its postings stay; lookups skip removed ids."""
        entry = self._ids.pop(normalized, None)
        if entry is not None:
            self._texts[entry] = None

    def _posting(self, key: str) -> np.ndarray:
        found = self._postings.get(key)
        if found is None:
            return np.empty(0, dtype=np.uint32)
        return np.frombuffer(found, dtype=np.uint32)

    def _candidate_ids(self, terms: QueryTerms) -> np.ndarray:
        words = sorted(set(terms.words), key=lambda w: len(self._postings.get(w, ())))
        if len(words) >= 3:
            p1, p2, p3 = (self._posting(w) for w in words[:3])
            pairs = [_intersect_sorted(x, y) for x, y in ((p1, p2), (p1, p3), (p2, p3))]
            found = np.concatenate(pairs)
        elif len(words) == 2:
            found = np.concatenate([self._posting(words[0]), self._posting(words[1])])
        elif len(terms.words) == 1 and len(words[0]) >= TYPO_MIN_LETTERS:
            found = np.concatenate([self._posting("\x00" + v) for v in _single_word_deletions(terms)])
        else:
            found = np.concatenate([self._posting(w) for w in words] or [np.empty(0, dtype=np.uint32)])
        found = np.unique(found)
        # Word-aligned matches have the same number of words; spacing variants come from the compact map.
        found = found[np.frombuffer(self._word_counts, dtype=np.uint16)[found] == len(terms.words)]
        spaced = np.frombuffer(self._compact.get(terms.compact, array("I")), dtype=np.uint32)
        ids = np.union1d(found, spaced).astype(np.int64)
        # ratio >= t needs |len(a) - len(b)| <= (1 - t) * (len(a) + len(b)), the Indel distance's lower bound.
        lengths = np.frombuffer(self._lengths, dtype=np.uint32)[ids].astype(np.int64)
        n = len(terms.text)
        ids = ids[np.abs(lengths - n) <= (1.0 - self.threshold) * (lengths + n) + 1e-9]
        return ids[: self.max_candidates]

    def lookup(self, normalized: str) -> str | None:
        """The cached query that may answer `normalized` (never itself), or None."""
        terms = query_terms(normalized)
        texts = [t for t in (self._texts[i] for i in self._candidate_ids(terms)) if t is not None and t != normalized]
        if not texts:
            return None
        ranked = process.extract(normalized, texts, scorer=fuzz.ratio, limit=None,
                                 score_cutoff=self.threshold * 100.0)
        for text, _score, _pos in ranked:
            if may_merge(terms, query_terms(text), self.threshold, self.known_words):
                return text
        return None
