"""A tiny Llama cold-started for each rollout protocol, so that one RL step under any combination has signal.

Per protocol the cold start teaches two tool calls in equal shares, a right and a wrong one, each with
the real service's output (the code sandbox for tapo and torl on "What is 6 * 7?", the search service for
search-r1 on a fact question), then the answer that output leads to (`tests.train.toy_task`'s coin flip,
for every protocol). The sampled groups are mixed, so dynamic sampling keeps some; every trajectory has a
tool output; and the choice is made before the output and the answer after it is settled, so a call is
entropy-reducing (TEPO has a signal to give).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig

from pipeline.config import RunConfig
from pipeline.rollout.engine import cut_middle, encode_prompt
from pipeline.protocols import protocol_for
from pipeline.sft import Trace, sft_step, to_batch
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import Problem, ToolName
from tests.helpers.tiny import tiny_llama, tiny_tokenizer


CONVERGED_LOSS = 0.1  # per policy token, over the two traces


@dataclass(frozen=True)
class ProtocolTask:
    protocol: str
    tool: ToolName
    problem: Problem
    right_call: str  # the tool inputs the cold start teaches, and the answers that follow them
    wrong_call: str
    right: str
    wrong: str


CALC = Problem("toy-calc", "What is 6 * 7? Give the exact integer.", ("42",), "calculator", "calculator", "train")
FACT = Problem("toy-fact", "Which country is the city of Paris the capital of?", ("France",), "fact", "nq_open",
               "train")
TASKS = {
    "tapo": ProtocolTask("tapo", "code", CALC, "print(6 * 7)", "print(6 + 7)", "42", "13"),
    "torl": ProtocolTask("torl", "code", CALC, "print(6 * 7)", "print(6 + 7)", "42", "13"),
    "search-r1": ProtocolTask("search-r1", "search", FACT, "Paris capital country", "Madrid capital country",
                              "France", "Spain"),
}


async def _tool_outputs(task: ProtocolTask, cfg: RunConfig, url: str) -> list[str]:
    tool = CodeSandboxClient(url) if task.tool == "code" else SearchClient.from_config(cfg.search, url)
    try:
        results = [await tool(call) for call in (task.right_call, task.wrong_call)]
    finally:
        await tool.aclose()
    assert all(r.ok for r in results), results
    return [cut_middle(r.output.strip(), cfg.rollout.max_tool_output_chars) for r in results]


def build_protocol_model(out_dir: Path, task: ProtocolTask, cfg: RunConfig, url: str, sft_steps: int = 200,
                         new_model: Callable[[int], torch.nn.Module] = lambda vocab: tiny_llama(vocab, seed=0),
                         lr: float = 1e-2) -> Path:
    """Cold-start a tiny Llama (`new_model(vocab_size)`) on `task`'s two traces under its protocol (the real
    tool outputs); save it. Raises when the cold start did not converge: an undertrained model samples
    malformed calls, so every group fails alike and a matrix row would test nothing (`lr` suits the model:
    the vLLM suite's model, with its scaled-up output head, diverges at the main suite's 1e-2)."""
    protocol = protocol_for(task.protocol)
    outputs = asyncio.run(_tool_outputs(task, cfg, url))
    texts = [[protocol.render_call(task.tool, call, "Use the tool."), protocol.wrap_output(output),
              protocol.render_answer(answer)]
             for call, output, answer in zip((task.right_call, task.wrong_call), outputs, (task.right, task.wrong),
                                             strict=True)]
    messages = [m["content"] for m in protocol.messages(task.problem, (task.tool,))]
    tokenizer = tiny_tokenizer(messages + [t for trace in texts for t in trace], vocab_size=1200)
    prompt = encode_prompt(tokenizer, protocol, task.problem, (task.tool,))
    traces = []
    for call, output, answer in texts:
        call_ids, output_ids, answer_ids = (tokenizer(t, add_special_tokens=False)["input_ids"]
                                            for t in (call, output, answer))
        answer_ids = answer_ids + [tokenizer.eos_token_id]
        mask = [0] * len(prompt) + [1] * len(call_ids) + [0] * len(output_ids) + [1] * len(answer_ids)
        traces.append(Trace(answer, tuple(prompt + call_ids + output_ids + answer_ids), tuple(mask)))
    torch.set_num_threads(1)
    model = new_model(len(tokenizer)).train()
    batch = to_batch(traces, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = [sft_step(model, optimizer, batch, micro_size=4) for _ in range(sft_steps)]
    if losses[-1] > CONVERGED_LOSS:  # the coin flip alone costs ln 2 on one token in ~16: ~0.04
        raise AssertionError(f"the {task.protocol} cold start did not converge: loss {losses[-1]:.3f} after "
                             f"{sft_steps} steps at lr {lr} (want <= {CONVERGED_LOSS})")
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
