"""Cold-start SFT: teach the tag protocol and tool use before RL.

Small models prompted with tools rarely write a well-formed call, so RL from them gets a
sparse signal (TAPO's limitations section proposes SFT first; ARPO and TEPO do it). Traces
are built from curated problems and *really executed*:

- the scripted teacher writes the problem's own program (`meta["code"]`, from the
  Calculator generator) as a tool call, runs it in the sandbox, appends the sandbox's real
  output exactly as the rollout engine would (loss mask 0), then the answer read from that
  output;
- a trace is kept only when the reward verifier accepts its answer.

The loss is token-level cross-entropy over the teacher's tokens only, normalised by the
batch's count of those tokens (tool output and prompt excluded, as in RL).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.config import RunConfig
from pipeline.jsonl import read_problems, write_json
from pipeline.model import enable_activation_checkpointing, load_policy, model_device
from pipeline.tracking.progress import progress
from pipeline.protocols import ToolProtocol, protocol_for
from pipeline.reward import verify
from pipeline.rollout.engine import cut_middle, encode_plain, encode_prompt
from pipeline.rollout.offered import tools_for
from pipeline.tools.base import Tool
from pipeline.tools.factory import make_tools
from pipeline.tracking.runs import log_metrics, tracked_run
from pipeline.types import Problem, ToolName, TrainBatch
from pipeline.trainer.update import micro_batches, token_logprobs_and_entropy

THOUGHT = "I will compute this exactly with Python."


@dataclass(frozen=True)
class Trace:
    problem_id: str
    input_ids: tuple[int, ...]  # prompt + response
    loss_mask: tuple[int, ...]  # 1 on the teacher's tokens, 0 on prompt and tool output


async def _run_programs(tool: Tool, programs: list[str]) -> list:
    try:
        return await asyncio.gather(*(tool(p) for p in programs))
    finally:
        await tool.aclose()


def scripted_traces(problems: list[Problem], tokenizer, protocol: ToolProtocol, code_tool: Tool,
                    max_output_chars: int) -> list[Trace]:
    """One verified trace per problem that carries a program; the program really runs."""
    usable = [p for p in problems if p.meta.get("code")]
    results = asyncio.run(_run_programs(code_tool, [p.meta["code"] for p in usable]))
    traces = []
    for problem, result in zip(usable, results, strict=True):
        answer = result.output.strip()
        if not result.ok or verify(problem.type, answer, list(problem.answers)) < 0.9:
            continue  # filtered by the verifier: never teach a wrong trace
        prompt = encode_prompt(tokenizer, protocol, problem, tools_for(problem, ("code",)))
        call = _ids(tokenizer, protocol.render_call("code", problem.meta["code"], THOUGHT))
        output = encode_plain(tokenizer, protocol.wrap_output(cut_middle(answer, max_output_chars)))  # tool text is text
        final = _ids(tokenizer, protocol.render_answer(answer)) + [tokenizer.eos_token_id]
        ids = prompt + call + output + final
        mask = [0] * len(prompt) + [1] * len(call) + [0] * len(output) + [1] * len(final)
        traces.append(Trace(problem.id, tuple(ids), tuple(mask)))
    return traces


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


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
             share_prefixes: bool = True) -> float:
    """Cross-entropy over mask-1 tokens, normalised once by the batch's mask-1 count. A micro-batch's rows
    run as their prefix tree where that costs less (`pipeline.trainer.prefix_tree`): the system turn every trace
    opens with (274 tokens of TAPO's both-tool prompt, SmolLM2) then runs once, not once per row."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for micro in micro_batches(batch, micro_size):
        logprobs_BT, _ = token_logprobs_and_entropy(model, micro, temperature=0.0, with_entropy=False,
                                                    share_prefixes=share_prefixes)
        loss = -(logprobs_BT * micro.loss_mask_BT).sum() / max(batch.n_policy_tokens, 1)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return total


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], metrics_dir: Path = Path("metrics")) -> dict[str, float]:
    sc = cfg.sft
    model, tokenizer = load_policy(sc.init_model, cfg.model.dtype, cfg.model.device)
    metrics: dict[str, float] = {"sft/traces": 0.0}
    with tracked_run(cfg.run, "sft", {"sft": sc.model_dump(), "model": cfg.model.model_dump()}):
        if sc.enabled:
            metrics = fine_tune(cfg, model, tokenizer, tool_urls)
        model.save_pretrained(sc.output_dir, safe_serialization=True)
        tokenizer.save_pretrained(sc.output_dir)
    write_json(metrics_dir / "sft.json", metrics)
    return metrics


def fine_tune(cfg: RunConfig, model, tokenizer, tool_urls: Mapping[ToolName, str]) -> dict[str, float]:
    sc = cfg.sft
    torch.manual_seed(cfg.run.seed)
    tools = make_tools(cfg, {k: v for k, v in tool_urls.items() if k == "code"})
    problems = read_problems(sc.train_file)
    traces = scripted_traces(problems, tokenizer, protocol_for(cfg.rollout.protocol), tools["code"],
                             cfg.rollout.max_tool_output_chars)
    if sc.max_traces:
        traces = traces[: sc.max_traces]
    if not traces:
        raise ValueError(f"{sc.train_file}: no problem yields a verified scripted trace (need meta.code)")
    if sc.gradient_checkpointing:
        enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sc.lr, weight_decay=0.0)
    order = random.Random(cfg.run.seed)
    steps_per_epoch = math.ceil(len(traces) / sc.batch_size)
    t0, step, loss = time.perf_counter(), 0, float("nan")
    bar = progress(sc.epochs * steps_per_epoch, "sft", "step")  # a bar on a terminal, else a line every 30 s
    for _ in range(sc.epochs):
        shuffled = order.sample(traces, len(traces))
        for i in range(0, len(shuffled), sc.batch_size):
            batch = to_batch(shuffled[i : i + sc.batch_size], tokenizer.pad_token_id).to(model_device(model))
            loss = sft_step(model, optimizer, batch, micro_size=min(sc.batch_size, 4))
            log_metrics({"sft/loss": loss}, step=step)
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
    bar.close()
    n_tokens = sum(sum(t.loss_mask) for t in traces) * sc.epochs
    return {"sft/traces": float(len(traces)), "sft/steps": float(step), "sft/final_loss": loss,
            "sft/trained_tokens": float(n_tokens), "sft/seconds": time.perf_counter() - t0}
