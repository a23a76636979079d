"""The rollout engine: built once per run, it samples groups of trajectories with tools, one rollout at a time.

Built once: the protocol's token side for the tokenizer (`ToolProtocol.bind`, checked there), the backend
`rollout.backend` names (`backends`: hf decodes on a thread of its own, vLLM batches requests itself), the schedule
`rollout.schedule` names (`schedule.schedule_for`), the trajectory's limits, and one event loop for the engine's
life (tool clients keep connection pools bound to it).

A rollout: its problems drawn (`draws.Draws`), its episodes (`episode.Episodes`: TAPO's Algorithm 1, and how this
departs from it) driven by the backend's decoder, their tool calls run on the event loop; then its groups, in draw
order, and its statistics. Each row samples from a generator of its own, seeded by the rollout (the engine's seed and
`rollouts_started`) and the row's key (`draws`): a caller that samples part of a batch (one rank of
`pipeline.distributed.sharding`) passes the problems' places in the whole batch as `keys`, so a trajectory is the
same whichever rank samples it, and a data-parallel run samples what one process would.

Closing waits a bounded time for everything (CLOSE_GRACE_S each): a tool client's `aclose`, and what is left on the
event loop once cancelled (a call let go at its deadline); a task that ignores its cancellation past that is
abandoned with a warning that names it (`asyncio.Runner.close` would wait for it for ever).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from collections.abc import Sequence as Ordered
from dataclasses import dataclass

from tqdm import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline.config.rollout import RolloutConfig
from pipeline.protocols import Renderer, ToolProtocol, protocol_of
from pipeline.protocols.base import system_turn_length as turn_length
from pipeline.protocols.tokens import chat_ids, encode_plain, special_token_ids  # noqa: F401 - re-exported
from pipeline.rollout.backends import make_backend
from pipeline.rollout.backends.decoding import Decoder, DecoderStats, SamplingParams, Scheduler, eos_ids
from pipeline.rollout.draws import Draws, RowCodec
from pipeline.rollout.episode import BUDGET_EXHAUSTED, Episodes, Limits, Refill, ToolRunner  # noqa: F401 - re-exported
from pipeline.rollout.metrics import RolloutStats
from pipeline.rollout.schedule import schedule_for
from pipeline.rollout.sequence import Sequence
from pipeline.tools.base import Tool, tool_specs
from pipeline.tools.shown import cut_middle  # noqa: F401 - re-exported (pipeline.sft)
from pipeline.types import Group, Problem, ToolName

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 10.0  # how long closing waits for one thing it cancelled (see the module)
_ABANDONED: list[asyncio.Task] = []  # kept from the collector: asyncio would log each again as destroyed pending


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
        self.rows = RowCodec(self.renderer, tokenizer, tuple(tools), self.eos_ids)
        self.limits = Limits.of(cfg)
        self.seed = seed
        self.backend = make_backend(model, tokenizer, cfg, seed)  # chosen once by rollout.backend
        # One event loop for the engine's life: tool clients keep connection pools bound to it. A loop of its own
        # (not the thread's current one), so closing can abandon what will not end (see the module).
        self._runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)
        self._open_runs: set[Episodes] = set()  # the episodes of rollouts whose decoder thread may still run
        self._closed = False
        self.rollouts_started = 0  # seeds each rollout's generators (saved in checkpoints; evaluation sets it)
        self._schedule = schedule_for(cfg)  # resolved once

    def rollout(self, problems: list[Problem], group_size: int, *, temperature: float | None = None,
                refill: Refill | None = None, keys: Ordered[int] | None = None) -> RolloutResult:
        """Sample `group_size` trajectories per problem (synchronous wrapper around `arollout`)."""
        try:
            return self._runner.run(self.arollout(problems, group_size, temperature=temperature, refill=refill, keys=keys))
        except BaseException:  # e.g. a stage's SIGTERM, raised inside the loop: the rollout's task is left pending
            self._abandon_open_runs()  # and its decoder thread, waiting for it, would hold the process at exit
            raise

    def _abandon_open_runs(self) -> None:
        for run in list(self._open_runs):
            run.abandon()

    def close(self) -> None:
        """Close the tool clients, the engine's event loop and the backend, each wait bounded (see the module)."""
        if self._closed:
            return
        self._closed = True
        self._abandon_open_runs()
        self._runner.run(_close_tools(self.tools, CLOSE_GRACE_S))
        _close_loop(self._runner, CLOSE_GRACE_S)
        self.backend.close()

    def __enter__(self) -> RolloutEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def arollout(self, problems: list[Problem], group_size: int, *, temperature: float | None = None,
                       refill: Refill | None = None, keys: Ordered[int] | None = None) -> RolloutResult:
        """`group_size` trajectories per problem; with `refill`, each finished group is handed to it (on the
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
        self.rollouts_started += 1
        rollout_seed = self.seed * 1_000_003 + self.rollouts_started
        decoder = self.backend.decoder(params, seed=rollout_seed)
        draws = Draws(self.rows, group_size, rollout_seed, keys)
        draws.add(problems)
        tools = ToolRunner(self.tools, self.cfg.tool_concurrency)
        run = Episodes(draws, self.renderer, tools, self.limits, self._schedule, refill)
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
        stats = RolloutStats.collect(groups, decoder_stats, tools.results, time.perf_counter() - t0)
        return RolloutResult(groups, stats)

    def _new_sequence(self, problem: Problem) -> Sequence:
        """A problem's row as a rollout starts it (its prompt ids; the tests read them)."""
        return self.rows.row(problem)


