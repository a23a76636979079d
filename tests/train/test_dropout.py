"""The update sees the policy the sampler saw: every dropout is off in the update (the sampler and the recomputed
old log-probs run in eval mode), so under `train.update.logprobs_source: recompute` the first mini-batch's ratio is
exactly 1 for a model with dropout; LoRA's own dropout is refused, naming the key."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import (FalconConfig, FalconForCausalLM, Gemma2Config, Gemma2ForCausalLM, GPT2Config, GPT2LMHeadModel,
                          GPTNeoConfig, GPTNeoForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel,
                          Qwen2Config, Qwen2ForCausalLM)

from pipeline.config import ConfigError, load_config
from pipeline.model import load_policy, without_dropout
from pipeline.paths import REPO_ROOT
from pipeline.train import set_up, update
from tests.helpers.training import collect_batch
from tests.train.toy_task import build_direct_model, toy_config

P = 0.5
SMALL = dict(vocab_size=64, hidden_size=32, num_attention_heads=4)
DECODER = SMALL | dict(intermediate_size=48, num_hidden_layers=2, num_key_value_heads=2)
WITH_DROPOUT: dict[str, Callable[[], PreTrainedModel]] = {  # each family's own dropout knobs, all at P
    "llama (attention_dropout, a number)": lambda: LlamaForCausalLM(LlamaConfig(**DECODER, attention_dropout=P)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**DECODER, attention_dropout=P)),
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**DECODER, head_dim=8, attention_dropout=P)),
    "gpt2 (nn.Dropout modules)": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                                                                     resid_pdrop=P, embd_pdrop=P, attn_pdrop=P)),
    "gpt-neo": lambda: GPTNeoForCausalLM(GPTNeoConfig(**SMALL, num_layers=2, attention_types=[[["global"], 2]],
                                                      embed_dropout=P, attention_dropout=P, resid_dropout=P)),
    "falcon (the config's rates, read at each forward)": lambda: FalconForCausalLM(FalconConfig(
        **SMALL, num_hidden_layers=2, hidden_dropout=P, attention_dropout=P)),
}


@pytest.mark.parametrize("name", list(WITH_DROPOUT))
def test_without_dropout_a_training_forward_is_the_eval_forward(name: str) -> None:
    torch.manual_seed(0)
    model = WITH_DROPOUT[name]()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        evaluated = model.eval()(input_ids=ids).logits
        assert not torch.equal(model.train()(input_ids=ids).logits, evaluated)  # dropout was on
        without_dropout(model)
        assert torch.equal(model.train()(input_ids=ids).logits, evaluated)


@pytest.fixture(scope="module")
def dropout_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy task's cold-started model, saved with attention dropout P (Llama's only dropout)."""
    root = tmp_path_factory.mktemp("dropout")
    model, tokenizer = load_policy(build_direct_model(root / "plain"))
    model.config.attention_dropout = P
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return root / "model"


def test_the_first_mini_batch_ratio_is_exactly_one_with_dropout_in_the_model(tmp_path: Path,
                                                                               dropout_model: Path) -> None:
    cfg = toy_config(tmp_path, dropout_model, logprobs_source="recompute", micro_batch_size=4, ppo_epochs=2)
    tr = set_up(cfg, {})
    assert tr.replicas.model.model.layers[0].self_attn.attention_dropout == P  # loaded with dropout on
    seen: list[bool] = []

    def watched(logprobs_BT, micro):
        scored = micro.loss_mask_BT.bool()
        seen.append(bool(torch.equal(logprobs_BT.detach()[scored], micro.old_logprobs_BT[scored])))
        return tr.loss.fn(logprobs_BT, micro)

    try:
        kept, _ = collect_batch(tr)
        metrics = update(dataclasses.replace(tr, loss=dataclasses.replace(tr.loss, fn=watched)), kept)
    finally:
        tr.engine.close()
    n_first = len(seen) // 2  # two epochs over one mini-batch: the first epoch's micro-batches see ratio 1
    assert n_first >= 2 and all(seen[:n_first]), seen
    assert not any(seen[n_first:])  # the second epoch follows an optimiser step
    assert metrics["train/skipped"] == 0.0


def test_lora_dropout_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"train.finetune.lora.dropout: .*must be 0: every dropout is off"):
        load_config(REPO_ROOT / "params.yaml", {"train.finetune": {"kind": "lora", "dropout": 0.05}})
