"""The off-policy correction of the asynchronous mode, as a pure loss: decoupled PPO (Hilton et al. 2021; AReaL).

Three policies meet in an asynchronous step: the behaviour policy pi_b that sampled a token (the inference server's
weights then, `behaviour_logprobs_BT`, possibly several versions old), the proximal policy pi_prox (the trainer's
weights at the start of this step, log-probs recomputed once, `old_logprobs_BT`) and pi_theta (being trained):

    loss_t = w_t * max(-A_t * r_t, -A_t * clip(r_t, 1 - eps_low, 1 + eps_high))   (dual clip c for A_t < 0)
    r_t = pi_theta / pi_prox,   w_t = min(pi_prox / pi_b, behaviour_weight_cap)   (a constant: no gradient)

summed over the loss mask like DAPO (token level; the step divides by the batch's policy tokens once, as for
`pipeline.rl.loss`), with the same optional k3 KL term to the reference.

Why decoupled PPO rather than truncated importance sampling with PPO clipping (r = pi_theta / pi_b, clipped):
- The trust region is centred on the proximal policy, the one the step starts from. Clipping the ratio to the
  behaviour policy clips a token as soon as the trainer has moved from it, which after a few versions of staleness
  is every token on one side (no gradient) and none on the other (an unbounded step); the clip then measures the
  staleness, not the update. With the proximal policy the first mini-batch starts at r = 1 whatever the staleness.
- The importance weight that corrects for staleness is truncated, so its variance is bounded: tinker-cookbook #822
  (J. Schulman) measured an unclipped importance-sampling loss destabilise at three steps of staleness (sampler-trainer
  KL x30, entropy collapse) where the clipped `ppo` loss stayed stable.
- Its cost is the proximal log-probs, which the synchronous loop already recomputes (`train.update.logprobs_source:
  recompute`); with no staleness and exact inference log-probs w = 1 and this is DAPO's loss.

Departure from AReaL: AReaL drops the tokens whose weight exceeds the cap (`behav_imp_weight_cap` masks them); we
truncate them to the cap, as IMPALA's V-trace, verl's TIS and prime-rl's min(pi/mu, delta) do. A weight above the cap
means the trainer now likes the token much more than the sampler did, which is what the update is learning; it keeps
a bounded say instead of none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.config.off_policy import DecoupledPPOLoss
from pipeline.rl.loss import LossOutputs, PolicyLoss, clipped_surrogate_BT, kl_term
from pipeline.types import TrainBatch


@dataclass(frozen=True)
class OffPolicyBatch(TrainBatch):
    """A `TrainBatch` whose tokens carry their behaviour log-probs besides the proximal ones (`old_logprobs_BT`)."""

    behaviour_logprobs_BT: torch.Tensor = field(kw_only=True)  # [B, T] float, what the server reported per token


@dataclass(frozen=True)
class OffPolicyLossOutputs(LossOutputs):
    """`LossOutputs` plus the correction's diagnostics, sums over the sampled tokens (divided by their count once)."""

    truncated: torch.Tensor  # scalar count of tokens whose weight pi_prox / pi_b was cut to the cap
    behaviour_weight_sum: torch.Tensor  # sum of the (truncated) weights
    behaviour_kl_sum: torch.Tensor  # sum of the k3 estimate of KL(pi_b || pi_prox): how stale the batch is


def behaviour_weights_BT(batch: OffPolicyBatch, cap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w = min(pi_prox / pi_b, cap) on the sampled tokens, which of them were cut, and k3 of KL(pi_b || pi_prox) per
    token. A token no policy sampled (tool output that the masking ablation trains on) weighs 1: it has no behaviour
    probability to correct. Constants of the loss: no gradient flows through them."""
    seen_BT = batch.diagnostic_mask_BT > 0
    # where, not a product: padding or tool output may hold log-probs whose difference is inf or nan
    log_w_BT = torch.where(seen_BT, batch.old_logprobs_BT - batch.behaviour_logprobs_BT, 0.0).detach()
    raw_BT = torch.exp(log_w_BT)
    truncated_BT = seen_BT & (raw_BT > cap)
    weights_BT = torch.where(seen_BT, raw_BT.clamp(max=cap), 1.0)
    # k3 with r = pi_prox / pi_b on tokens sampled from pi_b: (r - 1) - log r >= 0 (as in pipeline.rl.loss)
    k3_BT = torch.where(seen_BT, raw_BT - 1.0 - log_w_BT, 0.0)
    return weights_BT, truncated_BT, k3_BT


def decoupled_ppo_loss(cfg: DecoupledPPOLoss) -> PolicyLoss:
    """The variant resolved once; `fn(logprobs_BT, batch)` needs an `OffPolicyBatch`."""
    kl_BT_of = kl_term(cfg.kl_coef)

    def fn(logprobs_BT: torch.Tensor, batch: TrainBatch) -> OffPolicyLossOutputs:
        if not isinstance(batch, OffPolicyBatch):
            raise TypeError("decoupled PPO needs the behaviour log-probs: pass an OffPolicyBatch")
        surrogate_BT, low_BT, high_BT, k3_BT = clipped_surrogate_BT(logprobs_BT, batch, cfg.eps_low, cfg.eps_high,
                                                                    cfg.dual_clip)
        weights_BT, truncated_BT, behaviour_k3_BT = behaviour_weights_BT(batch, cfg.behaviour_weight_cap)
        kl_BT = kl_BT_of(logprobs_BT, batch)
        mask_BT, seen_BT = batch.loss_mask_BT, batch.diagnostic_mask_BT
        # the weight corrects the sampling distribution of the surrogate only; the KL anchor is not a sample estimate
        # of the behaviour policy's return and keeps its own (unweighted) form, as in pipeline.rl.loss
        loss_sum = ((weights_BT * surrogate_BT + cfg.kl_coef * kl_BT) * mask_BT).sum()
        return OffPolicyLossOutputs(
            loss_sum, (low_BT * seen_BT).sum(), (high_BT * seen_BT).sum(), (k3_BT.detach() * seen_BT).sum(),
            (kl_BT.detach() * seen_BT).sum(), truncated_BT.sum(), (weights_BT * seen_BT).sum(), behaviour_k3_BT.sum())

    return PolicyLoss(fn, lambda batch: float(batch.n_policy_tokens))
