"""Cold-start SFT: teach the tag protocol and tool use before RL.

Small models prompted with tools rarely write a well-formed call, so RL from them gets a
sparse signal (TAPO's limitations section proposes SFT first; ARPO and TEPO do it). Traces
are built from curated problems and *really executed*:

- the scripted teacher writes the problem's own program (`meta["code"]`, from the
  Calculator generator) as a tool call, runs it in the sandbox, appends the sandbox's real
  output exactly as the rollout engine would (loss mask 0), then the answer read from that
  output;
- for a question the fact verifier scores (reward.routing), it searches the question itself with
  the real search service, appends what the policy would see of the output, and answers with the first
  gold alias that output shows (`pipeline.data.answerable.shows_answer`);
- a trace is kept only when the reward verifier (routed as in RL) accepts its answer;
- a tool the teacher called without one trace kept (every call failed, found nothing, or showed no accepted
  answer) is a broken service, not hard problems: the stage fails naming it (`pipeline.data.broken`).
The prompt offers the tools the RL rollout will offer the same problem, so the cold start teaches the
choice between them; traces alternate between the two kinds, so `max_traces` keeps both.

The loss is token-level cross-entropy over the teacher's tokens only, normalised by the
batch's count of those tokens (tool output and prompt excluded, as in RL).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from itertools import zip_longest
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.config import RunConfig
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.sft import SFTConfig
from pipeline.data.answerable import shows_answer
from pipeline.data.broken import refuse_if_none_kept, service_of
from pipeline.jsonl import read_problems, write_json
from pipeline.model import enable_activation_checkpointing, load_policy, model_device, training_forward
from pipeline.tracking.progress import progress
from pipeline.repeatable import make_repeatable
from pipeline.protocols import Dialogue, ParsedCall, Renderer, ToolProtocol, protocol_of
from pipeline.reward import route, verify
from pipeline.rollout.backends.decoding import eos_ids
from pipeline.rollout.engine import cut_middle
from pipeline.rollout.offered import tools_for
from pipeline.tools.base import Tool, tool_specs
from pipeline.tools.factory import make_tools
from pipeline.tracking.runs import log_metrics, tracked_run
from pipeline.types import Problem, ToolName, ToolResult, TrainBatch
from pipeline.trainer.update import micro_batches, token_logprobs_and_entropy

THOUGHTS: dict[ToolName, str] = {"code": "I will compute this exactly with Python.", "search": "I should look it up."}


@dataclass(frozen=True)
class Trace:
    problem_id: str
    input_ids: tuple[int, ...]  # prompt + response
    loss_mask: tuple[int, ...]  # 1 on the teacher's tokens, 0 on prompt and tool output


async def _call_all(tool: Tool, inputs: list[str]) -> list[ToolResult]:
    try:
        return await asyncio.gather(*(tool(i) for i in inputs))
    finally:
        await tool.aclose()


def teacher_calls(problems: list[Problem], reward: RewardConfig, tools: Mapping[ToolName, Tool]
                  ) -> list[tuple[Problem, ToolName, str]]:
    """(problem, tool, call input) of each problem the scripted teacher can solve with the run's tools: its own
    program with code, or its question with search when the fact verifier scores it."""
    calls = []
    for problem in problems:
        if problem.meta.get("code") and "code" in tools:
            calls.append((problem, "code", problem.meta["code"]))
        elif route(problem, reward) == "fact" and "search" in tools:
            calls.append((problem, "search", problem.question))
    return calls


def scripted_traces(problems: list[Problem], tokenizer, protocol: ToolProtocol, tools: Mapping[ToolName, Tool],
                    reward: RewardConfig, max_output_chars: int, eos_ids: frozenset[int] | None = None
                    ) -> list[Trace]:
    """One verified trace per problem the teacher can solve; every call really runs. Each trace is built as a
    rollout builds a trajectory (the protocol's `Renderer`: prompt, the call and what ends it, the tool output as
    the protocol shows it, the answer), so the tag protocols and chat-tools are taught their own format. Code
    traces and search traces alternate (in problem order within each kind)."""
    calls = teacher_calls(problems, reward, tools)
    results: dict[ToolName, Iterator[ToolResult]] = {}
    for name in ("code", "search"):
        inputs = [call for _, tool, call in calls if tool == name]
        results[name] = iter(asyncio.run(_call_all(tools[name], inputs))) if inputs else iter(())
    renderer = protocol.bind(tokenizer, tool_specs(tools), eos_ids or frozenset({tokenizer.eos_token_id}))
    by_tool: dict[ToolName, list[Trace]] = {"code": [], "search": []}
    for problem, tool, call in calls:
        result = next(results[tool])
        shown = cut_middle(result.output.strip(), max_output_chars) if result.ok else ""
        answer = shown if tool == "code" else shows_answer(shown, problem.answers)
        if not result.ok or not answer or verify(route(problem, reward), answer, list(problem.answers)) < 0.9:
            continue  # filtered by the verifier: never teach a wrong trace
        by_tool[tool].append(_trace(renderer, problem, tools_for(problem, tuple(tools)), (tool, call), shown, answer))
    refuse_if_none_kept(Counter(tool for _, tool, _ in calls), {t: len(kept) for t, kept in by_tool.items()},
                        {t: service_of(t, tools[t]) for t in by_tool if t in tools}, "the SFT teacher")
    return [t for pair in zip_longest(by_tool["code"], by_tool["search"]) for t in pair if t is not None]


def _trace(renderer: Renderer, problem: Problem, offered: tuple[ToolName, ...], call: tuple[ToolName, str],
           shown: str, answer: str) -> Trace:
    tool, call_input = call
    dialogue = renderer.start(problem, offered)
    call_ids = renderer.segment_ids(renderer.protocol.render_call(tool, call_input, THOUGHTS[tool]), final=False)
    parsed = _read_call(renderer, dialogue, call_ids, offered)
    output = renderer.reply(dialogue, call_ids, [(parsed, shown)])  # tool text is text, as the engine shows it
    final = renderer.segment_ids(renderer.protocol.render_answer(answer), final=True)
    prompt = dialogue.prompt_ids
    ids = prompt + call_ids + output + final
    mask = [0] * len(prompt) + [1] * len(call_ids) + [0] * len(output) + [1] * len(final)
    return Trace(problem.id, tuple(ids), tuple(mask))


def _read_call(renderer: Renderer, dialogue: Dialogue, ids: list[int], tools: tuple[ToolName, ...]) -> ParsedCall:
    """The teacher's call as the rollout reads it: at its stop string (tags), or at the end of its turn (chat)."""
    for at_eos in (False, True):
        calls = renderer.read(dialogue, ids, tools, at_eos=at_eos).calls
        if calls and calls[0].error is None:
            return calls[0]
        if calls:
            raise ValueError(f"the scripted teacher wrote a call its protocol refuses: {calls[0].error}")
    raise ValueError("the scripted teacher's call is not read as a call by its protocol")


