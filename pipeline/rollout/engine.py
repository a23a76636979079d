"""The tool-augmented rollout loop (TAPO Algorithm 1, ToRL's TIR rollout), asynchronous.

One coroutine-free decoder thread generates for every sequence (`hf_backend.HFDecoder`);
tool calls run as asyncio tasks on the event loop, with a concurrency limit per tool. When
a segment ends at a tool call, the sequence is parked; when the result arrives, its output
is tokenized, appended with loss mask 0 and the sequence is re-admitted to the running
batch. Nobody waits for the slowest tool of a batch (TAPO and ToRL do).

Budgets, as in ToRL/TAPO: C answered tool calls (later calls are answered "tool budget
exhausted"), `max_turns` generation segments, policy-token and total-token limits.
Malformed calls get an error message as their tool output, never an exception.

A rollout can grow while it runs (`refill`): when a problem's group finishes, a callback may
name further problems, whose sequences join the running batch at once. Dynamic sampling uses
it to replace a dropped group without waiting for the rollout's longest rows (`pipeline.group_sampling`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.hf_backend import DecoderStats, HFDecoder, SamplingParams
from pipeline.rollout.metrics import RolloutStats
from pipeline.rollout.protocol import ParsedCall, Protocol, make_protocol, tools_for
from pipeline.rollout.sequence import Sequence
from pipeline.tools.base import Tool
from pipeline.types import Group, Problem, ToolCall, ToolName, ToolResult

BUDGET_EXHAUSTED = "tool budget exhausted: give your final answer now"
NO_OUTPUT = "[no output] print() the values you need"


@dataclass(frozen=True)
class RolloutResult:
    groups: list[Group]  # one per problem, in draw order: the input problems, then any a refill added
    stats: RolloutStats


Refill = Callable[[Group], list[Problem]]  # a finished group -> the problems to start now (often none)


def cut_middle(text: str, limit: int) -> str:
    """Keep head and tail of an over-long tool output (ToRL/TAPO show both ends)."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]}\n...\n{text[-half:]}"


def encode_prompt(tokenizer: PreTrainedTokenizerBase, protocol: Protocol, problem: Problem,
                  tools: tuple[ToolName, ...]) -> list[int]:
    """The chat-templated prompt (system rules for the offered tools, then the question)."""
    return _chat_ids(tokenizer, protocol.messages(problem, tools), add_generation_prompt=True)


def system_turn_length(tokenizer: PreTrainedTokenizerBase, protocol: Protocol, problem: Problem,
                       tools: tuple[ToolName, ...], prompt_ids: list[int]) -> int:
    """How many leading tokens of `prompt_ids` are the system turn alone, as the template renders it
    (0 when there is none, or when the full prompt does not start with exactly those tokens)."""
    messages = protocol.messages(problem, tools)
    if messages[0]["role"] != "system":
        return 0
    turn = _chat_ids(tokenizer, messages[:1], add_generation_prompt=False)
    return len(turn) if len(turn) < len(prompt_ids) and prompt_ids[:len(turn)] == turn else 0


