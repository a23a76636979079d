"""Decoupled PPO (pipeline.rl.off_policy): by hand, its reduction to DAPO without staleness, and a deliberately stale
batch on which the correction is active (every weight truncated, tokens clipped) and the loss and gradient bounded."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.config.off_policy import DecoupledPPOLoss
from pipeline.config.train import DAPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.rl.off_policy import OffPolicyBatch, decoupled_ppo_loss
from pipeline.types import TrainBatch


def batch_of(prox_BT, behaviour_BT, adv_BT, mask_BT) -> OffPolicyBatch:
    prox, behaviour, adv, mask = (torch.tensor(x, dtype=torch.float64) for x in (prox_BT, behaviour_BT, adv_BT, mask_BT))
    ids = torch.zeros(prox.shape, dtype=torch.long)
    return OffPolicyBatch(ids, torch.ones_like(ids), mask, prox, adv * mask, n_policy_tokens=int(mask.sum()),
                          behaviour_logprobs_BT=behaviour)


def test_decoupled_ppo_by_hand() -> None:
    # cap 2, clip [0.8, 1.28]:
    # t1: A=+1, pi_prox = pi_b (w = 1), r = e^0.1 = 1.10517 inside the clip -> -1.10517
    # t2: A=+1, pi_prox = 0.5, pi_b = 0.2 -> w = 2.5, truncated to 2; r = e^0.5 = 1.6487 > 1.28 -> 2 * -1.28 = -2.56
    # t3: A=-1, w = e^(-1 + 0.5) = 0.60653; r = e^-0.5 = 0.60653 < 0.8 -> max(0.60653, 0.8) = 0.8 -> 0.60653 * 0.8
    # t4: tool output (mask 0) whose behaviour log-prob is nan: no part of the loss or of any diagnostic
    batch = batch_of([[0.0, math.log(0.5), -1.0, -3.0]], [[0.0, math.log(0.2), -0.5, math.nan]],
                     [[1.0, 1.0, -1.0, 0.0]], [[1.0, 1.0, 1.0, 0.0]])
    new = torch.tensor([[0.1, math.log(0.5) + 0.5, -1.5, 7.0]], dtype=torch.float64, requires_grad=True)
    loss = decoupled_ppo_loss(DecoupledPPOLoss(behaviour_weight_cap=2.0))
    out = loss.fn(new, batch)
    expected = -math.exp(0.1) - 2.0 * 1.28 + math.exp(-0.5) * 0.8
    assert math.isclose(float(out.loss_sum.detach()), expected, rel_tol=1e-12)
    assert loss.denominator(batch) == 3.0
    assert (float(out.clipped_high), float(out.clipped_low), float(out.truncated)) == (1.0, 1.0, 1.0)
    assert math.isclose(float(out.behaviour_weight_sum), 1.0 + 2.0 + math.exp(-0.5), rel_tol=1e-12)
    # k3 of KL(pi_b || pi_prox) with r = pi_prox / pi_b: t2 (2.5 - 1 - ln 2.5), t3 (e^-0.5 - 1 + 0.5)
    k3 = (2.5 - 1 - math.log(2.5)) + (math.exp(-0.5) - 0.5)
    assert math.isclose(float(out.behaviour_kl_sum), k3, rel_tol=1e-12)
    out.loss_sum.backward()
    # only the unclipped token has a gradient: d(-w A r)/d logp = -w A r = -e^0.1; clipped tokens 0
    torch.testing.assert_close(new.grad, torch.tensor([[-math.exp(0.1), 0.0, 0.0, 0.0]], dtype=torch.float64))


def test_without_staleness_it_is_dapo() -> None:
    g = torch.Generator().manual_seed(0)
    prox = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    mask = (torch.rand(4, 6, generator=g) > 0.3).double()
    adv = torch.randn(4, 6, generator=g, dtype=torch.float64)
    new = prox + torch.randn(4, 6, generator=g, dtype=torch.float64) * 0.3
    batch = batch_of(prox.tolist(), prox.tolist(), adv.tolist(), mask.tolist())
    ours = decoupled_ppo_loss(DecoupledPPOLoss(kl_coef=0.0)).fn(new, batch)
    dapo = make_policy_loss(DAPOLoss()).fn(new, batch)
    for name in ("loss_sum", "clipped_low", "clipped_high", "approx_kl_sum"):
        torch.testing.assert_close(getattr(ours, name), getattr(dapo, name))
    assert float(ours.truncated) == 0.0 and float(ours.behaviour_kl_sum) == 0.0


def test_a_stale_batch_is_corrected_and_bounded() -> None:
    # Sampled three versions ago by a policy that gave every sampled token e^-5 of the probability the proximal policy
    # gives it: the raw weights pi_prox / pi_b = e^5 = 148; the trainer has moved +-1 nat from the proximal policy.
    g = torch.Generator().manual_seed(1)
    prox = -torch.rand(8, 16, generator=g, dtype=torch.float64) * 2 - 0.1
    behaviour = prox - 5.0
    adv = torch.randn(8, 16, generator=g, dtype=torch.float64)
    mask = torch.ones(8, 16, dtype=torch.float64)
    new = (prox + (torch.rand(8, 16, generator=g, dtype=torch.float64) * 2 - 1)).requires_grad_()
    cfg = DecoupledPPOLoss(behaviour_weight_cap=5.0)
    out = decoupled_ppo_loss(cfg).fn(new, batch_of(prox.tolist(), behaviour.tolist(), adv.tolist(), mask.tolist()))
    assert float(out.truncated) == 128.0  # every weight cut to the cap
    assert float(out.clipped_low) > 0 and float(out.clipped_high) > 0  # the trust region around pi_prox acts
    bound = cfg.behaviour_weight_cap * cfg.dual_clip * adv.abs().sum()
    assert abs(float(out.loss_sum.detach())) <= float(bound)
    out.loss_sum.backward()
    # per token |d loss / d logp| = w |A| r where the surrogate is not clipped, else 0: r <= 1 + eps_high for A > 0;
    # for A < 0 a ratio above the range is not clipped (PPO's pessimism) but the dual clip cuts it at c
    grad = new.grad.abs()
    positive = adv > 0
    assert bool((grad[positive] <= cfg.behaviour_weight_cap * (1 + cfg.eps_high) * adv[positive] + 1e-12).all())
    assert bool((grad[~positive] <= cfg.behaviour_weight_cap * cfg.dual_clip * adv[~positive].abs() + 1e-12).all())
    assert float(grad.max()) > 0
    # the unclipped importance-sampling loss on the same batch (tinker-cookbook #822's divergent one) is ~100x larger
    unclipped = -(torch.exp(new.detach() - behaviour) * adv).sum()
    assert abs(float(unclipped)) > 20 * abs(float(out.loss_sum.detach()))


def test_needs_the_behaviour_log_probs() -> None:
    plain = TrainBatch(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2),
                       torch.zeros(1, 2), torch.ones(1, 2), n_policy_tokens=2)
    with pytest.raises(TypeError, match="OffPolicyBatch"):
        decoupled_ppo_loss(DecoupledPPOLoss()).fn(torch.zeros(1, 2), plain)


def test_micro_batches_keep_the_behaviour_log_probs() -> None:
    batch = batch_of([[0.0, -1.0], [-2.0, -3.0]], [[-1.0, -1.5], [-2.5, -3.5]], [[1.0, 1.0], [-1.0, 1.0]],
                     [[1.0, 1.0], [1.0, 1.0]])
    half = batch.select([1])
    assert isinstance(half, OffPolicyBatch) and half.behaviour_logprobs_BT.tolist() == [[-2.5, -3.5]]
    loss = decoupled_ppo_loss(DecoupledPPOLoss())
    new = torch.tensor([[0.1, -0.9], [-2.1, -2.8]], dtype=torch.float64)
    whole = loss.fn(new, batch).loss_sum
    parts = loss.fn(new[:1], batch.select([0])).loss_sum + loss.fn(new[1:], half).loss_sum
    torch.testing.assert_close(whole, parts)
