"""Metrics from records, by hand: avg@k, unbiased pass@k, tool calls, format errors, buckets."""

from __future__ import annotations

from math import comb

import pytest

from pipeline.evaluation.pass_at_k import pass_at_k
from pipeline.evaluation.summary import accuracy_by_calls, summarise


def rec(bench: str, pid: str, sample: int, score: float, calls=(), fmt=True, tokens=10) -> dict:
    return {"benchmark": bench, "id": pid, "sample": sample, "score": score, "format_ok": fmt,
            "policy_tokens": tokens, "tool_calls": [{"tool": t, "ok": ok} for t, ok in calls]}


def test_summary_by_hand() -> None:
    records = [
        rec("nq", "a", 0, 1.0, [("search", True)], tokens=10),
        rec("nq", "a", 1, 0.0, [("search", True), ("search", False)], tokens=20),
        rec("nq", "b", 0, 0.0, fmt=False, tokens=30),
        rec("nq", "b", 1, 0.0, tokens=40),
        rec("gsm8k", "c", 0, 1.0, [("code", True)], tokens=50),
        rec("gsm8k", "c", 1, 1.0, tokens=60),
    ]
    m = summarise(records, pass_k=(1, 2))
    assert m["nq/accuracy"] == 0.25 and m["gsm8k/accuracy"] == 1.0
    assert m["nq/pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["nq/pass@2"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["nq/calls_per_rollout/search"] == 0.75 and m["nq/calls_per_rollout/code"] == 0.0
    assert m["nq/tool_failure_rate"] == pytest.approx(1 / 3)
    assert m["nq/format_error_rate"] == 0.25 and m["nq/mean_policy_tokens"] == 25.0
    assert m["all/accuracy"] == pytest.approx(3 / 6)
    assert m["all/macro_accuracy"] == pytest.approx((0.25 + 1.0) / 2)
    assert m["n_problems"] == 3 and m["all/n_samples"] == 6


def test_accuracy_by_search_calls() -> None:
    records = [rec("nq", "a", 0, 1.0), rec("nq", "b", 0, 0.0), rec("nq", "c", 0, 1.0, [("search", True)])]
    assert accuracy_by_calls(records, "search") == {0: (0.5, 2), 1: (1.0, 1)}


def test_empty_records_are_an_error() -> None:
    with pytest.raises(ValueError, match="no samples"):
        summarise([])


@pytest.mark.parametrize(("n", "c", "k"), [(5, 0, 1), (5, 2, 1), (5, 2, 3), (10, 3, 4), (4, 4, 2)])
def test_pass_at_k_matches_the_combinatorial_definition(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_pass_at_k_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