def _chat_ids(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], add_generation_prompt: bool
              ) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class HFBackend:
    """The `hf` backend: a fresh continuous-batching decoder per rollout over the shared model."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg

    def decoder(self, params: SamplingParams, seed: int) -> HFDecoder:
        # `seed` is unused here: each sequence carries its own generator (seeded by the engine).
        return HFDecoder(self.model, self.tokenizer, params, max_batch=self.cfg.max_batch_sequences,
                         max_parked_kv_tokens=self.cfg.max_parked_kv_tokens)

    def update_weights(self, named_tensors) -> None:
        """Nothing to push: the decoder samples from the trained module itself."""

    def close(self) -> None:  # the model belongs to the caller
        pass


def make_backend(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig, seed: int):
    """The generation backend named by `rollout.backend`; vLLM is imported only when selected
    (a missing install raises `VLLMUnavailable` naming the fix). The vllm backend loads the model
    from its directory (`model.name_or_path`) and takes new weights through `update_weights`."""
    if cfg.backend == "vllm":
        from pipeline.rollout.vllm_backend import VLLMBackend

        return VLLMBackend(model, max_batch=cfg.max_batch_sequences, max_model_len=cfg.max_total_tokens, seed=seed,
                           options=cfg.vllm)
    return HFBackend(model, tokenizer, cfg)


class RolloutEngine:
    """Samples groups of trajectories with tools. Build once; call `rollout` per batch."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tools: dict[ToolName, Tool],
                 cfg: RolloutConfig, *, seed: int = 0) -> None:
        self.model, self.tokenizer, self.tools, self.cfg = model, tokenizer, tools, cfg
        self.protocol: Protocol = make_protocol(cfg.protocol)
        self.seed = seed
        self.backend = make_backend(model, tokenizer, cfg, seed)  # chosen once by rollout.backend
        # One event loop for the engine's life: tool clients keep connection pools bound to it.
        self._runner = asyncio.Runner()
        self.calls = 0  # rollouts so far; seeds each rollout's sampler (saved in checkpoints)

    def rollout(self, problems: list[Problem], n: int, *, temperature: float | None = None,
                refill: Refill | None = None) -> RolloutResult:
        """Sample `n` trajectories per problem (synchronous wrapper around `arollout`)."""
        return self._runner.run(self.arollout(problems, n, temperature=temperature, refill=refill))

    def close(self) -> None:
        """Close the tool clients and the engine's event loop."""
        for tool in self.tools.values():
            self._runner.run(tool.aclose())
        self._runner.close()
        self.backend.close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def arollout(self, problems: list[Problem], n: int, *, temperature: float | None = None,
                       refill: Refill | None = None) -> RolloutResult:
        """`n` trajectories per problem; with `refill`, each finished group is handed to it (on the
        event loop, in the order groups finish) and the problems it returns are sampled too."""
        if refill is not None and self.cfg.schedule != "continuous":
            raise ValueError("a refilled rollout needs rollout.schedule: continuous (turn-synchronous rounds "
                             "cannot take new sequences mid-turn)")
        params = SamplingParams(
            temperature=self.cfg.temperature if temperature is None else temperature,
            top_p=self.cfg.top_p,
            max_policy_tokens=self.cfg.max_policy_tokens,
            max_total_tokens=self.cfg.max_total_tokens,
        )
        self.calls += 1
        rollout_seed = self.seed * 1_000_003 + self.calls
        decoder = self.backend.decoder(params, seed=rollout_seed)
        draws = _Draws(self, n, rollout_seed)
        draws.add(problems)
        run = SCHEDULES[self.cfg.schedule](self, draws, asyncio.get_running_loop(), refill)
        t0 = time.perf_counter()
        # a bar with ETA on a terminal only (disable=None); leave=False: the caller's own bar stays
        with tqdm(total=len(draws.seqs), desc="rollout", unit="traj", disable=None, leave=False) as run.bar:
            decoder_stats: DecoderStats = await asyncio.to_thread(decoder.run, run)
            await run.drain()
        if run.error is not None:
            raise run.error
        groups = [draws.group(k) for k in range(len(draws.problems))]
        stats = RolloutStats.collect(groups, decoder_stats, run.tool_results, time.perf_counter() - t0)
        return RolloutResult(groups, stats)

    def _new_sequence(self, problem: Problem) -> Sequence:
        tools = tools_for(problem, tuple(self.tools))
        prompt = encode_prompt(self.tokenizer, self.protocol, problem, tools)
        return Sequence(problem=problem, tools=tools, prompt_ids=prompt,
                        shared_prefix_len=system_turn_length(self.tokenizer, self.protocol, problem, tools, prompt))

    def encode_output(self, text: str) -> list[int]:
        return self.tokenizer(self.protocol.wrap_output(text), add_special_tokens=False)["input_ids"]


