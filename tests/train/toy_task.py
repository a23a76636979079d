"""A toy tool task small enough for a tiny in-process model to learn on CPU in seconds.

Every problem asks "What is 6 * 7?". A cold start (supervised, like the SFT stage) teaches
the tiny model the tag protocol with *two* programs in equal shares: the right one,
`print(6 * 7)`, and a wrong one, `print(6 + 7)`; each trace carries the sandbox's real
output and then copies it as the answer. After the cold start the model writes a
well-formed call almost always but picks the right program about half the time, so RL
has a clear signal: reward rises only if the policy learns to pick `6 * 7`. The same coin flip
is taught for a prompt that offers no tool (answer 42 or 13 directly), for tool-free runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import PreTrainedTokenizerFast

from pydantic import BaseModel

from pipeline.config import RunConfig, load_config
from pipeline.config.train import TrainConfig
from pipeline.jsonl import write_problems
from pipeline.paths import REPO_ROOT
from pipeline.rollout.engine import encode_prompt
from pipeline.protocols import TapoProtocol
from pipeline.sft import Trace, sft_step, to_batch
from pipeline.tools.code import CodeSandboxClient
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama, tiny_tokenizer
from tests.helpers.recipe import PLAIN_RECIPE

QUESTION = "What is 6 * 7? Give the exact integer."
RIGHT, WRONG = "print(6 * 7)", "print(6 + 7)"
DIRECT = "<think>Easy.</think>\n<answer>{}</answer>"  # without tools: answer right (42) or wrong (13)


def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the toy prompt and traces, so a prompt is a few dozen tokens."""
    protocol = TapoProtocol()
    messages = [m for tools in ((), ("code",)) for m in protocol.messages(toy_problems(1)[0], tools)]
    corpus = [m["content"] for m in messages] + [DIRECT.format("42"), DIRECT.format("13")] + [
        protocol.render_call("code", p, "Use Python.") + protocol.wrap_output(o) + protocol.render_answer(o)
        for p, o in ((RIGHT, "42"), (WRONG, "13"))]
    return tiny_tokenizer(corpus, vocab_size=1200)


def toy_problems(n: int = 4) -> list[Problem]:
    return [Problem(f"toy-{i}", QUESTION, ("42",), "calculator", "calculator", "train") for i in range(n)]


async def _outputs(url: str, programs: list[str]) -> list[str]:
    tool = CodeSandboxClient(url)
    try:
        results = await asyncio.gather(*(tool(p) for p in programs))
    finally:
        await tool.aclose()
    assert all(r.ok for r in results), results
    return [r.output.strip() for r in results]


def cold_start_traces(tokenizer, sandbox_url: str) -> list[Trace]:
    """One trace per program (the tool output, mask 0, is the sandbox's real answer), plus tool-less ones."""
    protocol = TapoProtocol()
    prompt = encode_prompt(tokenizer, protocol, toy_problems(1)[0], ("code",))
    traces = []
    for program, output in zip((RIGHT, WRONG), asyncio.run(_outputs(sandbox_url, [RIGHT, WRONG])), strict=True):
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in (
            protocol.render_call("code", program, "Use Python."), protocol.wrap_output(output),
            protocol.render_answer(output))]
        ids[2] = ids[2] + [tokenizer.eos_token_id]
        mask = [0] * len(prompt) + [1] * len(ids[0]) + [0] * len(ids[1]) + [1] * len(ids[2])
        traces.append(Trace(program, tuple(prompt + ids[0] + ids[1] + ids[2]), tuple(mask)))
    return traces + direct_traces(tokenizer)


def direct_traces(tokenizer) -> list[Trace]:
    """The same coin flip when no tool is offered: answer 42 or 13 directly."""
    prompt = encode_prompt(tokenizer, TapoProtocol(), toy_problems(1)[0], ())
    traces = []
    for answer in ("42", "13"):
        ids = tokenizer(DIRECT.format(answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        traces.append(Trace(f"direct-{answer}", tuple(prompt + ids), tuple([0] * len(prompt) + [1] * len(ids))))
    return traces


def build_toy_model(out_dir: Path, sandbox_url: str, sft_steps: int = 80, seed: int = 0) -> Path:
    """Cold-start a tiny Llama on the toy traces and save it (model + tokenizer) to `out_dir`."""
    tokenizer = toy_tokenizer()
    return _cold_start(out_dir, tokenizer, cold_start_traces(tokenizer, sandbox_url), sft_steps, seed)


def build_direct_model(out_dir: Path, sft_steps: int = 60, seed: int = 0) -> Path:
    """Cold-start a tiny Llama on the tool-free coin flip only (no sandbox needed) and save it."""
    tokenizer = toy_tokenizer()
    return _cold_start(out_dir, tokenizer, direct_traces(tokenizer), sft_steps, seed)


def _cold_start(out_dir: Path, tokenizer, traces: list, sft_steps: int, seed: int) -> Path:
    """SFT a fresh tiny Llama on `traces` for `sft_steps` full-batch steps; save model and tokenizer."""
    torch.set_num_threads(1)  # a tiny model: threads only add contention
    model = tiny_llama(len(tokenizer), seed=seed)
    batch = to_batch(traces, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(sft_steps):
        sft_step(model, optimizer, batch, micro_size=4)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def toy_config(root: Path, model_dir: Path, group_size: int = 8, **train: Any) -> RunConfig:
    """The project's params with the toy model, problems and small, fast settings under `root`."""
    train_file = root / "train.jsonl"
    write_problems(train_file, toy_problems())
    overrides = PLAIN_RECIPE | {
        "run.tracking_uri": f"sqlite:///{root / 'mlruns.db'}", "run.torch_threads": 1,
        "train.init_model": str(model_dir), "train.train_file": str(train_file),
        "train.checkpoints.dir": str(root / "ckpt"), "train.output_dir": str(root / "policy"),
        "train.update.gradient_checkpointing": False, "train.optimizer.lr": 1e-3, "train.optimizer.warmup_steps": 0,
        "train.sampling.prompts_per_step": 2, "train.sampling.max_gen_rounds": 1, "train.update.micro_batch_size": 8,
        "rollout.group_size": group_size, "rollout.max_policy_tokens": 64, "reward.overlong_buffer": 16,
        "rollout.max_total_tokens": 1024,
        "rollout.max_tool_calls": 1, "rollout.max_turns": 2,
    } | {train_key(k): v for k, v in train.items()}
    return load_config(REPO_ROOT / "params.yaml", overrides=overrides)


def train_key(name: str) -> str:
    """The dotted key of a `train` setting named by its field (`lr`: `train.optimizer.lr`), or by its section and
    field joined by a double underscore where the name alone is ambiguous (`checkpoints__every`), or dotted
    (`algorithm.kl_coef`)."""
    if "__" in name:
        return "train." + name.replace("__", ".")
    if "." in name or name in TrainConfig.model_fields:  # a dotted key within train (`algorithm.kl_coef`)
        return f"train.{name}"
    found = [f"train.{section}.{name}" for section, field in TrainConfig.model_fields.items()
             if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
             and name in field.annotation.model_fields]
    if len(found) != 1:
        raise KeyError(f"train setting {name!r}: {found or 'no such field'}")
    return found[0]


def write_params(cfg: RunConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path
