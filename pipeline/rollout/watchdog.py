"""What keeps one trajectory's failure inside it: the deadline of each tool call as the engine enforces it, and the
watchdog that ends a row left waiting. Used by every scheduler (`rollout.schedule`) and, through it, by both
backends.

Two bounds, both derived from the tools' own deadlines (`call_deadline_s`: a client's whole-call deadline from
its config, `CallLimits.deadline_s`, plus WATCHDOG_MARGIN_S for it to report its own timeout first):

- a call: the engine stops waiting for a call that has run (its concurrency slot held) past its deadline and
  answers it as the tool's failure (`call_overdue`: status "timeout", an infrastructure failure: the service did
  not answer, the policy is not charged). The client is cancelled, and not waited for: a tool that ignores the
  cancellation holds no row.
- a row: a row parked on the event loop (its calls queued or running, or their answer not yet shown) that has
  seen no progress for longer than the longest call deadline is stuck: something lost its answer (a callback
  that raised, an event loop that is blocked). The watchdog, polled by the decoder thread wherever it waits,
  names it (problem id, index in the draw order, what it waits for) and the scheduler ends it, finish reason
  "error" with that text. A row whose calls wait for a concurrency slot is making progress while any call of the
  run does: only a run where nothing moves for that long is stuck.

The clock is injected (`time.monotonic` by default) so the rules are tested without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.types import ToolName, ToolResult

log = logging.getLogger(__name__)

WATCHDOG_MARGIN_S = 30.0  # beyond a call's own deadline: the client reports its own timeout first
DEFAULT_CALL_DEADLINE_S = 600.0  # a tool that states no deadline of its own (a test double, an old client)


def call_deadline_s(tool: Any) -> float:
    """How long the engine lets one call of `tool` run: its own whole-call deadline (`tool.limits.deadline_s`, or
    `tool.deadline_s`; else DEFAULT_CALL_DEADLINE_S) plus WATCHDOG_MARGIN_S."""
    own = getattr(getattr(tool, "limits", None), "deadline_s", None) or getattr(tool, "deadline_s", None)
    if isinstance(own, (int, float)) and not isinstance(own, bool) and 0 < own < float("inf"):
        return float(own) + WATCHDOG_MARGIN_S
    return DEFAULT_CALL_DEADLINE_S + WATCHDOG_MARGIN_S


def call_overdue(tool: ToolName, deadline_s: float, latency_s: float) -> ToolResult:
    """The answer of a call the engine stopped waiting for: the tool's failure, not the policy's."""
    return ToolResult.failure(f"{tool}: no answer within {deadline_s:g}s (the rollout's deadline for one call)",
                              status="timeout", latency_s=latency_s, infrastructure=True)


async def bounded_call(tool: Any, name: ToolName, call_input: str, deadline_s: float) -> ToolResult:
    """One call of `tool`, answered within `deadline_s` whatever the tool does: one that raises, is cancelled,
    answers something that is not a `ToolResult` of text, or does not answer in time has failed (an
    infrastructure failure: the client broke its contract, not the policy). The call is cancelled at the
    deadline and not waited for."""
    t0 = time.perf_counter()
    try:
        task = asyncio.ensure_future(tool(call_input))
    except Exception as err:  # noqa: BLE001 - a client that raises before it awaits, or is no coroutine function
        return _broken(name, err, time.perf_counter() - t0)
    if isinstance(task, asyncio.Task):  # named, should it outlive its cancellation (the engine's close says so)
        task.set_name(f"tool {name!r}: call")
    try:
        done, _ = await asyncio.wait({task}, timeout=deadline_s)
    finally:
        if not task.done():  # past the deadline, or this call itself cancelled: the client is let go
            task.cancel()
            task.add_done_callback(_retrieve)
    latency = time.perf_counter() - t0
    if not done:
        return call_overdue(name, deadline_s, latency)
    if task.cancelled():
        return ToolResult.failure(f"{name}: the call was cancelled", status="client_error", latency_s=latency,
                                  infrastructure=True)
    if task.exception() is not None:
        return _broken(name, task.exception(), latency)
    result = task.result()
    if not isinstance(result, ToolResult) or not isinstance(result.output, str):
        return ToolResult.failure(f"{name}: the tool answered {type(result).__name__}, not a text result",
                                  status="client_error", latency_s=latency, infrastructure=True)
    return result


def _broken(name: ToolName, err: BaseException, latency_s: float) -> ToolResult:
    """A tool that breaks its contract must still not kill the batch (nor train it)."""
    return ToolResult.failure(describe(err), status="client_error", latency_s=latency_s, infrastructure=True)


def describe(err: BaseException) -> str:
    """`Type: message` of an exception, whatever its `__str__` does."""
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:  # noqa: BLE001 - a hostile exception's __str__ may raise
        return type(err).__name__


def _retrieve(task: asyncio.Future) -> None:
    """A let-go call's outcome is read, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


