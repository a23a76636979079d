"""The rollout engine with `backend: vllm`: a tool round trip through vLLM, token-exact
(needs `.venv-vllm`). The tiny model is first trained to write a fixed tool-using answer,
so greedy decoding calls the tool for real and must continue from the inserted output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.engine import RolloutEngine, encode_prompt
from pipeline.protocols import protocol_for
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


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
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
    path = save_tiny(tmp_path_factory.mktemp("scripted"), seed=0)
    model.eval().save_pretrained(path)
    return path


@pytest.mark.slow  # trains the tiny model for ~100 steps and starts its own engine
def test_tool_round_trip_through_vllm_is_token_exact(trained_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    tok = tiny_tokenizer()
    tool = Multiply()
    model = LlamaForCausalLM.from_pretrained(trained_dir)
    cfg = RolloutConfig(backend="vllm", temperature=0.0, max_policy_tokens=64, max_total_tokens=512)
    engine = RolloutEngine(model, tok, {"code": tool}, cfg, seed=0)
    try:
        result = engine.rollout([PROBLEM], 2)
    finally:
        engine.backend.close()
        engine.close()
    prompt, response, _ = scripted_ids(tok)
    for traj in result.groups[0].trajectories:
        assert traj.finish_reason == "answer" and traj.turns == 2
        assert list(traj.prompt_ids) == prompt
        assert list(traj.response_ids) == response[:-1] or list(traj.response_ids) == response
        (call,) = traj.tool_calls
        assert call.input == "print(6 * 7)" and call.result.output == "42"
        o0, o1 = call.output_span
        assert tok.decode(traj.response_ids[o0:o1]) == "\n<response>\n42\n</response>\n"
        assert traj.loss_mask == tuple(0 if o0 <= i < o1 else 1 for i in range(len(traj.response_ids)))
        assert all(lp == 0.0 for lp in traj.logprobs[o0:o1]) and all(lp <= 0.0 for lp in traj.logprobs)
        policy = [t for t, m in zip(traj.response_ids, traj.loss_mask, strict=True) if m]
        assert tok.decode(policy).startswith("".join(SEGMENTS))
    assert tool.calls == ["print(6 * 7)"] * 2
    assert result.stats is not None
