"""Precision is never silently lost: one step moves (nearly) every trained weight in every precision the config
accepts, with float32 weights and optimiser state; what it does not accept is refused naming every key.

At lr 1e-5 AdamW stepping bf16 weights directly rounded the update away: one step moved 2.1 % of the tiny
model's weights (float32: 100 %), while loss and gradient norm looked normal.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from pipeline.config import RunConfig
from pipeline.config.combinations import refusals
from pipeline.model import training_forward
from pipeline.sft import sft_step
from pipeline.train import set_up, update
from pipeline.trainer.replicas import OneProcess
from pipeline.trainer.weights import FullWeights, LoraWeights
from pipeline.config.train import LoraFinetune
from tests.helpers.tiny import tiny_llama
from tests.helpers.training import collect_batch
from tests.train.test_shared_prefix import _agreeing_group
from tests.train.toy_task import build_direct_model, toy_config

LORA = {"kind": "lora", "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
SETTINGS = list(itertools.product(("float32", "bfloat16", "float16"), ("full", "lora"), ("none", "bfloat16")))
MOVED = 0.99  # share of trained weights one step must change (float32 moves all but a few: 99.97 %)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_direct_model(tmp_path_factory.mktemp("precision") / "model")


def with_precision(cfg: RunConfig, dtype: str, finetune: str, autocast: str) -> RunConfig:
    train = {"update": cfg.train.update.model_copy(update={"autocast": autocast})} | (
        {"finetune": LoraFinetune(**LORA)} if finetune == "lora" else {})
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": dtype}),
                                  "train": cfg.train.model_copy(update=train)})


def moved_share(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
    return changed / sum(b.numel() for b in before)


@pytest.mark.parametrize(("dtype", "finetune", "autocast"), SETTINGS, ids=["-".join(s) for s in SETTINGS])
def test_one_step_moves_every_weight_in_every_accepted_precision(dtype: str, finetune: str, autocast: str,
                                                                  tmp_path: Path, model_dir: Path) -> None:
    cfg = with_precision(toy_config(tmp_path, model_dir, lr=1e-5), dtype, finetune, autocast)
    refused = refusals(cfg)
    if refused:  # fp16 in one process; train.update.autocast over a lower model.dtype
        assert dtype != "float32" and all("model.dtype" in r for r in refused), refused
        assert dtype == "float16" or autocast != "none", refused
        return
    tr = set_up(cfg, {})
    try:
        trained = [p for p in tr.replicas.model.parameters() if p.requires_grad]
        assert {p.dtype for p in trained} == {torch.float32}  # master weights, whatever model.dtype says
        before = [p.detach().clone() for p in trained]
        kept, _ = collect_batch(tr)
        assert update(tr, kept)["train/skipped"] == 0.0
        share = moved_share(before, [p.detach() for p in trained])
        assert share >= MOVED, f"model.dtype {dtype}, {finetune}, autocast {autocast}: one step moved {share:.1%}"
        assert all(not torch.equal(a, b) for a, b in zip(trained, before, strict=True))
        state = [t for s in tr.replicas.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
        assert all(t.dtype == torch.float32 for t in state if t.is_floating_point())
        if dtype == "bfloat16" and finetune == "full":  # the forward still computes in model.dtype
            assert tr.settings.autocast == torch.bfloat16
    finally:
        tr.engine.close()


def test_float16_without_deepspeed_is_refused_naming_the_keys(tmp_path: Path, model_dir: Path) -> None:
    cfg = with_precision(toy_config(tmp_path, model_dir), "float16", "full", "none")
    assert any("model.dtype = float16, distributed.enabled = False" in r for r in refusals(cfg))
    assert any("model.dtype = float16, sft.enabled = True" in r for r in refusals(cfg))
    for weights in (FullWeights(), LoraWeights(LoraFinetune(**LORA))):
        with pytest.raises(ValueError, match="model.dtype float16 without distributed.enabled"):
            weights.held_dtype("float16", deepspeed=False)
        assert weights.held_dtype("float16", deepspeed=True) == "float16"  # DeepSpeed scales fp16's loss
    assert FullWeights().held_dtype("bfloat16", deepspeed=False) == "float32"
    assert LoraWeights(LoraFinetune(**LORA)).held_dtype("bfloat16", deepspeed=False) == "bfloat16"  # frozen base


def test_no_one_process_optimiser_steps_low_precision_weights() -> None:
    model = tiny_llama(64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"\['torch.bfloat16'\] weights"):
        OneProcess(model, torch.optim.AdamW(model.parameters(), lr=1e-5), 1.0, FullWeights())


def test_an_sft_step_moves_every_weight_with_a_bf16_forward() -> None:
    """The SFT stage keeps float32 master weights too, its forward in model.dtype."""
    model = tiny_llama(64, seed=2)
    autocast = training_forward("bfloat16", "float32", "none", torch.device("cpu"))
    seen = []
    model.model.layers[0].mlp.down_proj.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))
    before = [p.detach().clone() for p in model.parameters()]
    sft_step(model, torch.optim.AdamW(model.parameters(), lr=1e-5), _agreeing_group(64), 4, autocast=autocast)
    assert seen and set(seen) == {torch.bfloat16}
    assert moved_share(before, [p.detach() for p in model.parameters()]) >= MOVED