class _Draws:
    """A rollout's problems in draw order and their sequences, `n` each; a sequence's generator is seeded
    by its position, so its tokens depend on which problems were drawn before it, not on timing."""

    def __init__(self, engine: RolloutEngine, n: int, rollout_seed: int) -> None:
        self.engine, self.n, self.rollout_seed = engine, n, rollout_seed
        self.problems: list[Problem] = []
        self.seqs: list[Sequence] = []
        self.group_of: dict[int, int] = {}  # id(seq) -> index of its problem
        self.unfinished: list[int] = []  # per problem: its sequences still running
        self._groups: dict[int, Group] = {}

    def add(self, problems: list[Problem]) -> list[Sequence]:
        new = [self.engine._new_sequence(p) for p in problems for _ in range(self.n)]
        for index, seq in enumerate(new, start=len(self.seqs)):  # one generator per sequence
            seq.rng.manual_seed(self.rollout_seed * 100_003 + index)
            self.group_of[id(seq)] = index // self.n
        self.problems += problems
        self.seqs += new
        self.unfinished += [self.n] * len(problems)
        return new

    def group(self, k: int) -> Group:
        """Problem k's finished group (built once)."""
        if k not in self._groups:
            decode = self.engine.tokenizer.decode
            seqs = self.seqs[k * self.n:(k + 1) * self.n]
            self._groups[k] = Group(self.problems[k], tuple(
                s.to_trajectory(decode(s.response_ids, skip_special_tokens=True)) for s in seqs))
        return self._groups[k]


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

    # --- called from the decoder thread -------------------------------------------------
    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        with self.cond:
            taken = [self.ready.popleft() for _ in range(min(max_n, len(self.ready)))]
        return [(s, self.engine.protocol.stop_strings(s.tools)) for s in taken]

    def wait_ready(self, timeout_s: float) -> None:
        with self.cond:
            if not self.ready and self.open > 0:
                self.cond.wait(timeout_s)

    def unfinished(self) -> int:
        with self.cond:
            return self.open

    def segment_ended(self, seq: Sequence, reason: str) -> None:
        seq.turns += 1
        if reason == "eos":
            return self._finish(seq, "eos")
        if reason == "budget":
            return self._finish(seq, "max_tokens")
        segment_text = self.engine.tokenizer.decode(seq.response_ids[seq.segment_start:])
        end = self.engine.protocol.read_segment(segment_text, seq.tools)
        if end.answered:
            return self._finish(seq, "answer")
        if end.call is None:  # a stop string that closes nothing usable: keep generating
            return self._requeue(seq)
        if seq.turns >= self.engine.cfg.max_turns:
            return self._finish(seq, "max_turns")
        call_span = (seq.segment_start, len(seq.response_ids))
        if end.call.error is not None:
            return self._insert(seq, end.call, ToolResult.failure(end.call.error, status="rejected"), call_span)
        if len(seq.tool_calls) >= self.engine.cfg.max_tool_calls:
            return self._insert(seq, end.call, ToolResult.failure(BUDGET_EXHAUSTED, status="budget"), call_span)
        self.loop.call_soon_threadsafe(self._spawn, seq, end.call, call_span)

    # --- event loop side ----------------------------------------------------------------
    def _spawn(self, seq: Sequence, call: ParsedCall, call_span: tuple[int, int]) -> None:
        task = self.loop.create_task(self._call_tool(seq, call, call_span))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _call_tool(self, seq: Sequence, call: ParsedCall, call_span: tuple[int, int]) -> None:
        t0 = time.perf_counter()
        try:
            async with self.limits[call.tool]:
                result = await self.engine.tools[call.tool](call.input)
        except Exception as err:  # a tool that breaks its contract must still not kill the batch (nor train it)
            result = ToolResult.failure(f"{type(err).__name__}: {err}", status="client_error",
                                        latency_s=time.perf_counter() - t0, infrastructure=True)
        self.tool_results.append((call.tool, result))
        self._insert(seq, call, result, call_span)

    async def drain(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks)

    # --- either side --------------------------------------------------------------------
    def _insert(self, seq: Sequence, call: ParsedCall, result: ToolResult, call_span: tuple[int, int]) -> None:
        cfg = self.engine.cfg
        text = cut_middle(result.output.strip() or (NO_OUTPUT if result.ok else "error"), cfg.max_tool_output_chars)
        ids = self.engine.encode_output(text)
        room = cfg.max_total_tokens - len(seq.context_ids)
        output_span = seq.append_inserted(ids[:max(room, 0)])
        seq.tool_calls.append(ToolCall(call.tool, call.input, result, call_span, output_span))
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
        self.loop.call_soon_threadsafe(self._refill_after, k)

    def _refill_after(self, k: int) -> None:
        problems: list[Problem] = []
        try:
            if self.error is None:
                problems = list(self.refill(self.draws.group(k)))
        except BaseException as err:  # noqa: BLE001 - a loop callback's exception would only be logged
            self.error = err
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

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        taken = super().take_ready(max_n)
        with self.cond:
            self.in_turn += len(taken)
        return taken

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
        if self.in_turn == 0 and not self.ready:
            self.ready.extend(self.parked)
            self.parked.clear()
        self.cond.notify()


SCHEDULES: dict[str, type[_Run]] = {"continuous": _Run, "turn-synchronous": _TurnSynchronousRun}
