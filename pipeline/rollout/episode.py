"""The episode of one trajectory, TAPO's Algorithm 1 (ToRL's tool-integrated rollout): generate a segment; if it
calls tools, run them and append their outputs, masked; stop at an answer or a limit.

    repeat:                                         (the decoder: backends/hf.py, backends/vllm.py)
        generate until a stop string, EOS or the token budget
        decide(row, how the segment ended, limits):
            Finish(reason)   -> the trajectory is done
            KeepGenerating   -> the row rejoins the batch
            RunTools(calls)  -> run the calls that need running, on the event loop (`ToolRunner`); append the
                                protocol's rendering of all the outputs with loss mask 0 (`append_outputs`);
                                the row rejoins the batch

`decide` is the whole decision, pure over the row and its `Limits`; `Episodes` carries it out for every row of
a rollout: the decoder drives it (`backends.decoding.Scheduler`), it runs the calls on the event loop, and its
schedule (`rollout.schedule`: on arrival, on the decoding clock, turn-synchronous) says when a row that called
tools, or a refill's rows, rejoin the batch. Each part is handed what it reads (renderer, tools, limits), never
the engine.

Departures from TAPO's Algorithm 1 and ToRL, and why:
1. Asynchronous. Tool calls run as asyncio tasks while the other rows generate, with a concurrency limit per tool
   (`rollout.tool_concurrency`); nobody waits for the slowest tool of a batch (TAPO and ToRL do: the
   `turn-synchronous` schedule keeps their rounds, to reproduce them and to measure what this gains).
2. On the hf backend a row rejoins at a decoding step fixed when it called (`rollout.readmit_after_steps` later;
   `schedule.Clocked`), not when its tool happens to answer: which rows share a batch then depends on the sampled
   tokens alone, so log-probs are bit-identical however tools are timed, and a killed-and-resumed run with tools
   reproduces the uninterrupted one. The price: a row whose tool answered early idles until its step, and the
   batch waits at that step for a tool that is later still. `readmit_after_steps: 0` rejoins on arrival instead
   (vLLM always does: it batches requests itself).
3. Any number of calls per segment: one for the tag protocols; a chat-tools turn may write several, run together
   and answered in the order written, in one rendering.
4. Budgets, as in ToRL/TAPO but never an exception: C answered tool calls (`max_tool_calls`; a later call is
   answered BUDGET_EXHAUSTED, so the model learns to answer, rather than the trajectory being cut), `max_turns`
   generation segments, policy-token and total-token limits (a segment that ends on the policy budget ends the
   trajectory, even at a call: nothing could read the output; outputs that overrun the total are cut there).
   Malformed calls get their error message as their tool output.
5. What the model sees of an output: the protocol's renderer (`ToolProtocol.bind`) gives the ids as it shows them
   (a tag protocol's wrapped output as plain text, `encode_plain`, so special tokens in a tool's output stay text;
   chat-tools: the chat template's own rendering of the tool messages, token-exact), the output cut in the middle
   to `max_tool_output_chars`, an empty one shown as NO_OUTPUT, text that is not valid Unicode replaced.
6. A failure inside one trajectory (its prompt, a parse, a tool, the tokenizer, the template) ends that trajectory
   with finish reason "error" and the reason on `Trajectory.error` (the scorer gives it the format penalty), and
   no row waits for ever (`rollout.watchdog`: each call's deadline, and a watchdog that names and ends a row left
   waiting, polled wherever the decoder waits). What still raises from a rollout is the caller's (a refill that
   raised) or the machinery's (a backend failure), never one row's.
7. A rollout can grow while it runs (`Refill`): when a problem's group finishes, a callback may name further
   problems, whose rows join the running batch (as a tool's answer does, through the schedule).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

from tqdm import tqdm

from pipeline.config.rollout import RolloutConfig
from pipeline.protocols import Dialogue, ParsedCall, Renderer, SegmentEnd
from pipeline.protocols.tokens import valid_text
from pipeline.rollout.draws import Draws
from pipeline.rollout.schedule import RolloutAbandoned, RowQueue, Schedule
from pipeline.rollout.sequence import Sequence
from pipeline.rollout.watchdog import Watchdog, bounded_call, call_deadline_s, describe
from pipeline.tools.base import Tool
from pipeline.tools.shown import cut_middle
from pipeline.types import FinishReason, Group, Problem, ToolCall, ToolName, ToolResult

log = logging.getLogger(__name__)

BUDGET_EXHAUSTED = "tool budget exhausted: give your final answer now"
NO_OUTPUT = "[no output] print() the values you need"

Refill = Callable[[Group], list[Problem]]  # a finished group -> the problems to start now (often none)
Calls = tuple[ParsedCall, ...]  # the calls of one segment, in the order written
Results = list[ToolResult | None]  # one per call; None: to be run


@dataclass(frozen=True)
class Limits:
    """The limits of one trajectory (`rollout.*`)."""

    max_tool_calls: int  # ToRL's C: answered calls; later ones are answered BUDGET_EXHAUSTED
    max_turns: int  # generation segments
    max_policy_tokens: int  # sampled tokens
    max_total_tokens: int  # prompt, sampled and tool-output tokens
    max_tool_output_chars: int  # an output is cut in the middle to this

    @classmethod
    def of(cls, cfg: RolloutConfig) -> Limits:
        return cls(cfg.max_tool_calls, cfg.max_turns, cfg.max_policy_tokens, cfg.max_total_tokens,
                   cfg.max_tool_output_chars)


@dataclass(frozen=True)
class Finish:
    reason: FinishReason


@dataclass(frozen=True)
class KeepGenerating:
    """A stop string that closed nothing usable: the row goes on."""


@dataclass(frozen=True)
class RunTools:
    calls: Calls
    answered: Results  # each call's answer without running it (malformed: its error; past C: the notice); None: run
    call_span: tuple[int, int]  # the response span of the segment that wrote the calls


Decision = Finish | KeepGenerating | RunTools


def decide(seq: Sequence, stop: str, end: SegmentEnd | None, limits: Limits) -> Decision:
    """What follows a segment that ended at `stop` ("eos", "stop" or "budget"; the protocol's reading `end`, None at
    "budget"), `seq.turns` counting it."""
    if stop == "budget" or end is None:
        return Finish("max_tokens")
    if end.answered:
        return Finish("answer")
    if stop == "eos" and not end.calls:
        return Finish("eos")
    if budget_spent(seq, limits):  # going on would sample a token past the budget
        return Finish("max_tokens")
    if not end.calls:
        return KeepGenerating()
    if seq.turns >= limits.max_turns:
        return Finish("max_turns")
    return RunTools(end.calls, answered_unrun(seq, end.calls, limits), (seq.segment_start, len(seq.response_ids)))


def budget_spent(seq: Sequence, limits: Limits) -> bool:
    return seq.policy_tokens >= limits.max_policy_tokens or len(seq.context_ids) >= limits.max_total_tokens


def answered_unrun(seq: Sequence, calls: Calls, limits: Limits) -> Results:
    """What each call is answered with without running it: a malformed call its error, a call past the budget of
    C answered calls (counting every earlier one) the budget notice; None: it runs."""
    used = len(seq.tool_calls)
    results: Results = []
    for call in calls:
        if call.error is not None:
            results.append(ToolResult.failure(call.error, status=call.status))
        elif used >= limits.max_tool_calls:
            results.append(ToolResult.failure(BUDGET_EXHAUSTED, status="budget"))
        else:
            results.append(None)
        used += 1
    return results


def as_recorded(result: ToolResult) -> ToolResult:
    """A result with valid text, as it is shown and recorded (the scorer looks for the output it was shown)."""
    if valid_text(result.output) is result.output:
        return result
    return ToolResult(valid_text(result.output), result.ok, result.status, result.error and valid_text(result.error),
                      result.latency_s, result.infrastructure)


def shown(result: ToolResult, limits: Limits) -> str:
    """The text the renderer shows for a result."""
    return cut_middle(result.output.strip() or (NO_OUTPUT if result.ok else "error"), limits.max_tool_output_chars)


def append_outputs(seq: Sequence, run: RunTools, results: list[ToolResult], ids: list[int],
                   limits: Limits) -> Finish | KeepGenerating:
    """Append the rendered outputs `ids` (loss mask 0; cut at the total budget) and record the calls."""
    room = limits.max_total_tokens - len(seq.context_ids)
    output_span = seq.append_inserted(ids[:max(room, 0)])
    seq.tool_calls += [ToolCall(call.tool, call.input, result, run.call_span, output_span)
                       for call, result in zip(run.calls, results, strict=True)]
    return Finish("max_tokens") if len(ids) >= room else KeepGenerating()


def _dialogue(seq: Sequence) -> Dialogue:
    if seq.dialogue is None:  # only a row whose prompt could not be built has none, and it never generates
        raise ValueError("the row has no dialogue")
    return seq.dialogue


class ToolRunner:
    """A rollout's tool calls on the event loop: each tool's concurrency limit, each call's deadline
    (`watchdog.bounded_call`), the watchdog told of every start and answer, every result kept for the statistics."""

    def __init__(self, tools: Mapping[ToolName, Tool], concurrency: int) -> None:
        self.tools = tools
        self.slots = {name: asyncio.Semaphore(concurrency) for name in tools}
        self.deadlines = {name: call_deadline_s(tool) for name, tool in tools.items()}
        self.watchdog = Watchdog.for_tools(tools)
        self.results: list[tuple[ToolName, ToolResult]] = []

    async def answer(self, run: RunTools, key: int) -> list[ToolResult]:
        """Every call of `run` answered, in the order written: those to run run concurrently."""
        pending = [call for call, result in zip(run.calls, run.answered, strict=True) if result is None]
        ran = iter(await asyncio.gather(*(self._call(call, key) for call in pending)))
        return [result if result is not None else next(ran) for result in run.answered]

    async def _call(self, call: ParsedCall, key: int) -> ToolResult:
        t0 = time.perf_counter()
        try:
            async with self.slots[call.tool]:
                self.watchdog.started(key)
                result = await bounded_call(self.tools[call.tool], call.tool, call.input, self.deadlines[call.tool])
        except Exception as err:  # noqa: BLE001 - an unknown tool: its call fails, the batch goes on
            result = ToolResult.failure(describe(err), status="client_error", latency_s=time.perf_counter() - t0,
                                        infrastructure=True)
        self.watchdog.answered(key)
        self.results.append((call.tool, result))
        return result


class Episodes:
    """The episodes of one rollout's rows, shared by the decoder thread and the event loop (built on that loop)."""

    def __init__(self, draws: Draws, renderer: Renderer, tools: ToolRunner, limits: Limits,
                 schedule: Callable[[RowQueue], Schedule], refill: Refill | None = None) -> None:
        self.draws, self.renderer, self.tools, self.limits, self.refill = draws, renderer, tools, limits, refill
        self.queue = RowQueue(draws.seqs)
        self.schedule = schedule(self.queue)
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task] = set()
        self.parked: dict[int, Sequence] = {}  # ticket -> the row whose calls went to the event loop
        self.bar: tqdm | None = None  # set by the engine for the length of the rollout
        self.error: BaseException | None = None  # raised by the refill callback (re-raised by the engine)

    # --- the decoder's side (`backends.decoding.Scheduler`) ---------------------------------------------------
    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        self.schedule.tick(self.end_stuck_rows)
        self.end_stuck_rows()
        rows = []
        for seq in self.queue.take(max_n):
            if seq.error and seq.finish_reason is None:  # its prompt could not be built (`RowCodec.row`)
                self._finish(seq, "error")
            else:
                rows.append((seq, self.renderer.stop_strings(seq.tools)))
        return rows

    def wait_ready(self, timeout_s: float) -> None:
        self.schedule.idle(timeout_s, self.end_stuck_rows)

    def unfinished(self) -> int:
        return self.queue.unfinished()

    def abandon(self) -> None:
        self.queue.abandon()

    def segment_ended(self, seq: Sequence, stop: str) -> None:
        """A row's segment ended. Whatever fails while it is read and answered ends that row, never the decoder."""
        try:
            seq.turns += 1
            end = None if stop == "budget" else self.renderer.read(
                _dialogue(seq), seq.response_ids[seq.segment_start:], seq.tools, at_eos=stop == "eos")
            self._carry_out(seq, decide(seq, stop, end, self.limits))
        except RolloutAbandoned:
            raise
        except Exception as err:  # noqa: BLE001 - a parse, a renderer or a tokenizer failing on this row's text
            self._fail(seq, f"its segment could not be read or answered: {describe(err)}")

    def _carry_out(self, seq: Sequence, decision: Decision) -> None:
        if isinstance(decision, Finish):
            self._finish(seq, decision.reason)
        elif isinstance(decision, KeepGenerating):
            self.schedule.rejoin(seq)
        elif None not in decision.answered:  # nothing to run: every call answered as it was read
            self._insert(seq, decision, [result for result in decision.answered if result is not None])
        else:
            self._send(seq, decision)

    def _send(self, seq: Sequence, run: RunTools) -> None:
        """Hand the row's calls to the event loop, watched under the ticket their answer will quote."""
        ticket = self.schedule.ask()
        running = [call for call, result in zip(run.calls, run.answered, strict=True) if result is None]
        what = ", ".join(f"{call.tool}({call.input[:40]!r})" for call in running)
        self.tools.watchdog.parked(ticket, self.row_label(seq), f"tool call(s) {what}", queued=len(running))
        with self.queue.cond:
            self.parked[ticket] = seq
        self.loop.call_soon_threadsafe(self._spawn, seq, run, ticket)

    # --- the event loop's side ----------------------------------------------------------------------------------
    def _spawn(self, seq: Sequence, run: RunTools, ticket: int) -> None:
        task = self.loop.create_task(self._call_tools(seq, run, ticket))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call_tools(self, seq: Sequence, run: RunTools, ticket: int) -> None:
        """Answer the row's calls and hand the answers to its schedule. Whatever fails here ends the row: a raise on
        the event loop would only be logged, and the row wait for ever."""
        try:
            results = await self.tools.answer(run, ticket)
            if self._release(ticket):  # else the watchdog ended the row: its late answer is dropped
                self.schedule.arrive(ticket, partial(self._insert, seq, run, results))
        except Exception as err:  # noqa: BLE001 - see the docstring
            self._release(ticket)
            reason = f"its tool calls could not be answered: {describe(err)}"
            self.schedule.arrive(ticket, partial(self._fail, seq, reason))  # where the answer would have applied

    def _release(self, ticket: int) -> bool:
        with self.queue.cond:
            self.parked.pop(ticket, None)
        return self.tools.watchdog.released(ticket)

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks)

    # --- either side --------------------------------------------------------------------------------------------
    def _insert(self, seq: Sequence, run: RunTools, results: list[ToolResult]) -> None:
        """Append the protocol's rendering of the outputs (mask 0) and record the calls. Outputs it cannot render end
        the row: never train on a context the template would not show."""
        if seq.finish_reason is not None:  # ended while its calls ran (the watchdog): nothing to append
            return
        results = [as_recorded(r) for r in results]
        answered = [(call, shown(r, self.limits)) for call, r in zip(run.calls, results, strict=True)]
        try:
            ids = self.renderer.reply(_dialogue(seq), seq.response_ids[run.call_span[0]:run.call_span[1]], answered)
        except Exception as err:  # noqa: BLE001 - a template or tokenizer failing on this row's outputs
            return self._fail(seq, f"its tool outputs could not be rendered: {describe(err)}")
        self._carry_out(seq, append_outputs(seq, run, results, ids, self.limits))

    def end_stuck_rows(self) -> None:
        """End every row the watchdog finds stuck (decoder thread, wherever it waits or steps), where its answer
        would have applied."""
        for stuck in self.tools.watchdog.stuck():
            with self.queue.cond:
                seq = self.parked.pop(stuck.key, None)
            if seq is not None:
                self.schedule.arrive(stuck.key, partial(self._fail, seq, stuck.reason))

    def row_label(self, seq: Sequence) -> str:
        """A row's name in logs and reasons: its problem's id and its index in the draw order."""
        return f"{seq.problem.id}#{seq.draw_index if seq.draw_index >= 0 else '?'}"

    def _fail(self, seq: Sequence, reason: str) -> None:
        """End `seq` for a failure inside it (either side, any time; a row already ended or queued is left)."""
        with self.queue.cond:
            if seq.finish_reason is not None or self.queue.holds(seq):
                return
        seq.error = valid_text(reason)
        log.warning("trajectory %s ended with an error: %s", self.row_label(seq), reason)
        self._finish(seq, "error")

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        if self.bar is not None:
            self.bar.update()
        k = self.draws.group_of(seq)
        with self.queue.cond:
            self.draws.unfinished[k] -= 1
            if not (self.draws.unfinished[k] == 0 and self.refill is not None):
                self.queue.open -= 1
                self.schedule.settle()
                self.queue.cond.notify()
                return
        # `open` stays up until the refill has queued its rows, or the decoder could stop first
        ticket = self.schedule.ask()
        self.loop.call_soon_threadsafe(self._refill, k, ticket)

    def _refill(self, k: int, ticket: int) -> None:
        """On the event loop, like every refill callback: the callback's problems for closed group k, queued as the
        schedule says; an error is kept for the engine."""
        problems: list[Problem] = []
        try:
            if self.error is None and self.refill is not None:
                problems = list(self.refill(self.draws.group(k)))
        except BaseException as err:  # noqa: BLE001 - a loop callback's exception would only be logged
            self.error = err
        self.schedule.arrive(ticket, partial(self._queue_refill, problems))

    def _queue_refill(self, problems: list[Problem]) -> None:
        with self.queue.cond:
            new = self.draws.add(problems)
            self.queue.ready.extend(new)
            self.queue.open += len(new) - 1
            self.queue.cond.notify()
        if new and self.bar is not None:
            self.bar.total += len(new)
            self.bar.refresh()
