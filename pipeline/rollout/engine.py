"""The tool-augmented rollout loop (TAPO Algorithm 1, ToRL's TIR rollout), asynchronous.

One coroutine-free decoder thread generates for every sequence (`pipeline.rollout.backends.hf.HFDecoder`);
tool calls run as asyncio tasks on the event loop, with a concurrency limit per tool. When
a segment ends at tool calls (one for the tag protocols; any number in a chat-tools turn, run together and
answered in the order written), the sequence is parked; the protocol's renderer (`ToolProtocol.bind`) gives
the ids of the results as it shows them (a tag protocol's wrapped output as plain text, `encode_plain`:
special tokens in a tool's output stay text; chat-tools: the chat template's own rendering of the tool
messages, token-exact), appended with loss mask 0, and the sequence rejoins the running batch. Nobody waits for the slowest tool of a whole batch
(TAPO and ToRL do). With the hf backend a row rejoins at a decoding step fixed when it called
(`rollout.readmit_after_steps` later; `_ClockedRun`), not when its tool happens to answer: which
rows share a batch then depends on the sampled tokens alone, so log-probs are bit-identical
however tools are timed, and a killed-and-resumed run with tools reproduces the uninterrupted one.
The price: a row whose tool answered early idles until its step, and the batch waits at that step
for a tool that is later still. `readmit_after_steps: 0` rejoins on arrival instead (vLLM always
does: it batches requests itself).

Budgets, as in ToRL/TAPO: C answered tool calls (later calls are answered "tool budget
exhausted"), `max_turns` generation segments, policy-token and total-token limits (a segment that
ends on the policy budget ends the trajectory, even at a call: nothing could read the output).
Malformed calls get an error message as their tool output, never an exception.

A rollout never dies of its input: a failure inside one trajectory (its prompt, a parse, a tool, the tokenizer,
the template) ends that trajectory with finish reason "error" and the reason on `Trajectory.error` (the scorer
gives it the format penalty), and no row waits for ever (`rollout.watchdog`: each call's deadline, and a
watchdog that names and ends a row left waiting). What still raises from `rollout` is the caller's (a refill
that raised) or the machinery's (a backend failure), never one row's.

A rollout can grow while it runs (`refill`): when a problem's group finishes, a callback may
name further problems, whose sequences join the running batch (on the hf clock, like a tool's
result, `readmit_after_steps` after the group closed). Dynamic sampling uses
it to replace a dropped group without waiting for the rollout's longest rows (`pipeline.sampling.dynamic_sampling`).

Each sequence samples from a generator of its own, seeded by the rollout (the engine's seed and its count of
rollouts) and the sequence's *key*: its problem's place in the batch and its index in the group. A caller that
samples part of a batch (one rank of `pipeline.distributed.sharding`) passes the problems' places in the whole
batch as `keys`, so a trajectory is the same whichever rank samples it, and a data-parallel run samples what one
process would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence as Ordered
from dataclasses import dataclass

from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.backends import make_backend
from pipeline.rollout.backends.decoding import DecoderStats, SamplingParams, eos_ids
from pipeline.rollout.backends.hf import HFDecoder
from pipeline.protocols import Renderer, ToolProtocol, protocol_of
from pipeline.protocols.base import system_turn_length as turn_length
from pipeline.protocols.tokens import chat_ids, encode_plain, special_token_ids  # noqa: F401 - re-exported
from pipeline.rollout.metrics import RolloutStats
from pipeline.rollout.offered import tools_for
from pipeline.rollout.sequence import Sequence
from pipeline.rollout.watchdog import describe
from pipeline.rollout.schedule import BUDGET_EXHAUSTED, Refill, schedule_for  # noqa: F401 - re-exported
from pipeline.tools.shown import cut_middle  # noqa: F401 - re-exported (pipeline.sft)
from pipeline.tools.base import Tool, tool_specs
from pipeline.types import Group, Problem, ToolName


@dataclass(frozen=True)
class RolloutResult:
    groups: list[Group]  # one per problem, in draw order: the input problems, then any a refill added
    stats: RolloutStats


def encode_prompt(tokenizer: PreTrainedTokenizerBase, protocol: ToolProtocol, problem: Problem,
                  tools: tuple[ToolName, ...]) -> list[int]:
    """The chat-templated prompt of a tag protocol (system rules for the offered tools, then the question)."""
    return chat_ids(tokenizer, protocol.messages(problem, tools), add_generation_prompt=True)


def system_turn_length(tokenizer: PreTrainedTokenizerBase, protocol: ToolProtocol, problem: Problem,
                       tools: tuple[ToolName, ...], prompt_ids: list[int]) -> int:
    """How many leading tokens of `prompt_ids` are the system turn alone, as the template renders it
    (0 when there is none, or when the full prompt does not start with exactly those tokens)."""
    return turn_length(tokenizer, protocol.messages(problem, tools), prompt_ids)


class RolloutEngine:
    """Samples groups of trajectories with tools. Build once; call `rollout` per batch."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, tools: dict[ToolName, Tool],
                 cfg: RolloutConfig, *, seed: int = 0) -> None:
        self.model, self.tokenizer, self.tools, self.cfg = model, tokenizer, tools, cfg
        self.protocol: ToolProtocol = protocol_of(cfg)
        self.eos_ids = eos_ids(model, tokenizer)
        # the protocol's token side: prompts, segment reading, the ids appended after calls (checked once here)
        self.renderer: Renderer = self.protocol.bind(tokenizer, tool_specs(tools), self.eos_ids)
        self.seed = seed
        self.backend = make_backend(model, tokenizer, cfg, seed)  # chosen once by rollout.backend
        # One event loop for the engine's life: tool clients keep connection pools bound to it.
        self._runner = asyncio.Runner()
        self._open_runs: set = set()  # the schedulers of rollouts whose decoder thread may still run
        self.calls = 0  # rollouts so far; seeds each rollout's sampler (saved in checkpoints)
        self._schedule = schedule_for(cfg)  # resolved once

    def rollout(self, problems: list[Problem], n: int, *, temperature: float | None = None,
                refill: Refill | None = None, keys: Ordered[int] | None = None) -> RolloutResult:
        """Sample `n` trajectories per problem (synchronous wrapper around `arollout`)."""
        try:
            return self._runner.run(self.arollout(problems, n, temperature=temperature, refill=refill, keys=keys))
        except BaseException:  # e.g. a stage's SIGTERM, raised inside the loop: the rollout's task is left pending
            self._abandon_open_runs()  # and its decoder thread, waiting for it, would hold the process at exit
            raise

    def _abandon_open_runs(self) -> None:
        for run in list(self._open_runs):
            run.abandon()

    def close(self) -> None:
        """Close the tool clients and the engine's event loop."""
        self._abandon_open_runs()
        for tool in self.tools.values():
            self._runner.run(tool.aclose())
        self._runner.close()
        self.backend.close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def arollout(self, problems: list[Problem], n: int, *, temperature: float | None = None,
                       refill: Refill | None = None, keys: Ordered[int] | None = None) -> RolloutResult:
        """`n` trajectories per problem; with `refill`, each finished group is handed to it (on the
        event loop, in the order groups finish) and the problems it returns are sampled too. `keys`: each
        problem's place in the whole batch, in draw order (the input problems, then the refills'); by default
        their positions here (see the module)."""
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
        draws = _Draws(self, n, rollout_seed, keys)
        draws.add(problems)
        run = self._schedule(self, draws, asyncio.get_running_loop(), refill)
        t0 = time.perf_counter()
        # a bar with ETA on a terminal only (disable=None); leave=False: the caller's own bar stays
        self._open_runs.add(run)
        try:
            with tqdm(total=len(draws.seqs), desc="rollout", unit="traj", disable=None, leave=False) as run.bar:
                decoder_stats: DecoderStats = await asyncio.to_thread(_run_decoder, decoder, run)
                await run.drain()
        except BaseException:  # cancelled (a caller's timeout, the loop closing) or failed: the decoder stops too
            run.abandon()
            raise
        finally:
            self._open_runs.discard(run)
        if run.error is not None:
            raise run.error
        groups = [draws.group(k) for k in range(len(draws.problems))]
        stats = RolloutStats.collect(groups, decoder_stats, run.tool_results, time.perf_counter() - t0)
        return RolloutResult(groups, stats)

    def _new_sequence(self, problem: Problem) -> Sequence:
        tools = tools_for(problem, tuple(self.tools))
        try:
            dialogue = self.renderer.start(problem, tools)
        except Exception as err:  # noqa: BLE001 - this problem's prompt: its row ends, the rollout goes on
            return self._unpromptable(problem, tools, err)
        return Sequence(problem=problem, tools=tools, prompt_ids=dialogue.prompt_ids,
                        shared_prefix_len=dialogue.shared_prefix_len, dialogue=dialogue)

    def _unpromptable(self, problem: Problem, tools: tuple[ToolName, ...], err: Exception) -> Sequence:
        """A row whose prompt could not be built: it samples nothing and ends with finish reason "error" when the
        scheduler first takes it. Its prompt ids are the question as plain text (never empty: a batch row must
        have a token; nothing of it is trained, it has no sampled token)."""
        try:
            prompt = encode_plain(self.tokenizer, problem.question)
        except Exception:  # noqa: BLE001 - the question itself is what failed
            prompt = []
        return Sequence(problem=problem, tools=tools, prompt_ids=prompt or [min(self.eos_ids, default=0)],
                        error=f"its prompt could not be built: {describe(err)}")

    def segment_texts(self, seq: Sequence) -> tuple[str, ...]:
        """The policy's text between insertions, each run decoded alone without the end-of-sequence token
        that closed it (`Trajectory.segments`)."""
        runs = seq.sampled_runs()
        return tuple(self.tokenizer.decode(run[:-1] if run and run[-1] in self.eos_ids else run) for run in runs)


