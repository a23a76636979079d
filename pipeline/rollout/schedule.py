"""How a rollout's sequences take turns in the decoder: the schedulers `rollout.schedule` names.

The decoder (`backends.hf.HFDecoder`, `backends.vllm.VLLMDecoder`) asks its scheduler for ready rows and
reports each segment's end; the scheduler runs tool calls on the event loop and hands the rows back.

- `_Run` (continuous, on arrival): a row rejoins as soon as its tool answers (vLLM; hf with
  `readmit_after_steps: 0`).
- `_ClockedRun` (continuous, hf): a row rejoins at a decoding step fixed when it called, so batches,
  and every log-prob's rounding, do not depend on tool latency (see rollout.engine).
- `_TurnSynchronousRun`: TAPO/ToRL's rounds; everyone waits for the slowest tool of a turn.

A failure inside one trajectory ends that trajectory, never the rollout (`_fail`: finish reason "error", the
reason on `Trajectory.error`): its segment cannot be read or answered (`segment_ended` contains it), its tool
outputs cannot be rendered (`_insert`), a callback on the event loop raised (`_call_tools`), its prompt could
not be built (`take_ready`). No row waits for ever: each call has a deadline, and a row with no progress past
the watchdog's limit is named and ended (`rollout.watchdog`); the decoder polls the watchdog wherever it waits.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from tqdm import tqdm

from pipeline.config.rollout import RolloutConfig
from pipeline.protocols import ParsedCall
from pipeline.protocols.tokens import valid_text
from pipeline.rollout.sequence import Sequence
from pipeline.rollout.watchdog import Stuck, Watchdog, bounded_call, call_deadline_s, describe
from pipeline.tools.shown import cut_middle
from pipeline.types import Group, Problem, ToolCall, ToolName, ToolResult

if TYPE_CHECKING:
    from pipeline.rollout.engine import RolloutEngine, _Draws

log = logging.getLogger(__name__)

BUDGET_EXHAUSTED = "tool budget exhausted: give your final answer now"
NO_OUTPUT = "[no output] print() the values you need"

Refill = Callable[[Group], list[Problem]]  # a finished group -> the problems to start now (often none)
Calls = tuple[ParsedCall, ...]  # the calls of one segment, in the order written
Results = list[ToolResult | None]  # one per call; None: not answered yet
Answered = Callable[[Sequence, Calls, Results, tuple[int, int]], None]  # what to do with a segment's results


class RolloutAbandoned(RuntimeError):
    """Raised on the decoder thread once the rollout's awaiting side has gone (cancelled, or its process stopping):
    nothing it waits for (a tool's answer, a refill) would ever arrive."""


class _Run:
    """The scheduler one rollout shares between the decoder thread and the event loop."""

    def __init__(self, engine: RolloutEngine, draws: _Draws, loop: asyncio.AbstractEventLoop,
                 refill: Refill | None = None) -> None:
        self.engine, self.draws, self.loop, self.refill = engine, draws, loop, refill
        self.ready: deque[Sequence] = deque(draws.seqs)
        self.cond = threading.Condition()
        self.open = len(draws.seqs)
        self.tasks: set[asyncio.Task] = set()
        self.tool_results: list[tuple[ToolName, ToolResult]] = []
        self.limits = {name: asyncio.Semaphore(engine.cfg.tool_concurrency) for name in engine.tools}
        self.bar: tqdm | None = None  # set by the engine for the length of the rollout
        self.error: BaseException | None = None  # raised by the refill callback (re-raised by the engine)
        self.abandoned = False  # the awaiting side has gone: every wait of the decoder ends (RolloutAbandoned)
        self.deadlines = {name: call_deadline_s(tool) for name, tool in engine.tools.items()}
        self.watchdog = Watchdog.for_tools(engine.tools)
        self.parked_rows: dict[int, Sequence] = {}  # watchdog key -> the row waiting on the event loop

    def abandon(self) -> None:
        """Either side, any time: the decoder thread stops at its next call into the scheduler, or at once if
        it is waiting there."""
        with self.cond:
            self.abandoned = True
            self.cond.notify_all()

    def _check_open(self) -> None:  # holds self.cond
        if self.abandoned:
            raise RolloutAbandoned("the rollout was stopped (its caller was cancelled or its process is ending)")

    # --- called from the decoder thread -------------------------------------------------
    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        self.end_stuck_rows()
        with self.cond:
            self._check_open()
            taken = [self.ready.popleft() for _ in range(min(max_n, len(self.ready)))]
            self._taken(len(taken))
        rows = []
        for s in taken:
            if s.error and s.finish_reason is None:  # its prompt could not be built (`RolloutEngine._new_sequence`)
                self._finish(s, "error")
            else:
                rows.append((s, self.engine.renderer.stop_strings(s.tools)))
        return rows

    def _taken(self, n: int) -> None:  # holds self.cond
        """`n` rows were handed to the decoder (a turn-synchronous run counts its turn)."""

    def wait_ready(self, timeout_s: float) -> None:
        self.end_stuck_rows()
        with self.cond:
            self._check_open()
            if not self.ready and self.open > 0:
                self.cond.wait(timeout_s)
            self._check_open()

    def unfinished(self) -> int:
        with self.cond:
            self._check_open()
            return self.open

    def segment_ended(self, seq: Sequence, reason: str) -> None:
        """The decoder's report that a row's segment ended. Whatever fails while it is read and answered ends
        that row (`_fail`), never the decoder."""
        try:
            self._segment_ended(seq, reason)
        except RolloutAbandoned:
            raise
        except Exception as err:  # noqa: BLE001 - a parse, a renderer or a tokenizer failing on this row's text
            self._fail(seq, f"its segment could not be read or answered: {describe(err)}")

    def _segment_ended(self, seq: Sequence, reason: str) -> None:
        seq.turns += 1
        if reason == "budget":
            return self._finish(seq, "max_tokens")
        end = self.engine.renderer.read(seq.dialogue, seq.response_ids[seq.segment_start:], seq.tools,
                                        at_eos=reason == "eos")
        if end.answered:
            return self._finish(seq, "answer")
        if reason == "eos" and not end.calls:
            return self._finish(seq, "eos")
        if self._budget_spent(seq):  # re-admission would sample a token past the budget
            return self._finish(seq, "max_tokens")
        if not end.calls:  # a stop string that closes nothing usable: keep generating
            return self._requeue(seq)
        if seq.turns >= self.engine.cfg.max_turns:
            return self._finish(seq, "max_turns")
        call_span = (seq.segment_start, len(seq.response_ids))
        results = self._answered_unrun(seq, end.calls)
        if all(r is not None for r in results):
            return self._insert(seq, end.calls, results, call_span)
        self._start_calls(seq, end.calls, results, call_span)

    def _answered_unrun(self, seq: Sequence, calls: Calls) -> Results:
        """What each call is answered with without running it: a malformed call its error, a call past the
        budget of C answered calls (counting every earlier one) the budget notice; None: it runs."""
        used, results = len(seq.tool_calls), []
        for call in calls:
            if call.error is not None:
                results.append(ToolResult.failure(call.error, status=call.status))
            elif used >= self.engine.cfg.max_tool_calls:
                results.append(ToolResult.failure(BUDGET_EXHAUSTED, status="budget"))
            else:
                results.append(None)
            used += 1
        return results

    def _start_calls(self, seq: Sequence, calls: Calls, results: Results, call_span: tuple[int, int]) -> None:
        key = self._watch(seq, calls, results, id(seq))
        self.loop.call_soon_threadsafe(self._spawn, seq, calls, results, call_span, self._insert, key)

    def _watch(self, seq: Sequence, calls: Calls, results: Results, key: int) -> int:
        """Register a row whose calls go to the event loop with the watchdog (under `key`); returns the key."""
        running = [c for c, r in zip(calls, results, strict=True) if r is None]
        what = ", ".join(f"{c.tool}({c.input[:40]!r})" for c in running)
        self.watchdog.parked(key, self.row_label(seq), f"tool call(s) {what}", queued=len(running))
        with self.cond:
            self.parked_rows[key] = seq
        return key

    def row_label(self, seq: Sequence) -> str:
        """A row's name in logs and reasons: its problem's id and its index in the draw order."""
        return f"{seq.problem.id}#{self.draws.index.get(id(seq), '?')}"

    def end_stuck_rows(self) -> None:
        """End every row the watchdog finds stuck (decoder thread, wherever it waits or steps)."""
        for stuck in self.watchdog.stuck():
            with self.cond:
                seq = self.parked_rows.pop(stuck.key, None)
            if seq is not None:
                self._end_stuck(stuck, seq)

    def _end_stuck(self, stuck: Stuck, seq: Sequence) -> None:
        self._fail(seq, stuck.reason)

    def _fail(self, seq: Sequence, reason: str) -> None:
        """End `seq` for a failure inside it (either side, any time; a row already ended or queued is left)."""
        with self.cond:
            if seq.finish_reason is not None or any(s is seq for s in self.ready):
                return
        seq.error = valid_text(reason)
        log.warning("trajectory %s ended with an error: %s", self.row_label(seq), reason)
        self._finish(seq, "error")

    def _budget_spent(self, seq: Sequence) -> bool:
        cfg = self.engine.cfg
        return seq.policy_tokens >= cfg.max_policy_tokens or len(seq.context_ids) >= cfg.max_total_tokens

    # --- event loop side ----------------------------------------------------------------
    def _spawn(self, seq: Sequence, calls: Calls, results: Results, call_span: tuple[int, int],
               answered: Answered, key: int) -> None:
        task = self.loop.create_task(self._call_tools(seq, calls, results, call_span, answered, key))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call_tools(self, seq: Sequence, calls: Calls, results: Results, call_span: tuple[int, int],
                          answered: Answered, key: int) -> None:
        """Run a segment's calls that need running, concurrently; answer them all, in the order written. Whatever
        fails here ends the row (`_lost`): a raise on the event loop would be logged and the row wait for ever."""
        try:
            pending = [i for i, result in enumerate(results) if result is None]
            ran = await asyncio.gather(*(self._call_tool(calls[i], key) for i in pending))
            done = list(results)
            for i, result in zip(pending, ran, strict=True):
                done[i] = result
            if self._release(key):  # else the watchdog ended the row: its late answer is dropped
                answered(seq, calls, done, call_span)
        except Exception as err:  # noqa: BLE001 - see the docstring
            self._release(key)
            self._lost(key, seq, f"its tool calls could not be answered: {describe(err)}")

    def _release(self, key: int) -> bool:
        with self.cond:
            self.parked_rows.pop(key, None)
        return self.watchdog.released(key)

    def _lost(self, key: int, seq: Sequence, reason: str) -> None:
        """A row's answer was lost on the event loop: end it (where it would have been answered)."""
        self._fail(seq, reason)

    async def _call_tool(self, call: ParsedCall, key: int) -> ToolResult:
        t0 = time.perf_counter()
        try:
            async with self.limits[call.tool]:
                self.watchdog.started(key)
                result = await bounded_call(self.engine.tools[call.tool], call.tool, call.input,
                                            self.deadlines[call.tool])
        except Exception as err:  # noqa: BLE001 - an unknown tool: its call fails, the batch goes on
            result = ToolResult.failure(describe(err), status="client_error", latency_s=time.perf_counter() - t0,
                                        infrastructure=True)
        self.watchdog.answered(key)
        self.tool_results.append((call.tool, result))
        return result

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks)

    # --- either side --------------------------------------------------------------------
    def _insert(self, seq: Sequence, calls: Calls, results: Results, call_span: tuple[int, int]) -> None:
        """Append the protocol's rendering of the calls' outputs (mask 0) and record the calls. Outputs it cannot
        render end the row: never train on a context the template would not show."""
        if seq.finish_reason is not None:  # ended while its calls ran (the watchdog): nothing to append
            return
        cfg = self.engine.cfg
        results = [r if valid_text(r.output) is r.output else
                   ToolResult(valid_text(r.output), r.ok, r.status, r.error and valid_text(r.error), r.latency_s,
                              r.infrastructure) for r in results]  # recorded as shown (the scorer looks for it)
        shown = [cut_middle(r.output.strip() or (NO_OUTPUT if r.ok else "error"), cfg.max_tool_output_chars)
                 for r in results]
        try:
            ids = self.engine.renderer.reply(seq.dialogue, seq.response_ids[call_span[0]:call_span[1]],
                                             list(zip(calls, shown, strict=True)))
        except Exception as err:  # noqa: BLE001 - a template or tokenizer failing on this row's outputs
            return self._fail(seq, f"its tool outputs could not be rendered: {describe(err)}")
        room = cfg.max_total_tokens - len(seq.context_ids)
        output_span = seq.append_inserted(ids[:max(room, 0)])
        seq.tool_calls += [ToolCall(call.tool, call.input, result, call_span, output_span)
                           for call, result in zip(calls, results, strict=True)]
        if len(ids) >= room:
            return self._finish(seq, "max_tokens")
        self._requeue(seq)

    def _requeue(self, seq: Sequence) -> None:
        with self.cond:
            self.ready.append(seq)
            self.cond.notify()

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._mark_finished(seq, reason)
        k = self.draws.group_of[id(seq)]
        with self.cond:
            self.draws.unfinished[k] -= 1
            closes_group = self.draws.unfinished[k] == 0
            if not (closes_group and self.refill is not None):
                self.open -= 1
                self.cond.notify()
                return
        # `open` stays up until the refill has queued its sequences, or the decoder could stop first
        self._schedule_refill(k)

    def _schedule_refill(self, k: int) -> None:
        self.loop.call_soon_threadsafe(self._refill_after, k)

    def _refill_after(self, k: int) -> None:
        self._queue_refill(self._refill_problems(k))

    def _refill_problems(self, k: int) -> list[Problem]:
        """The refill callback's problems for closed group k (on the event loop); an error is kept for the engine."""
        try:
            if self.error is None:
                return list(self.refill(self.draws.group(k)))
        except BaseException as err:  # noqa: BLE001 - a loop callback's exception would only be logged
            self.error = err
        return []

    def _queue_refill(self, problems: list[Problem]) -> None:
        with self.cond:
            new = self.draws.add(problems)
            self.ready.extend(new)
            self.open += len(new) - 1
            self.cond.notify()
        if new and self.bar is not None:
            self.bar.total += len(new)
            self.bar.refresh()

    def _mark_finished(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        if self.bar is not None:
            self.bar.update()


class _TurnSynchronousRun(_Run):
    """TAPO/ToRL's batch-synchronous tool rounds: a turn's sequences resume together only when
    every sequence of the turn has finished or received its tool result (the slowest tool
    sets the pace). Kept to reproduce the anchors and to measure what continuous scheduling gains."""

    def __init__(self, engine: RolloutEngine, draws: _Draws, loop: asyncio.AbstractEventLoop,
                 refill: Refill | None = None) -> None:
        super().__init__(engine, draws, loop, refill)
        self.in_turn = 0  # taken by the decoder this turn and not yet parked or finished
        self.parked: list[Sequence] = []

    def _taken(self, n: int) -> None:  # holds self.cond
        self.in_turn += n

    def _requeue(self, seq: Sequence) -> None:
        with self.cond:
            self.parked.append(seq)
            self._leave_turn()

    def _finish(self, seq: Sequence, reason: str) -> None:
        self._mark_finished(seq, reason)
        with self.cond:
            self.open -= 1
            self._leave_turn()

    def _leave_turn(self) -> None:  # holds self.cond
        self.in_turn -= 1
        if self.in_turn == 0 and not self.ready:  # in draw order, not in the order the tools answered
            self.ready.extend(sorted(self.parked, key=lambda seq: self.draws.index[id(seq)]))
            self.parked.clear()
        self.cond.notify()


class _ClockedRun(_Run):
    """Continuous scheduling on the decoder's clock: what the event loop produces (a tool's result, a refill's
    problems) joins the batch at a decoding step fixed when it was asked for (`rollout.readmit_after_steps`
    later), never at the step it happens to arrive. The decoder calls `take_ready` once per step, so the
    clock is the step count; at a step with something due it waits for it if it is late. Every batch, and so
    every row's rounding, is then a function of the sampled tokens alone: a resumed run with tools is
    bit-identical, at the cost of a row idling (fast tool) or the batch waiting (slow tool) a little.
    All state a row carries changes on the decoder thread, in a fixed order."""

    def __init__(self, engine: RolloutEngine, draws: _Draws, loop: asyncio.AbstractEventLoop,
                 refill: Refill | None = None) -> None:
        super().__init__(engine, draws, loop, refill)
        self.delay = engine.cfg.readmit_after_steps
        self.step = 0
        self._due: list[tuple[int, int, Callable[[], None]]] = []  # (step, order asked, apply) as a heap
        self._asked = 0
        self._arrived: dict[int, Callable[[], None]] = {}  # order asked -> how to apply what arrived

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        self.step += 1
        self._apply_due(self.step)
        return super().take_ready(max_n)

    def wait_ready(self, timeout_s: float) -> None:
        """Nothing is running or ready: move the clock to the next step with something due (waiting for it)."""
        with self.cond:
            next_step = self._due[0][0] if self._due else None
        if next_step is None:
            return super().wait_ready(timeout_s)
        self.step = max(self.step, next_step)
        self._apply_due(self.step)

    def _ask(self) -> int:
        """Reserve the next due slot (decoder thread); returns its order, which the answer quotes."""
        order, self._asked = self._asked, self._asked + 1
        with self.cond:
            heapq.heappush(self._due, (self.step + self.delay, order, lambda: self._arrived.pop(order)()))
        return order

    def _arrive(self, order: int, apply: Callable[[], None]) -> None:
        with self.cond:
            self._arrived[order] = apply
            self.cond.notify_all()

    def _apply_due(self, step: int) -> None:
        while True:
            with self.cond:
                if not self._due or self._due[0][0] > step:
                    return
                _, order, apply = heapq.heappop(self._due)
                while order not in self._arrived:
                    self._check_open()
                    self.end_stuck_rows()  # a row whose answer was lost arrives as its failure
                    self.cond.wait(0.05)
            apply()

    def _start_calls(self, seq: Sequence, calls: Calls, results: Results, call_span: tuple[int, int]) -> None:
        order = self._watch(seq, calls, results, self._ask())

        def answered(s: Sequence, c: Calls, done: Results, span: tuple[int, int]) -> None:
            self._arrive(order, lambda: self._insert(s, c, done, span))

        self.loop.call_soon_threadsafe(self._spawn, seq, calls, results, call_span, answered, order)

    def _lost(self, key: int, seq: Sequence, reason: str) -> None:
        self._arrive(key, lambda: self._fail(seq, reason))  # at its due step, like the answer it stands for

    def _end_stuck(self, stuck: Stuck, seq: Sequence) -> None:
        self._arrive(stuck.key, lambda: self._fail(seq, stuck.reason))

    def _schedule_refill(self, k: int) -> None:
        order = self._ask()

        def compute() -> None:  # on the event loop, like every refill callback
            problems = self._refill_problems(k)
            self._arrive(order, lambda: self._queue_refill(problems))
        self.loop.call_soon_threadsafe(compute)


SCHEDULES: dict[str, type[_Run]] = {"continuous": _Run, "turn-synchronous": _TurnSynchronousRun}


def schedule_for(cfg: RolloutConfig) -> type[_Run]:
    """The scheduler class of `rollout.schedule`, on the hf backend's decoding clock where it has one
    (vLLM batches requests itself, as they come)."""
    if cfg.schedule == "continuous" and cfg.backend == "hf" and cfg.readmit_after_steps > 0:
        return _ClockedRun
    return SCHEDULES[cfg.schedule]
