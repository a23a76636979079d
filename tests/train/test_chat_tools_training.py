"""chat-tools trains through the stages' own entry points: the `sft` stage's traces (the chat template's own
conversation) then DAPO steps (`pipeline.train.run`), on a small SmolLM2-vocabulary model with the packaged
ChatML tool template and the real code sandbox. Every trajectory trained on must be token-exact, which the
engine enforces (a drift raises); here the cold-started model calls the tool in its chat format (malformed
calls included: they are answered, never fatal), the run trains on those trajectories, finishes, and saves a
policy that rolls out with the same protocol. Whether it learns is measured by benchmarks/, not here."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from pipeline.config import config_from_dict
from pipeline.data.calculator import generate
from pipeline.jsonl import write_problems
from pipeline.model import load_policy
from pipeline.rollout.engine import RolloutEngine
from pipeline.sft import run as sft_run
from pipeline.tools.code import CodeSandboxClient
from pipeline.train import run as train_run
from tests.helpers.tiny import tiny_llama
from tests.protocols.chat_helpers import family_tokenizer

ROLLOUT = {"protocol": "chat-tools", "chat_tools": {"template": "hermes"}, "max_total_tokens": 1024,
           "max_policy_tokens": 96, "max_tool_calls": 1, "max_turns": 2, "group_size": 4}


def test_sft_then_dapo_with_chat_tools(code_sandbox_url: str, tmp_path: Path) -> None:
    tok = family_tokenizer("hermes")
    tiny_llama(len(tok), seed=0).save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    # one calculator problem, eight times: the cold start makes the tiny model call the code tool in its format
    [problem] = generate(1, seed=3)
    write_problems(tmp_path / "train.jsonl", [dataclasses.replace(problem, id=f"p{i}") for i in range(8)])
    common = {"rollout": ROLLOUT, "model": {"device": "cpu"}, "reward": {"overlong_buffer": 16},
              "run": {"tracking_uri": f"sqlite:///{tmp_path / 'mlruns.db'}", "torch_threads": 1}}
    sft = config_from_dict(common | {"sft": {
        "init_model": str(tmp_path / "init"), "train_file": str(tmp_path / "train.jsonl"), "max_traces": 8,
        "epochs": 40, "batch_size": 8, "lr": 1e-2, "gradient_checkpointing": False, "output_dir": str(tmp_path / "sft")}})
    sft_run(sft, {"code": code_sandbox_url}, metrics_dir=tmp_path / "sft-metrics")
    cfg = config_from_dict(common | {"train": {
        "init_model": str(tmp_path / "sft"), "train_file": str(tmp_path / "train.jsonl"), "steps": 2,
        "sampling": {"prompts_per_step": 2, "max_gen_rounds": 1},
        "update": {"micro_batch_size": 8, "gradient_checkpointing": False},
        "optimizer": {"lr": 1e-4, "warmup_steps": 0}, "algorithm": {"kind": "grpo", "dynamic_sampling": False},
        "checkpoints": {"dir": str(tmp_path / "ckpt")}, "output_dir": str(tmp_path / "policy")}})
    metrics = train_run(cfg, {"code": code_sandbox_url}, metrics_dir=tmp_path / "metrics")
    assert metrics and all(math.isfinite(v) for v in metrics.values()), metrics
    # the last step's rollouts went past a tool turn (the template's rendering appended) and were trained on
    assert metrics.get("rollout/turns/2", 0) > 0 and metrics["train/grad_norm"] > 0, metrics
    model, tokenizer = load_policy(str(tmp_path / "policy"))
    with RolloutEngine(model, tokenizer, {"code": CodeSandboxClient(code_sandbox_url)}, cfg.rollout) as engine:
        group = engine.rollout(generate(1, seed=9), 2).groups[0]
    assert all(len(t.response_ids) == len(t.loss_mask) for t in group.trajectories)
