"""Symbolic checks are bounded in time from any thread, a killed worker is replaced, and the limit is the
worker's CPU time: a verdict does not depend on how long the machine keeps the worker waiting."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.config.reward import RewardConfig
from pipeline.reward import SymbolicChecker, Verifier

pytestmark = pytest.mark.integration  # verifier time limits, waited out

# sympy tries to evaluate 9^(9^(9^9)) exactly: minutes of work and unbounded memory.
PATHOLOGICAL = "9^{9^{9^{9}}}"
TIME_LIMIT_S = 2.0  # of the worker's CPU time


@pytest.fixture(scope="module")
def checker() -> Iterator[SymbolicChecker]:
    checker = SymbolicChecker(timeout_s=TIME_LIMIT_S, workers=2)
    with ThreadPoolExecutor(max_workers=2) as pool:  # start both workers outside the timed parts
        assert all(pool.map(lambda _: checker.equivalent("x^2 - 1", "(x-1)(x+1)"), range(2)))
    yield checker
    checker.close()


def test_pathological_input_times_out_as_not_equivalent(checker: SymbolicChecker) -> None:
    before, stalls = checker.timeouts, checker.stalls
    assert checker.equivalent(PATHOLOGICAL, "1") is False
    assert (checker.timeouts, checker.stalls) == (before + 1, stalls)  # stopped by its CPU time
    assert checker.equivalent("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")  # a fresh worker took over


def test_time_limit_holds_in_worker_threads(checker: SymbolicChecker) -> None:
    """SIGALRM timers fail off the main thread; killable processes do not."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda pair: checker.equivalent(*pair),
                                [(PATHOLOGICAL, "2"), ("x^2 - 1", "(x-1)(x+1)"), ("\\sin(x)^2 + \\cos(x)^2", "1")]))  # fmt: skip
    assert results == [False, True, True]


async def test_time_limit_holds_from_async_code(checker: SymbolicChecker) -> None:
    timeouts = checker.timeouts
    verdict = await asyncio.to_thread(checker.equivalent, PATHOLOGICAL, "3")
    assert verdict is False and checker.timeouts == timeouts + 1


def test_verifier_caches_the_timed_out_pair(checker: SymbolicChecker) -> None:
    verifier = Verifier(RewardConfig(verify_timeout_s=TIME_LIMIT_S), checker=checker)
    assert verifier.score("math", PATHOLOGICAL, "5") == 0.0
    timeouts = checker.timeouts
    assert verifier.score("math", PATHOLOGICAL, "5") == 0.0
    assert checker.timeouts == timeouts  # answered from the cache: no second check ran


def test_overlong_input_is_refused_without_a_worker(checker: SymbolicChecker) -> None:
    assert checker.equivalent("x" * 5000, "x" * 5000) is False


def _idle_worker_pid(checker: SymbolicChecker) -> int:
    """The pid of the one idle worker of a one-worker checker (private state: the tests pause it)."""
    (worker,) = list(checker._idle.queue)
    return worker._process.pid


@pytest.mark.parametrize("pause_s", [1.0, 3.0])
def test_a_worker_kept_waiting_past_the_limit_still_gives_its_verdict(pause_s: float) -> None:
    """A loaded machine, made certain: the worker gets no CPU for longer than the limit in wall time while the
    check waits. The verdict is the true one (with a wall-clock limit it was "not equivalent")."""
    checker = SymbolicChecker(timeout_s=0.5, workers=1)
    try:
        checker.start()
        pid = _idle_worker_pid(checker)
        os.kill(pid, signal.SIGSTOP)
        verdicts: list[bool] = []
        asking = threading.Thread(target=lambda: verdicts.append(checker.equivalent("x^2 - 1", "(x-1)(x+1)")))
        asking.start()
        time.sleep(pause_s)
        os.kill(pid, signal.SIGCONT)
        asking.join(timeout=120)
        assert verdicts == [True] and checker.timeouts == 0
    finally:
        checker.close()


def test_a_worker_that_never_runs_is_given_up_in_wall_time() -> None:
    checker = SymbolicChecker(timeout_s=0.2, workers=1, wall_factor=5.0)
    try:
        checker.start()
        os.kill(_idle_worker_pid(checker), signal.SIGSTOP)
        assert checker.equivalent("x^2 - 1", "(x-1)(x+1)") is False
        assert (checker.timeouts, checker.stalls) == (1, 1)
        assert checker.equivalent("x^2 - 1", "(x-1)(x+1)") is True  # a fresh worker took over
    finally:
        checker.close()