@dataclass
class _Waiting:
    what: str  # the calls (tool names and the start of each input) or the refill it waits for
    label: str  # problem id and index in the draw order
    since: float  # the row's last progress: parked, one of its calls started or answered
    queued: int = 0  # its calls still waiting for a concurrency slot


@dataclass(frozen=True)
class Stuck:
    """A row the watchdog ends, and why (`reason` is recorded on its trajectory)."""

    key: int
    reason: str


@dataclass
class Watchdog:
    """The rows parked on the event loop, and which of them are stuck (see the module docstring). Thread-safe:
    the event loop reports progress, the decoder thread asks."""

    limit_s: float
    clock: Callable[[], float] = time.monotonic
    _rows: dict[int, _Waiting] = field(default_factory=dict)
    _moved: float = 0.0  # the last time any call of the run started or was answered
    _next_check: float = 0.0  # the decoder polls on every step; the rows are looked at about once a second
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def for_tools(cls, tools: Mapping[ToolName, Any], clock: Callable[[], float] = time.monotonic) -> Watchdog:
        """The watchdog of a run: its limit is the longest call deadline of its tools."""
        deadlines = [call_deadline_s(tool) for tool in tools.values()]
        return cls(max(deadlines, default=DEFAULT_CALL_DEADLINE_S + WATCHDOG_MARGIN_S), clock)

    def parked(self, key: int, label: str, what: str, queued: int = 0) -> None:
        now = self.clock()
        with self._lock:
            self._rows[key] = _Waiting(what, label, now, queued)

    def started(self, key: int) -> None:
        """One of the row's calls got its concurrency slot."""
        self._progress(key, queued=-1)

    def answered(self, key: int) -> None:
        """One of the row's calls was answered."""
        self._progress(key, queued=0)

    def released(self, key: int) -> bool:
        """The row is no longer waiting: its answer came. False when the watchdog has already ended it (whoever
        removes the row owns it: its late answer is dropped)."""
        with self._lock:
            return self._rows.pop(key, None) is not None

    def _progress(self, key: int, queued: int) -> None:
        now = self.clock()
        with self._lock:
            self._moved = now
            row = self._rows.get(key)
            if row is not None:
                row.since, row.queued = now, max(row.queued + queued, 0)

    def stuck(self) -> list[Stuck]:
        """The rows with no progress for longer than the limit (a row whose calls are queued counts any call's
        progress), each removed and named."""
        now = self.clock()
        with self._lock:
            if now < self._next_check or not self._rows:
                return []
            self._next_check = now + min(1.0, self.limit_s / 10)
            overdue = [(key, row) for key, row in self._rows.items()
                       if now - max(row.since, self._moved if row.queued else row.since) > self.limit_s]
            for key, _ in overdue:
                del self._rows[key]
        found = [Stuck(key, f"watchdog: row {row.label} waited {now - row.since:.0f}s (limit {self.limit_s:g}s) "
                            f"for {row.what}") for key, row in overdue]
        for s in found:
            log.warning("%s; it is ended", s.reason)
        return found