def _run_decoder(decoder: HFDecoder, run) -> DecoderStats:
    """The decoder's loop, off the event loop. A StopIteration escaping it would never reach the awaiting
    coroutine (asyncio cannot set it on a future: the rollout would hang), so it is re-raised as a RuntimeError."""
    try:
        return decoder.run(run)
    except StopIteration as err:
        raise RuntimeError(f"the decoder raised StopIteration: {err!r}") from err


class _Draws:
    """A rollout's problems in draw order and their sequences, `n` each; a sequence's generator is seeded by
    its key (its problem's key, by default its position in the draw order, and its index in the group), so its
    tokens depend on which problems were drawn before it, not on timing, nor on the rank sampling it."""

    def __init__(self, engine: RolloutEngine, n: int, rollout_seed: int, keys: Ordered[int] | None = None) -> None:
        self.engine, self.n, self.rollout_seed, self.keys = engine, n, rollout_seed, keys
        self.problems: list[Problem] = []
        self.seqs: list[Sequence] = []
        self.group_of: dict[int, int] = {}  # id(seq) -> index of its problem
        self.index: dict[int, int] = {}  # id(seq) -> its place in the draw order
        self.unfinished: list[int] = []  # per problem: its sequences still running
        self._groups: dict[int, Group] = {}

    def add(self, problems: list[Problem]) -> list[Sequence]:
        first = len(self.problems)
        if self.keys is not None and first + len(problems) > len(self.keys):
            raise ValueError(f"the rollout drew {first + len(problems)} problems but was given {len(self.keys)} keys")
        new = [self.engine._new_sequence(p) for p in problems for _ in range(self.n)]
        for index, seq in enumerate(new, start=len(self.seqs)):  # one generator per sequence
            k, j = divmod(index, self.n)
            key = k if self.keys is None else self.keys[k]
            seq.rng.manual_seed(self.rollout_seed * 100_003 + key * self.n + j)
            self.group_of[id(seq)] = k
            self.index[id(seq)] = index
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
                s.to_trajectory(decode(s.response_ids, skip_special_tokens=True), self.engine.segment_texts(s))
                for s in seqs))
        return self._groups[k]
