"""The rollout engine with `backend: vllm`: a tool round trip through vLLM, token-exact
(needs `.venv-vllm`). The tiny model is first trained to write a fixed tool-using answer,
so greedy decoding calls the tool for real and must continue from the inserted output."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.engine import RolloutEngine
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.scripted import PROBLEM, SEGMENTS, Multiply, scripted_ids


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
