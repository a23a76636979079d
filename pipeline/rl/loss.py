"""Policy-gradient losses as pure functions, one per variant, chosen once at set-up.

Each loss returns a *sum* over the micro-batch plus metric sums; `update.py` divides by the
batch-global denominator in exactly one place, so splitting a batch into micro-batches
never changes the gradient.

- DAPO (Yu et al. 2025): token-level sum, clip-higher (eps_low < eps_high), dual clip c for
  negative advantages, no KL. Denominator: policy tokens in the whole batch.
- GRPO: same clipped surrogate with a symmetric eps, but each sequence's tokens are averaged
  first (sequence-mean). Denominator: sequences in the whole batch.
- Dr.GRPO (Liu et al. 2025): GRPO's symmetric clip with neither the std division (`pipeline.rl.advantage`)
  nor the per-sequence 1/|o_i| mean, whose length bias it removes: the token sum is divided by
  sequences x L with L a constant, `rollout.max_policy_tokens` (TRL's `dr_grpo` divides by
  `max_completion_length`). Denominator: sequences in the whole batch x L.

Any may add beta * KL(pi || pi_ref) per policy token (`kl_coef`; GRPO as in DeepSeekMath,
k3 estimate exp(ref - new) - (ref - new) - 1, unbiased and >= 0), aggregated like the
surrogate. DAPO drops the term; we keep it available to DAPO as an anchor for small models
whose rewards are sparse on part of the mix, where behaviour the reward never scores (e.g.
which tool a question gets) can otherwise drift without any pushback.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.config.train import AlgorithmConfig, DAPOLoss, DrGRPOLoss, GRPOLoss
from pipeline.types import TrainBatch


@dataclass(frozen=True)
class LossOutputs:
    loss_sum: torch.Tensor  # scalar, to be divided by the batch-global denominator
    # Diagnostics, over the sampled tokens (TrainBatch.diagnostic_mask_BT: the loss mask's, unless the masking
    # ablation trains on tool output too): the step divides them by the global count of those tokens.
    clipped_low: torch.Tensor  # scalar counts of sampled tokens whose ratio was clipped
    clipped_high: torch.Tensor
    approx_kl_sum: torch.Tensor  # sum over sampled tokens of the k3 estimate of KL(old || new), r = new / old
    ref_kl_sum: torch.Tensor  # sum over sampled tokens of the k3 estimate KL(new || ref); 0 without a KL term


LossFn = Callable[[torch.Tensor, TrainBatch], LossOutputs]


@dataclass(frozen=True)
class PolicyLoss:
    """A resolved variant: the per-micro-batch loss and the global denominator."""

    fn: LossFn
    denominator: Callable[[TrainBatch], float]


def clipped_surrogate_BT(logprobs_BT: torch.Tensor, batch: TrainBatch, eps_low: float, eps_high: float,
                         dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate loss (to minimise) and clip indicators, before masking."""
    log_ratio_BT = logprobs_BT - batch.old_logprobs_BT
    ratio_BT = torch.exp(log_ratio_BT)
    adv_BT = batch.advantages_BT
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * torch.clamp(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
    loss_BT = torch.maximum(unclipped_BT, clipped_BT)
    if dual_clip is not None:  # bound the loss of negative-advantage tokens with huge ratios
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, -adv_BT * dual_clip), loss_BT)
    low_BT = (ratio_BT < 1.0 - eps_low) & (adv_BT < 0)
    high_BT = (ratio_BT > 1.0 + eps_high) & (adv_BT > 0)
    # k3 of KL(old || new) on tokens sampled from old: r = new / old, (r - 1) - log r >= 0 (Schulman)
    k3_BT = torch.exp(log_ratio_BT) - 1.0 - log_ratio_BT
    return loss_BT, low_BT, high_BT, k3_BT


