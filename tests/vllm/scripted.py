"""The scripted tiny model of the vLLM tests: trained to write one fixed tool-using answer, so that greedy decoding
calls the code tool for real and must continue from the inserted output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline.protocols import protocol_for
from pipeline.rollout.engine import encode_prompt
from pipeline.types import Problem, ToolResult
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.tiny_vllm import save_tiny, tiny_model

SEGMENTS = ["<think>compute</think> <code>print(6 * 7)</code>", "<answer>42</answer>"]
PROBLEM = Problem("p0", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")


class Multiply:
    """A deterministic code tool double: evaluates `print(a * b)` (digits and * only)."""

    name = "code"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, code: str) -> ToolResult:
        self.calls.append(code)
        await asyncio.sleep(0.05)
        a, b = code.removeprefix("print(").removesuffix(")").split("*")
        return ToolResult(str(int(a) * int(b)), ok=True, latency_s=0.05)

    async def aclose(self) -> None:
        pass


def scripted_ids(tok) -> tuple[list[int], list[int], list[int]]:
    """Prompt, response and the response positions the model must learn (the sampled ones)."""
    protocol = protocol_for("tapo")
    prompt = encode_prompt(tok, protocol, PROBLEM, ("code",))
    seg1, seg2 = (tok(s, add_special_tokens=False)["input_ids"] for s in SEGMENTS)
    out = tok(protocol.wrap_output("42"), add_special_tokens=False)["input_ids"]
    response = seg1 + out + seg2 + [tok.eos_token_id]
    learned = list(range(len(seg1))) + list(range(len(seg1) + len(out), len(response)))
    return prompt, response, learned


def train_scripted(path: Path) -> Path:
    """Save the tiny model at `path`, trained to write SEGMENTS around the tool's answer to PROBLEM."""
    tok = tiny_tokenizer()
    prompt, response, learned = scripted_ids(tok)
    model = tiny_model(len(tok), seed=0).train()
    ids = torch.tensor([prompt + response])
    targets = torch.tensor(response)[learned]
    positions = torch.tensor(learned) + len(prompt) - 1  # logits at t predict token t + 1
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = F.cross_entropy(model(ids).logits[0, positions], targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    save_tiny(path, seed=0)
    model.eval().save_pretrained(path)
    return path
