"""Paired comparison of two evaluations on the same problems: which answers flipped, and could noise explain it.

Two models scored on the same held-out problems differ by the problems one solves and the other does not. The
accuracy gap is (to right - to wrong) / n; the exact two-sided sign test over the flipped problems gives the
probability of a split at least that uneven if each flip were a fair coin (McNemar's exact test), which says
more than the gap alone when the set is small. Pure functions of per-sample records (greedy: one sample each).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.evaluation.summary import is_correct


@dataclass(frozen=True)
class Flips:
    before: str  # labels of the two evaluations
    after: str
    problems: int  # problems both evaluated
    to_right: int  # wrong before, right after
    to_wrong: int  # right before, wrong after
    sign_test_p: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sign_test_p(up: int, down: int) -> float:
    """Two-sided exact sign test of `up` against `down` (1.0 when nothing flipped)."""
    n = up + down
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(up, down) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_flips(before: list[dict[str, Any]], after: list[dict[str, Any]], labels: tuple[str, str]) -> Flips:
    """Flips between two evaluations' records, over the (benchmark, problem) pairs both scored; a problem counts
    as right when its first sample is correct."""
    a = {(r["benchmark"], r["id"]): is_correct(r) for r in before if r.get("sample", 0) == 0}
    b = {(r["benchmark"], r["id"]): is_correct(r) for r in after if r.get("sample", 0) == 0}
    shared = a.keys() & b.keys()
    up = sum(b[k] and not a[k] for k in shared)
    down = sum(a[k] and not b[k] for k in shared)
    return Flips(labels[0], labels[1], len(shared), up, down, sign_test_p(up, down))
