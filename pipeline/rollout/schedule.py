"""When a row rejoins the decoder's batch: the schedules `rollout.schedule` names, each a small policy.

The episode loop (`rollout.episode.Episodes`) owns the rows; a schedule decides only *when* things rejoin the batch.
Everything the event loop produces for the decoder side is an *arrival* under a ticket asked for when it was sent
(`ask`): a row's tool answers, the failure that stands for an answer that was lost or never came (the watchdog), a
refill's problems. The schedule applies an arrival (`arrive`) at once or at a decoding step of its own; it takes back
a row that goes on generating (`rejoin`) at once or when its turn is over.

- `OnArrival` (continuous): an arrival applies as soon as it arrives (vLLM, which batches requests itself; hf with
  `readmit_after_steps: 0`).
- `Clocked` (continuous, hf): an arrival applies at the decoding step fixed when it was asked for,
  `rollout.readmit_after_steps` later, never at the step it happens to arrive. The decoder ticks once per step, so
  the clock is the step count; at a step with something due it waits for it if it is late. Every batch, and so
  every row's rounding, is then a function of the sampled tokens alone: a resumed run with tools is bit-identical,
  at the cost of a row idling (fast tool) or the batch waiting (slow tool) a little. What a row carries changes on
  the decoder thread, in a fixed order.
- `TurnSynchronous`: TAPO/ToRL's batch-synchronous rounds: the rows of a turn resume together, in draw order, only
  when every open row has finished or had its tools answered (the slowest tool sets the pace). Kept to reproduce
  the anchors and to measure what continuous scheduling gains.

A schedule is handed what it reads: the rows' queue (`RowQueue`) and, on the clock, its delay. Nothing here reads
the engine, a tool or the renderer.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import Protocol

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.sequence import Sequence

Apply = Callable[[], None]  # what an arrival does to the rows, on whichever thread applies it
Poll = Callable[[], None]  # the episode loop's check for stuck rows, called wherever the decoder waits


class RolloutAbandoned(RuntimeError):
    """Raised on the decoder thread once the rollout's awaiting side has gone (cancelled, or its process stopping):
    nothing it waits for (a tool's answer, a refill) would ever arrive."""


class RowQueue:
    """The rows ready for the decoder and the count of the rollout's rows still open, shared by the decoder thread
    and the event loop under one (re-entrant) condition. Once abandoned, every wait of the decoder ends."""

    def __init__(self, rows: Iterable[Sequence]) -> None:
        self.ready: deque[Sequence] = deque(rows)
        self.cond = threading.Condition()
        self.open = len(self.ready)
        self.abandoned = False

    def abandon(self) -> None:
        """Either side, any time: the decoder thread stops at its next call, or at once if it is waiting."""
        with self.cond:
            self.abandoned = True
            self.cond.notify_all()

    def check_open(self) -> None:
        if self.abandoned:
            raise RolloutAbandoned("the rollout was stopped (its caller was cancelled or its process is ending)")

    def push(self, rows: Iterable[Sequence]) -> None:
        with self.cond:
            self.ready.extend(rows)
            self.cond.notify()

    def take(self, max_n: int) -> list[Sequence]:
        with self.cond:
            self.check_open()
            return [self.ready.popleft() for _ in range(min(max_n, len(self.ready)))]

    def wait(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for a row while none is ready and some are open."""
        with self.cond:
            self.check_open()
            if not self.ready and self.open > 0:
                self.cond.wait(timeout_s)
            self.check_open()

    def unfinished(self) -> int:
        with self.cond:
            self.check_open()
            return self.open

    def holds(self, seq: Sequence) -> bool:
        with self.cond:
            return any(s is seq for s in self.ready)


class Schedule(Protocol):
    """When a row that called tools, or a refill, rejoins the batch."""

    def ask(self) -> int:
        """A row's calls or a refill go to the event loop: the ticket its arrival will quote."""
        ...

    def arrive(self, ticket: int, apply: Apply) -> None:
        """What came for `ticket` (any thread): apply it now, or at its step."""
        ...

    def tick(self, poll: Poll) -> None:
        """The decoder takes rows, once per decoding step: apply what is due."""
        ...

    def idle(self, timeout_s: float, poll: Poll) -> None:
        """Nothing runs or is ready: wait for the next arrival (on the clock: move to its step)."""
        ...

    def rejoin(self, seq: Sequence) -> None:
        """A row goes on generating (its tool outputs appended, or its segment closed nothing)."""
        ...

    def settle(self) -> None:
        """A row finished (the queue's count is already down)."""
        ...


class OnArrival:
    """Continuous, on arrival: what arrives applies at once, and a row rejoins at once."""

    def __init__(self, queue: RowQueue) -> None:
        self.queue = queue
        self._tickets = itertools.count()

    def ask(self) -> int:
        return next(self._tickets)

    def arrive(self, ticket: int, apply: Apply) -> None:
        apply()

    def tick(self, poll: Poll) -> None:
        pass

    def idle(self, timeout_s: float, poll: Poll) -> None:
        poll()
        self.queue.wait(timeout_s)

    def rejoin(self, seq: Sequence) -> None:
        self.queue.push([seq])

    def settle(self) -> None:
        pass


class TurnSynchronous:
    """TAPO/ToRL's rounds: a row that goes on waits until every open row has (see the module)."""

    def __init__(self, queue: RowQueue) -> None:
        self.queue = queue
        self.waiting: list[Sequence] = []  # this turn's rows that go on, until the turn is over
        self._tickets = itertools.count()

    def ask(self) -> int:
        return next(self._tickets)

    def arrive(self, ticket: int, apply: Apply) -> None:
        apply()

    def tick(self, poll: Poll) -> None:
        pass

    def idle(self, timeout_s: float, poll: Poll) -> None:
        poll()
        self.queue.wait(timeout_s)

    def rejoin(self, seq: Sequence) -> None:
        with self.queue.cond:
            self.waiting.append(seq)
            self._turn_over()

    def settle(self) -> None:
        with self.queue.cond:
            self._turn_over()

    def _turn_over(self) -> None:
        # An open row is ready, in the decoder or at its tools, or waiting here: when all wait, the turn is over.
        if len(self.waiting) == self.queue.open:  # in draw order, not in the order the tools answered
            self.queue.ready.extend(sorted(self.waiting, key=lambda seq: seq.draw_index))
            self.waiting.clear()
        self.queue.cond.notify()


class Clocked:
    """Continuous on the decoder's clock: an arrival applies `delay` decoding steps after it was asked for."""

    def __init__(self, queue: RowQueue, delay: int) -> None:
        self.queue, self.delay = queue, delay
        self.step = 0
        self._due: list[tuple[int, int]] = []  # (step, ticket) as a heap
        self._tickets = 0
        self._arrived: dict[int, Apply] = {}  # ticket -> how to apply what arrived

    def ask(self) -> int:
        with self.queue.cond:
            ticket, self._tickets = self._tickets, self._tickets + 1
            heapq.heappush(self._due, (self.step + self.delay, ticket))
        return ticket

    def arrive(self, ticket: int, apply: Apply) -> None:
        with self.queue.cond:
            self._arrived[ticket] = apply
            self.queue.cond.notify_all()

    def tick(self, poll: Poll) -> None:
        self.step += 1
        self._apply_due(poll)

    def idle(self, timeout_s: float, poll: Poll) -> None:
        with self.queue.cond:
            next_step = self._due[0][0] if self._due else None
        if next_step is None:
            poll()
            self.queue.wait(timeout_s)
            return
        self.step = max(self.step, next_step)
        self._apply_due(poll)

    def rejoin(self, seq: Sequence) -> None:
        self.queue.push([seq])

    def settle(self) -> None:
        pass

    def _apply_due(self, poll: Poll) -> None:
        while True:
            with self.queue.cond:
                if not self._due or self._due[0][0] > self.step:
                    return
                _, ticket = heapq.heappop(self._due)
                while ticket not in self._arrived:
                    self.queue.check_open()
                    poll()  # a row whose answer was lost arrives as its failure
                    self.queue.cond.wait(0.05)
                apply = self._arrived.pop(ticket)
            apply()


def schedule_for(cfg: RolloutConfig) -> Callable[[RowQueue], Schedule]:
    """The schedule of `rollout.schedule`, on the hf backend's decoding clock where it has one (vLLM batches
    requests itself, as they come). Resolved once; called with each rollout's queue."""
    if cfg.schedule == "turn-synchronous":
        return TurnSynchronous
    if cfg.generation.decoding_clock and cfg.readmit_after_steps > 0:
        return partial(Clocked, delay=cfg.readmit_after_steps)
    return OnArrival