def reference_kl_BT(logprobs_BT: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref) on the sampled tokens (Schulman's k3), >= 0."""
    if batch.ref_logprobs_BT is None:
        raise ValueError("the loss has a KL term (kl_coef > 0) but the batch carries no reference log-probs")
    log_ratio_BT = batch.ref_logprobs_BT - logprobs_BT
    return torch.exp(log_ratio_BT) - log_ratio_BT - 1.0


def no_reference_kl_BT(logprobs_BT: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    return torch.zeros_like(logprobs_BT)


def kl_term(kl_coef: float) -> Callable[[torch.Tensor, TrainBatch], torch.Tensor]:
    """The per-token KL penalty, chosen once: k3 to the reference, or none (no reference needed)."""
    return reference_kl_BT if kl_coef > 0 else no_reference_kl_BT


def dapo_loss(cfg: DAPOLoss) -> PolicyLoss:
    kl_BT_of = kl_term(cfg.kl_coef)

    def fn(logprobs_BT: torch.Tensor, batch: TrainBatch) -> LossOutputs:
        loss_BT, low_BT, high_BT, k3_BT = clipped_surrogate_BT(logprobs_BT, batch, cfg.eps_low, cfg.eps_high, cfg.dual_clip)
        kl_BT = kl_BT_of(logprobs_BT, batch)
        mask_BT, seen_BT = batch.loss_mask_BT, batch.diagnostic_mask_BT
        return LossOutputs(((loss_BT + cfg.kl_coef * kl_BT) * mask_BT).sum(), (low_BT * seen_BT).sum(),
                           (high_BT * seen_BT).sum(), (k3_BT.detach() * seen_BT).sum(), (kl_BT.detach() * seen_BT).sum())

    return PolicyLoss(fn, lambda batch: float(batch.n_policy_tokens))


def sequence_sum_loss(cfg: GRPOLoss | DrGRPOLoss, per_sequence: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> LossFn:
    """GRPO's symmetric clip and KL term, each sequence's masked tokens reduced by `per_sequence`, summed."""
    kl_BT_of = kl_term(cfg.kl_coef)

    def fn(logprobs_BT: torch.Tensor, batch: TrainBatch) -> LossOutputs:
        loss_BT, low_BT, high_BT, k3_BT = clipped_surrogate_BT(logprobs_BT, batch, cfg.eps, cfg.eps, None)
        kl_BT = kl_BT_of(logprobs_BT, batch)
        mask_BT, seen_BT = batch.loss_mask_BT, batch.diagnostic_mask_BT
        per_seq_B = per_sequence((loss_BT + cfg.kl_coef * kl_BT) * mask_BT, mask_BT)
        return LossOutputs(per_seq_B.sum(), (low_BT * seen_BT).sum(), (high_BT * seen_BT).sum(),
                           (k3_BT.detach() * seen_BT).sum(), (kl_BT.detach() * seen_BT).sum())

    return fn


def trained_sequences(batch: TrainBatch) -> float:
    """Rows with at least one policy token (fixed before micro-batching)."""
    return float((batch.loss_mask_BT.sum(-1) > 0).sum())


def grpo_loss(cfg: GRPOLoss) -> PolicyLoss:
    def sequence_mean(per_token_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        return per_token_BT.sum(-1) / mask_BT.sum(-1).clamp(min=1.0)

    return PolicyLoss(sequence_sum_loss(cfg, sequence_mean), trained_sequences)


def dr_grpo_loss(cfg: DrGRPOLoss, max_policy_tokens: int) -> PolicyLoss:
    """Token sums; the batch-global denominator is sequences x max_policy_tokens (no per-sequence length)."""
    def token_sum(per_token_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
        return per_token_BT.sum(-1)

    return PolicyLoss(sequence_sum_loss(cfg, token_sum), lambda batch: trained_sequences(batch) * max_policy_tokens)


def needs_reference(cfg: AlgorithmConfig) -> bool:
    """Whether the configured loss reads reference log-probs (a frozen copy of the initial model)."""
    return cfg.kl_coef > 0


def make_policy_loss(cfg: AlgorithmConfig, max_policy_tokens: int | None = None) -> PolicyLoss:
    """Resolve the configured variant once; the training step never looks at `kind`. Dr.GRPO needs
    `max_policy_tokens` (`rollout.max_policy_tokens`), its constant length."""
    if isinstance(cfg, DrGRPOLoss):
        if max_policy_tokens is None or max_policy_tokens < 1:
            raise ValueError(f"Dr.GRPO divides by sequences x rollout.max_policy_tokens (got {max_policy_tokens})")
        return dr_grpo_loss(cfg, max_policy_tokens)
    if isinstance(cfg, DAPOLoss):
        return dapo_loss(cfg)
    return grpo_loss(cfg)
