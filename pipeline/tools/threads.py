"""The threads of one synchronous user tool: at most `size` at once, each call bounded by a deadline.

Why not `asyncio.to_thread` (the event loop's default executor, shared by every tool): a function that hangs
keeps its thread, since a thread cannot be killed, so 8 calls into one hanging tool held the default executor's
threads and every later call of every synchronous tool waited behind them until its own timeout. And why not a
`ThreadPoolExecutor` per tool: its threads are joined when the interpreter exits (and `asyncio.run` joins the
default executor's when a rollout's loop closes), so one hung call would hang the trainer's exit. Here each call
runs on a daemon thread of its own, at most `size` per tool; a call that cannot get a thread waits for one only
while some running call is still within its deadline, and is refused at once (`Saturated`) when every thread is
held by a call past its deadline, which will never give it back in time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class Saturated(Exception):
    """Every thread of the tool is held by a call past its deadline."""


class ToolThreads:
    """Runs a synchronous function on at most `size` daemon threads; see the module docstring."""

    def __init__(self, name: str, size: int) -> None:
        if size < 1:
            raise ValueError(f"tool {name!r}: needs at least one thread, not {size}")
        self.name, self.size = name, size
        self._lock = threading.Lock()
        self._running: dict[Future, float] = {}  # each running call -> the monotonic time its caller gives up
        self._freed: Future = Future()  # resolved (and replaced) whenever a thread is given back

    @property
    def hung(self) -> int:
        """Threads held by calls past their deadline."""
        now = time.monotonic()
        with self._lock:
            return sum(deadline <= now for deadline in self._running.values())

    async def run(self, function: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float) -> Any:
        """`function(**kwargs)`'s value; raises what it raised, TimeoutError past `timeout_s` (the thread runs on,
        and is counted until it returns), or `Saturated`."""
        future = await self._admitted(timeout_s)
        threading.Thread(target=self._work, args=(future, function, kwargs), name=f"tool-{self.name}",
                         daemon=True).start()
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)

    async def _admitted(self, timeout_s: float) -> Future:
        while True:
            with self._lock:
                now = time.monotonic()
                if len(self._running) < self.size:
                    future: Future = Future()
                    self._running[future] = now + timeout_s
                    return future
                live = [deadline for deadline in self._running.values() if deadline > now]
                if not live:
                    raise Saturated(f"all {self.size} of its threads are held by calls past their deadline")
                freed = self._freed
            # Wake when a thread is given back, or when the next running call passes its deadline (saturated?).
            await asyncio.wait({asyncio.wrap_future(freed)}, timeout=min(live) - now)

    def _work(self, future: Future, function: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        try:
            if future.set_running_or_notify_cancel():  # False: the caller gave up before the thread started
                try:
                    future.set_result(function(**kwargs))
                except BaseException as err:  # noqa: BLE001 - the function's failure is its answer
                    future.set_exception(_as_exception(err))
        finally:
            with self._lock:
                del self._running[future]
                freed, self._freed = self._freed, Future()
            freed.set_result(None)


def _as_exception(err: BaseException) -> Exception:
    """What an awaiting caller can be handed: SystemExit or KeyboardInterrupt from a tool must not end the event
    loop, and asyncio refuses StopIteration (its future would never be resolved)."""
    if isinstance(err, Exception) and not isinstance(err, StopIteration):
        return err
    return RuntimeError(f"{type(err).__name__}: {err}")
