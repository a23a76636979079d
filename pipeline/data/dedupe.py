"""Duplicate and contamination detection over normalised question text.

- Exact duplicates: same normalised text (NFKC, lower case, prose punctuation dropped, spaces
  collapsed). Signs, decimal points and math symbols are kept: "-32.9" is not "32.9" and
  "3+5" is not "3-5".
- Near duplicates: Jaccard similarity of token-3-gram sets at or above a threshold *and* a
  shared normalised answer. The answer condition is ours: math variants that change one number
  ("...rceil$" vs "...rceil^2$") and fact questions about another year look alike but are
  different problems. Candidates come from MinHash locality-sensitive hashing (32 hashes in 8
  bands of 4) and are confirmed with the exact Jaccard, so LSH never makes a false match; it
  finds a pair at Jaccard 0.9 with probability 0.9998 (0.985 at 0.8, 0.89 at 0.7).
- Contamination: a training row sharing any word n-gram (13 by default, as in GPT-3's and
  DeepSeek's decontamination) with any evaluation row. Shorter rows are covered by the exact
  and near-duplicate checks, which run over both splits together.

All hashing uses crc32 and a fixed-seed permutation table, so results are the same in every
process (Python's `hash()` of strings is salted per process).
"""

from __future__ import annotations

import functools
import re
import unicodedata
import zlib
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

_TOKEN = re.compile(r"-?\d+(?:[.,]\d+)*|\w+|[^\w\s]")
_PROSE = frozenset(".,;:!?'\"`\u201c\u201d\u2018\u2019")
_PRIME = np.uint64(4294967291)  # largest prime below 2**32
_N_HASHES, _BAND_ROWS = 32, 4
_RNG = np.random.default_rng(20250101)
_A = _RNG.integers(1, 2**31, size=_N_HASHES, dtype=np.uint64)
_B = _RNG.integers(0, 2**31, size=_N_HASHES, dtype=np.uint64)
_BAND_MIX = _RNG.integers(1, 2**63, size=(1, _BAND_ROWS), dtype=np.uint64) | np.uint64(1)


@functools.lru_cache(maxsize=1 << 17)
def _all_tokens(text: str) -> tuple[str, ...]:
    # Cached: each question is tokenised by the exact, near-duplicate and n-gram checks.
    text = unicodedata.normalize("NFKC", text).lower()
    return tuple(t for t in _TOKEN.findall(text) if t not in _PROSE)


def normalize(text: str) -> str:
    return " ".join(_all_tokens(text))


def tokens(text: str) -> list[str]:
    """Words and numbers only: the units of n-gram contamination checks."""
    return [t for t in _all_tokens(text) if t[-1].isalnum() or t[-1] == "_"]


def shingles(words: Sequence[str], n: int = 3) -> frozenset[str]:
    if len(words) < n:
        return frozenset([" ".join(words)])
    return frozenset(" ".join(words[i:i + n]) for i in range(len(words) - n + 1))


def _band_keys(signature: np.ndarray) -> list[tuple[int, int]]:
    """One integer per band of `_BAND_ROWS` hashes (a multiply-sum mix, wrapping in uint64)."""
    mixed = (signature.reshape(-1, _BAND_ROWS) * _BAND_MIX).sum(axis=1)
    return list(enumerate(mixed.tolist()))


def _minhash(shingle_set: frozenset[str]) -> np.ndarray:
    h = np.fromiter((zlib.crc32(s.encode("utf-8")) for s in shingle_set), dtype=np.uint64, count=len(shingle_set))
    # (a*h + b) mod p for 64 (a, b) pairs at once: a < 2**31 and h < 2**32 keep it under 2**63.
    return ((np.outer(_A, h) + _B[:, None]) % _PRIME).min(axis=1)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class Deduper:
    """Remembers kept questions; `check` says whether a new one duplicates a kept one.

    LSH buckets are keyed by (answer, band): a near duplicate must share an answer anyway, and
    keying by it keeps buckets small for templated sets (2Wiki's "Who is the mother of the
    director of film X?") whose questions would otherwise all land in the same few buckets.
    Only the first `MAX_KEYED_ANSWERS` aliases of a row are keyed.
    """

    MAX_KEYED_ANSWERS = 8

    def __init__(self, near_threshold: float) -> None:
        self.near_threshold = near_threshold
        self._exact: dict[str, str] = {}
        self._shingles: dict[str, frozenset[str]] = {}
        self._buckets: dict[tuple[str, int, int], list[str]] = defaultdict(list)

    def check(self, key: str, question: str, answers: tuple[str, ...], near: bool) -> tuple[str, str] | None:
        """(kind, id of the kept row) if `question` duplicates one, else None and remember it."""
        norm = normalize(question)
        if norm in self._exact:
            return "exact", self._exact[norm]
        self._exact[norm] = key
        if not near or self.near_threshold <= 0.0:
            return None
        sh = shingles(norm.split())
        keyed = list(dict.fromkeys(normalize(a) for a in answers[:self.MAX_KEYED_ANSWERS]))
        bands = _band_keys(_minhash(sh))
        buckets = [(answer, band, value) for answer in keyed for band, value in bands]
        seen: set[str] = set()
        for bucket in buckets:
            for other in self._buckets.get(bucket, ()):
                if other not in seen:
                    seen.add(other)
                    if jaccard(sh, self._shingles[other]) >= self.near_threshold:
                        return "near", other
        self._shingles[key] = sh
        for bucket in buckets:
            self._buckets[bucket].append(key)
        return None


class NgramIndex:
    """Word n-grams of the evaluation rows; `overlap` finds a shared one in a training row.

    Keys are the n-gram strings themselves, not hashes, so a reported overlap is always real.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._grams: dict[str, str] = {}

    def _grams_of(self, question: str) -> list[str]:
        words = tokens(question)
        return [" ".join(words[i:i + self.n]) for i in range(len(words) - self.n + 1)]

    def add(self, key: str, question: str) -> None:
        for gram in self._grams_of(question):
            self._grams.setdefault(gram, key)

    def overlap(self, question: str) -> tuple[str, str] | None:
        """(id of an evaluation row, the shared n-gram), or None."""
        for gram in self._grams_of(question):
            if gram in self._grams:
                return self._grams[gram], gram
        return None