def _run_decoder(decoder: Decoder, run: Scheduler) -> DecoderStats:
    """The decoder's loop, off the event loop. A StopIteration escaping it would never reach the awaiting
    coroutine (asyncio cannot set it on a future: the rollout would hang), so it is re-raised as a RuntimeError."""
    try:
        return decoder.run(run)
    except StopIteration as err:
        raise RuntimeError(f"the decoder raised StopIteration: {err!r}") from err


async def _within(awaitable, name: str, grace_s: float) -> bool:
    """Await `awaitable` as a task named `name` for up to `grace_s`; past that it is cancelled and let go. Whether it
    ended; what it raised is raised."""
    task = asyncio.ensure_future(awaitable)
    if isinstance(task, asyncio.Task):
        task.set_name(name)
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if not done:
        task.cancel()
        return False
    task.result()
    return True


async def _close_tools(tools: Mapping[ToolName, Tool], grace_s: float) -> None:
    for name, tool in tools.items():
        if not await _within(tool.aclose(), f"tool {name!r}: aclose", grace_s):
            log.warning("tool %r did not close within %gs; it is let go", name, grace_s)


async def _cancel_the_rest(grace_s: float) -> list[asyncio.Task]:
    """Cancel every other task of the loop and wait up to `grace_s` for them: the ones still running."""
    rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if not rest:
        return []
    for task in rest:
        task.cancel()
    done, pending = await asyncio.wait(rest, timeout=grace_s)
    for task in done:  # as asyncio.Runner.close reports them
        if not task.cancelled() and task.exception() is not None:
            asyncio.get_running_loop().call_exception_handler({
                "message": "unhandled exception while the rollout engine closed", "exception": task.exception(),
                "task": task})
    return sorted(pending, key=lambda task: task.get_name())


def _close_loop(runner: asyncio.Runner, grace_s: float) -> None:
    """Close the runner's loop; tasks that outlive their cancellation by `grace_s` are abandoned, named."""
    stuck = runner.run(_cancel_the_rest(grace_s))
    if not stuck:
        runner.close()
        return
    names = "; ".join(f"{task.get_name()} ({getattr(task.get_coro(), '__qualname__', task.get_coro())})"
                      for task in stuck)
    log.warning("closing the rollout engine: %d task(s) still ran %gs after being cancelled and are abandoned "
                "(a tool client that ignores its cancellation): %s", len(stuck), grace_s, names)
    _ABANDONED.extend(stuck)
    loop = runner.get_loop()
    try:  # the rest of asyncio.Runner.close, each step bounded too
        loop.run_until_complete(_within(loop.shutdown_asyncgens(), "shutdown asyncgens", grace_s))
        loop.run_until_complete(_within(loop.shutdown_default_executor(), "shutdown executor", grace_s))
    finally:
        loop.close()
