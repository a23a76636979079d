"""The optional KL penalty to the initial model (GRPO's, available to DAPO): values by hand,
micro-batch invariance, that it pulls the policy back to the reference, and its wiring."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from pipeline.config.train import DAPOLoss, GRPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.model import load_policy
from pipeline.trainer.reference import FrozenReference, NoReference, make_reference
from pipeline.train import run
from pipeline.types import TrainBatch
from pipeline.trainer.replicas import OneProcess
from pipeline.trainer.update import (UpdateSettings, apply_policy_gradient, policy_gradient_step,
                                     recomputed_old_logprobs, token_logprobs_and_entropy)
from pipeline.trainer.weights import FullWeights
from tests.helpers.tiny import tiny_llama
from tests.train.test_shared_prefix import _agreeing_group
from tests.train.test_learning import read_history
from tests.train.test_loss import _random_batch, batch_of
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = pytest.mark.integration  # training runs


def with_ref(batch: TrainBatch, ref_BT) -> TrainBatch:
    return dataclasses.replace(batch, ref_logprobs_BT=torch.as_tensor(ref_BT, dtype=torch.float64))


def k3(ref: float, new: float) -> float:
    return math.exp(ref - new) - (ref - new) - 1.0


def test_dapo_kl_by_hand() -> None:
    # the surrogate of test_loss.test_dapo_loss_by_hand (-1.28 + 0.8) plus beta * k3 on the two policy tokens
    batch = with_ref(batch_of([[0.0, 0.0, 0.0]], [[1.0, -1.0, 5.0]], [[1.0, 1.0, 0.0]]), [[0.0, 0.0, -9.0]])
    new = torch.tensor([[0.5, -0.5, 3.0]], dtype=torch.float64)
    out = make_policy_loss(DAPOLoss(kl_coef=0.3)).fn(new, batch)
    kl = k3(0.0, 0.5) + k3(0.0, -0.5)  # 0.1065 + 0.1487; the masked tool token is excluded
    assert math.isclose(float(out.loss_sum), -1.28 + 0.8 + 0.3 * kl, rel_tol=1e-12)
    assert math.isclose(float(out.ref_kl_sum), kl, rel_tol=1e-12)


def test_grpo_kl_is_inside_the_sequence_mean() -> None:
    batch = with_ref(batch_of([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 0.0]]),
                     [[-1.0, 0.0], [0.0, 0.0]])
    out = make_policy_loss(GRPOLoss(kl_coef=0.04)).fn(torch.zeros(2, 2, dtype=torch.float64), batch)
    # row 0: mean(-1 + 0.04 * k3(-1, 0), -1); row 1: -1
    assert math.isclose(float(out.loss_sum), (-2.0 + 0.04 * k3(-1.0, 0.0)) / 2 - 1.0, rel_tol=1e-12)


def test_kl_without_reference_logprobs_is_a_clear_error() -> None:
    batch = batch_of([[0.0]], [[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="kl_coef"):
        make_policy_loss(DAPOLoss(kl_coef=0.1)).fn(torch.zeros(1, 1, dtype=torch.float64), batch)
    assert float(make_policy_loss(DAPOLoss()).fn(torch.zeros(1, 1, dtype=torch.float64), batch).ref_kl_sum) == 0.0


@pytest.mark.parametrize("algo", [DAPOLoss(kl_coef=0.5), GRPOLoss(kl_coef=0.5)])
def test_micro_batching_does_not_change_the_gradient_with_kl(algo) -> None:
    batch = _random_batch(64)
    batch = with_ref(batch, (batch.old_logprobs_BT - 0.3 * batch.loss_mask_BT).tolist())
    grads = []
    for micro in (8, 1):
        model = tiny_llama(64, seed=1, dtype=torch.float64)
        policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, make_policy_loss(algo),
                             UpdateSettings(micro, 1e9, 1.0))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=0) and grads[0].abs().sum() > 0


def test_kl_pulls_the_policy_back_to_the_reference() -> None:
    """With zero advantages only the KL term acts: the policy's log-probs approach the reference's."""
    batch = _random_batch(64)
    batch = dataclasses.replace(batch, advantages_BT=torch.zeros_like(batch.advantages_BT))
    reference = FrozenReference(tiny_llama(64, seed=7, dtype=torch.float64))
    batch = reference.attach(batch, UpdateSettings(3, 1e9, 1.0))
    assert batch.ref_logprobs_BT is not None and torch.all(batch.ref_logprobs_BT[batch.loss_mask_BT == 0] == 0)
    policy = tiny_llama(64, seed=8, dtype=torch.float64)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    gaps, kls = [], []
    for _ in range(30):
        logprobs, _ = token_logprobs_and_entropy(policy, batch, 1.0)
        gaps.append(float(((logprobs.detach() - batch.ref_logprobs_BT).abs() * batch.loss_mask_BT).sum()))
        metrics = policy_gradient_step(policy, optimizer, batch, make_policy_loss(DAPOLoss(kl_coef=1.0)),
                                       UpdateSettings(4, 1e9, 1.0))
        kls.append(metrics["train/ref_kl"])
    assert kls[0] > 0.01  # two different random models
    assert kls[-1] < 0.2 * kls[0] and gaps[-1] < 0.5 * gaps[0], (kls, gaps)
    assert all(not p.requires_grad for p in reference.model.parameters())


def test_reference_is_chosen_once_from_the_config(tmp_path: Path) -> None:
    model_dir = build_direct_model(tmp_path / "model", sft_steps=2)
    plain, anchored = toy_config(tmp_path, model_dir).train, toy_config(tmp_path, model_dir, **{"algorithm.kl_coef": 0.1}).train
    assert isinstance(make_reference(plain.algorithm, plain.init_model, torch.device("cpu"), "float32"), NoReference)
    ref = make_reference(anchored.algorithm, anchored.init_model, torch.device("cpu"), "float32")
    assert isinstance(ref, FrozenReference)
    initial, _ = load_policy(model_dir)
    assert all(torch.equal(a, b) for a, b in zip(ref.model.state_dict().values(), initial.state_dict().values()))
    batch = _random_batch(64)
    assert NoReference().attach(batch, UpdateSettings(4, 1e9, 1.0)) is batch


def test_a_run_with_kl_logs_the_divergence_from_the_initial_model(tmp_path: Path) -> None:
    """Tool-free toy run: step 0 trains the initial model (KL 0); the updated policy then drifts (KL > 0)."""
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, steps=4, checkpoints__every=4, lr=1e-2,
                     **{"algorithm.kl_coef": 0.1, "algorithm.dynamic_sampling": False})
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_tool_calls": 0})})
    run(cfg, {}, metrics_dir=tmp_path / "metrics")
    history = read_history(tmp_path / "metrics" / "train_history.jsonl")
    assert history[0]["train/ref_kl"] < 1e-6
    assert max(history[s]["train/ref_kl"] for s in (1, 2, 3)) > 1e-4


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["float32", "bf16-autocast"])
@pytest.mark.parametrize("share", [False, True], ids=["padded", "packed"])  # data parallelism runs padded
@pytest.mark.parametrize("micro", [2, 4])
def test_the_reference_the_old_logprobs_and_the_update_run_one_forward(share: bool, autocast, micro: int) -> None:
    """Before the first step the policy is the reference: the reference's log-probs, the recomputed old ones and
    the update's own are the same numbers (same micro-batches, layout and precision), so the ratio is exactly 1,
    the KL exactly 0, and with zero advantages nothing moves. A reference run packed beside a padded update (data
    parallelism) or in another precision reported their difference as KL and pushed a gradient."""
    batch = _agreeing_group(64)  # shared prefixes and uneven lengths: packing and padding differ in rounding
    batch = dataclasses.replace(batch, advantages_BT=torch.zeros_like(batch.advantages_BT))
    settings = UpdateSettings(micro, 1e9, 1.0, share_prefixes=share, autocast=autocast)
    batch = FrozenReference(tiny_llama(64, seed=4)).attach(batch, settings)
    policy = tiny_llama(64, seed=4)
    replicas = OneProcess(policy, torch.optim.SGD(policy.parameters(), lr=1.0), 1e9, FullWeights(), share)
    batch = recomputed_old_logprobs(replicas, batch, settings)
    assert torch.equal(batch.old_logprobs_BT, batch.ref_logprobs_BT)
    seen: list[tuple[torch.Tensor, TrainBatch]] = []
    loss = make_policy_loss(DAPOLoss(kl_coef=1.0))
    watched = dataclasses.replace(loss, fn=lambda lp, micro_batch: seen.append((lp.detach(), micro_batch))
                                  or loss.fn(lp, micro_batch))
    metrics = apply_policy_gradient(replicas, batch, watched, settings)
    for logprobs_BT, micro_batch in seen:  # every micro-batch of the first update: ratio exactly 1
        scored = micro_batch.loss_mask_BT.bool()
        assert torch.equal(logprobs_BT[scored], micro_batch.old_logprobs_BT[scored].to(logprobs_BT.dtype))
    assert metrics["train/ref_kl"] == 0.0 and metrics["train/approx_kl"] == 0.0
    assert metrics["train/grad_norm"] == 0.0