def to_batch(traces: list[Trace], pad_id: int) -> TrainBatch:
    width = max(len(t.input_ids) for t in traces)
    ids = torch.full((len(traces), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(traces), width), dtype=torch.long)
    mask = torch.zeros((len(traces), width))
    for i, t in enumerate(traces):
        ids[i, : len(t.input_ids)] = torch.tensor(t.input_ids)
        attn[i, : len(t.input_ids)] = 1
        mask[i, : len(t.loss_mask)] = torch.tensor(t.loss_mask, dtype=torch.float32)
    zeros = torch.zeros_like(mask)
    return TrainBatch(ids, attn, mask, zeros, zeros, n_policy_tokens=int(mask.sum()))


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch, micro_size: int,
             share_prefixes: bool = True, autocast: torch.dtype | None = None) -> float:
    """Cross-entropy over mask-1 tokens, normalised once by the batch's mask-1 count. A micro-batch's rows
    run as their prefix tree where that costs less (`pipeline.trainer.prefix_tree`): the system turn every trace
    opens with (274 tokens of TAPO's both-tool prompt, SmolLM2) then runs once, not once per row."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in micro_batches(batch, micro_size):
        logprobs_BT, _ = token_logprobs_and_entropy(model, micro, temperature=0.0, with_entropy=False,
                                                    share_prefixes=share_prefixes, autocast=autocast)
        loss = -(logprobs_BT * micro.loss_mask_BT).sum() / max(batch.n_policy_tokens, 1)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], metrics_dir: Path = Path("metrics")) -> dict[str, float]:
    """The SFT stage: seeded (run.seed, run.deterministic), the teacher's traces built with the run's tools, the model
    fine-tuned on them and saved to sft.output_dir (the initial model as it is when sft.enabled is false)."""
    sc = cfg.sft
    # float32 master weights whatever model.dtype is; the forward runs in model.dtype (pipeline.model)
    model, tokenizer = load_policy(sc.init_model, "float32", cfg.model.device)
    metrics: dict[str, float] = {"sft/traces": 0.0}
    with tracked_run(cfg.run, "sft", {"sft": sc.model_dump(), "model": cfg.model.model_dump()}):
        if sc.enabled:
            make_repeatable(cfg.run.seed, cfg.run.deterministic)
            tools = make_tools(cfg.rollout.tools, cfg.sandbox, cfg.search, tool_urls)
            traces = teacher_traces(sc, cfg.rollout, cfg.reward, model, tokenizer, tools)
            metrics = fine_tune(sc, model, tokenizer, traces, seed=cfg.run.seed, dtype=cfg.model.dtype)
        model.save_pretrained(sc.output_dir, safe_serialization=True)
        tokenizer.save_pretrained(sc.output_dir)
    write_json(metrics_dir / "sft.json", metrics)
    return metrics


def teacher_traces(sc: SFTConfig, rollout: RolloutConfig, reward: RewardConfig, model, tokenizer,
                   tools: Mapping[ToolName, Tool]) -> list[Trace]:
    """The verified scripted traces of sft.train_file (at most sft.max_traces), in the rollout section's protocol,
    its tool output cut to rollout.max_tool_output_chars, and checked by the reward section's verifiers; none is
    refused, naming the file and the tools."""
    problems = read_problems(sc.train_file)
    traces = scripted_traces(problems, tokenizer, protocol_of(rollout), tools, reward,
                             rollout.max_tool_output_chars, eos_ids(model, tokenizer))
    if sc.max_traces:
        traces = traces[: sc.max_traces]
    if not traces:
        raise ValueError(f"{sc.train_file}: no problem yields a verified scripted trace (need meta.code with the "
                         f"code tool, or a fact question the search tool answers; tools: {sorted(tools)})")
    return traces


def fine_tune(sc: SFTConfig, model, tokenizer, traces: list[Trace], *, seed: int, dtype: str) -> dict[str, float]:
    """Train on `traces` as the sft section says (epochs, batch size, lr, activation checkpointing), the forward
    under model.dtype (`dtype`), the traces shuffled each epoch by a generator seeded with run.seed."""
    if sc.gradient_checkpointing:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sc.lr, weight_decay=0.0)
    autocast = training_forward(dtype, "float32", "none", model_device(model))
    order = random.Random(seed)
    steps_per_epoch = math.ceil(len(traces) / sc.batch_size)
    t0, step, loss = time.perf_counter(), 0, float("nan")
    bar = progress(sc.epochs * steps_per_epoch, "sft", "step")  # a bar on a terminal, else a line every 30 s
    for _ in range(sc.epochs):
        shuffled = order.sample(traces, len(traces))
        for i in range(0, len(shuffled), sc.batch_size):
            batch = to_batch(shuffled[i : i + sc.batch_size], tokenizer.pad_token_id).to(model_device(model))
            loss = sft_step(model, optimizer, batch, micro_size=min(sc.batch_size, 4), autocast=autocast)
            log_metrics({"sft/loss": loss}, step=step)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    n_tokens = sum(sum(t.loss_mask) for t in traces) * sc.epochs
    return {"sft/traces": float(len(traces)), "sft/steps": float(step), "sft/final_loss": loss,
            "sft/trained_tokens": float(n_tokens), "sft/seconds": time.perf_counter() - t0}
