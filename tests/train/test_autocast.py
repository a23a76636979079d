"""train.update.autocast: the training forward in bf16 mixed precision, with float32 weights, optimiser state and head."""

from __future__ import annotations

import pytest
import torch

from pipeline import model as model_module
from pipeline.config import ConfigError, load_config
from pipeline.config.train import DAPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.model import bf16_is_native, training_autocast
from pipeline.paths import REPO_ROOT
from pipeline.trainer.reference import FrozenReference
from pipeline.types import TrainBatch
from pipeline.trainer.update import UpdateSettings, policy_gradient_step, token_logprobs_and_entropy
from tests.helpers.tiny import tiny_llama
from tests.train.test_loss import _random_batch
from tests.train.test_shared_prefix import _agreeing_group

BF16 = torch.bfloat16
# (batch, share_prefixes): a group whose rows run as one packed prefix tree, and random rows run padded
PATHS = [pytest.param(lambda: _agreeing_group(64), True, id="prefix-tree"),
         pytest.param(lambda: _random_batch(64), False, id="padded")]


def _output_dtypes(model: torch.nn.Module) -> dict[str, list[torch.dtype]]:
    seen: dict[str, list[torch.dtype]] = {"body": [], "head": []}
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda _m, _a, out: seen["body"].append(out.dtype))
    model.lm_head.register_forward_hook(lambda _m, _a, out: seen["head"].append(out.dtype))
    return seen


@pytest.mark.parametrize(("make_batch", "share"), PATHS)
def test_the_body_runs_in_bf16_and_the_head_in_float32(make_batch, share: bool) -> None:
    model, batch = tiny_llama(64, seed=4), make_batch()
    seen = _output_dtypes(model)
    token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share, autocast=BF16)
    assert seen == {"body": [BF16], "head": [torch.float32]}
    assert "forward" not in model.lm_head.__dict__  # the head's full-precision wrapper is gone afterwards
    token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share)
    assert seen == {"body": [BF16, torch.float32], "head": [torch.float32, torch.float32]}


def test_a_head_with_its_own_forward_gets_it_back() -> None:
    """A wrapper already installed on the head (accelerate puts its device hook there) runs inside ours and stays."""
    model, calls = tiny_llama(64, seed=4), []
    original = model.lm_head.forward

    def own(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(hidden.dtype)
        return original(hidden)

    model.lm_head.forward = own
    token_logprobs_and_entropy(model, _agreeing_group(64), 1.0, share_prefixes=True, autocast=BF16)
    assert calls == [torch.float32] and model.lm_head.forward is own


@pytest.mark.parametrize(("make_batch", "share"), PATHS)
def test_autocast_logprobs_are_near_the_full_precision_ones(make_batch, share: bool) -> None:
    model, batch = tiny_llama(64, seed=4), make_batch()
    with torch.no_grad():
        full, _ = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share)
        mixed, entropy = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share, autocast=BF16)
    scored = batch.loss_mask_BT.bool()
    gap = (mixed - full)[scored].abs()
    assert mixed.dtype == entropy.dtype == torch.float32
    assert 0 < float(gap.max()) < 0.05, gap  # cast for real, and close
    assert torch.all(mixed[~scored] == 0)


def _step(model: torch.nn.Module, batch: TrainBatch, kl_coef: float = 0.0) -> dict[str, float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    settings = UpdateSettings(4, 1e9, 1.0, share_prefixes=True, autocast=BF16)
    metrics = policy_gradient_step(model, optimizer, batch, make_policy_loss(DAPOLoss(kl_coef=kl_coef)), settings)
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
    return metrics


def test_an_autocast_step_moves_every_parameter_and_keeps_them_float32() -> None:
    model, batch = tiny_llama(64, seed=4), _agreeing_group(64)
    before = [p.detach().clone() for p in model.parameters()]
    _step(model, batch)
    after = list(model.parameters())
    assert all(p.dtype == torch.float32 for p in after)
    assert all(not torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_the_reference_runs_in_the_update_precision_so_kl_starts_at_zero() -> None:
    """The policy starts as the reference: in the same precision their log-probs agree exactly; a float32
    reference against a bf16 policy would report (and penalise) the cast's noise as KL."""
    batch = _agreeing_group(64)
    same = FrozenReference(tiny_llama(64, seed=4)).attach(batch, UpdateSettings(4, 1e9, 1.0, True, autocast=BF16))
    assert _step(tiny_llama(64, seed=4), same, kl_coef=1.0)["train/ref_kl"] == 0.0
    full = FrozenReference(tiny_llama(64, seed=4)).attach(batch, UpdateSettings(4, 1e9, 1.0, True))
    assert _step(tiny_llama(64, seed=4), full, kl_coef=1.0)["train/ref_kl"] > 0.0


def test_autocast_needs_float32_weights() -> None:
    assert load_config(REPO_ROOT / "params.yaml", {"train.update.autocast": "bfloat16"}).train.update.autocast == "bfloat16"
    with pytest.raises(ConfigError, match="train.update.autocast = bfloat16, model.dtype = bfloat16: .*needs model.dtype float32"):
        load_config(REPO_ROOT / "params.yaml", {"train.update.autocast": "bfloat16", "model.dtype": "bfloat16"})
    with pytest.raises(ConfigError, match="train.update.autocast"):
        load_config(REPO_ROOT / "params.yaml", {"train.update.autocast": "float16"})


@pytest.mark.parametrize("native", [True, False])
def test_auto_chooses_bf16_only_where_the_device_has_it(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    """`auto` is bf16 on a device that multiplies it natively and the weights' own precision elsewhere: an AVX2-only
    CPU emulates bf16 products ~80x slower than float32 (the main job's first update took over 25 minutes)."""
    monkeypatch.setattr(model_module, "bf16_is_native", lambda device: native)
    cpu = torch.device("cpu")
    assert training_autocast("auto", cpu) == (BF16 if native else None)
    assert training_autocast("none", cpu) is None
    if native:
        assert training_autocast("bfloat16", cpu) == BF16
    else:
        with pytest.warns(UserWarning, match="no native bfloat16"):
            assert training_autocast("bfloat16", cpu) == BF16  # asked for explicitly: kept, with a warning


def test_bf16_is_native_answers_for_this_cpu() -> None:
    # it answers for every device type without raising; on this CPU it agrees with oneDNN's own test
    assert bf16_is_native(torch.device("cpu")) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert bf16_is_native(torch.device("meta")) is False


def test_auto_is_a_setting_and_needs_float32_weights() -> None:
    assert load_config(REPO_ROOT / "params.yaml").train.update.autocast == "auto"  # the main job's default
    with pytest.raises(ConfigError, match="train.update.autocast = auto, model.dtype = bfloat16"):
        load_config(REPO_ROOT / "params.yaml", {"train.update.autocast": "auto", "model.dtype": "bfloat16"})
