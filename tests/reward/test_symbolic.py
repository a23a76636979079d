"""Symbolic checks are bounded in time from any thread, and a killed worker is replaced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.config.reward import RewardConfig
from pipeline.reward import SymbolicChecker, Verifier

# sympy tries to evaluate 9^(9^(9^9)) exactly: minutes of work and unbounded memory.
PATHOLOGICAL = "9^{9^{9^{9}}}"
TIME_LIMIT_S = 2.0  # generous: sympy's first factorisation in a fresh worker is slow on a busy machine


@pytest.fixture(scope="module")
def checker() -> Iterator[SymbolicChecker]:
    checker = SymbolicChecker(timeout_s=TIME_LIMIT_S, workers=2)
    with ThreadPoolExecutor(max_workers=2) as pool:  # start both workers outside the timed parts
        assert all(pool.map(lambda _: checker.equivalent("x^2 - 1", "(x-1)(x+1)"), range(2)))
    yield checker
    checker.close()


def test_pathological_input_times_out_as_not_equivalent(checker: SymbolicChecker) -> None:
    before = checker.timeouts
    start = time.monotonic()
    assert checker.equivalent(PATHOLOGICAL, "1") is False
    assert time.monotonic() - start < TIME_LIMIT_S + 1.5
    assert checker.timeouts == before + 1
    assert checker.equivalent("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")  # a fresh worker took over


def test_time_limit_holds_in_worker_threads(checker: SymbolicChecker) -> None:
    """SIGALRM timers fail off the main thread; killable processes do not."""
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda pair: checker.equivalent(*pair),
                                [(PATHOLOGICAL, "2"), ("x^2 - 1", "(x-1)(x+1)"), ("\\sin(x)^2 + \\cos(x)^2", "1")]))  # fmt: skip
    assert results == [False, True, True]
    assert time.monotonic() - start < 2 * TIME_LIMIT_S + 8  # includes re-spawning killed workers


async def test_time_limit_holds_from_async_code(checker: SymbolicChecker) -> None:
    start = time.monotonic()
    verdict = await asyncio.to_thread(checker.equivalent, PATHOLOGICAL, "3")
    assert verdict is False
    assert time.monotonic() - start < TIME_LIMIT_S + 5


def test_verifier_caches_the_timed_out_pair(checker: SymbolicChecker) -> None:
    verifier = Verifier(RewardConfig(verify_timeout_s=TIME_LIMIT_S), checker=checker)
    assert verifier.score("math", PATHOLOGICAL, "5") == 0.0
    timeouts = checker.timeouts
    start = time.monotonic()
    assert verifier.score("math", PATHOLOGICAL, "5") == 0.0
    assert time.monotonic() - start < 0.1
    assert checker.timeouts == timeouts


def test_overlong_input_is_refused_without_a_worker(checker: SymbolicChecker) -> None:
    assert checker.equivalent("x" * 5000, "x" * 5000) is False
