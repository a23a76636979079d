"""One optimiser step on a `TrainBatch`: forward, loss / global denominator, backward, clip, step.

Log-probs and entropies come from the same forward pass, computed over the vocabulary in
chunks of positions so a 150k-token vocabulary never materialises a full [B, T, V]
float32 softmax twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.loss import PolicyLoss
from pipeline.types import TrainBatch

ENTROPY_CHUNK = 256  # positions per vocabulary chunk


@dataclass(frozen=True)
class UpdateSettings:
    micro_batch_size: int
    grad_clip: float
    temperature: float  # the rollout temperature: log-probs must come from the same distribution


def token_logprobs_and_entropy(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                               with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token_j | tokens_<j) and the entropy at j, both [B, T] aligned with input_ids (j=0 is 0)."""
    logits_BTV = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT, use_cache=False).logits
    if temperature > 0:
        logits_BTV = logits_BTV / temperature
    B, T = batch.input_ids_BT.shape
    logprobs_BT = logits_BTV.new_zeros((B, T))
    entropy_BT = logits_BTV.new_zeros((B, T))
    targets_BT = batch.input_ids_BT[:, 1:]
    for start in range(0, T - 1, ENTROPY_CHUNK):
        end = min(start + ENTROPY_CHUNK, T - 1)
        chunk = logits_BTV[:, start:end]
        logp_BCV = F.log_softmax(chunk if chunk.dtype == torch.float64 else chunk.float(), dim=-1)
        # logits at position j predict token j+1
        logprobs_BT[:, start + 1 : end + 1] = logp_BCV.gather(-1, targets_BT[:, start:end, None])[..., 0]
        if with_entropy:
            with torch.no_grad():
                entropy_BT[:, start + 1 : end + 1] = -(logp_BCV.exp() * logp_BCV).sum(-1)
    return logprobs_BT, entropy_BT


def micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    return [batch.select(slice(i, i + size)) for i in range(0, len(batch), size)]


def policy_gradient_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch,
                         loss: PolicyLoss, settings: UpdateSettings) -> dict[str, float]:
    """Accumulate gradients over micro-batches, then clip and step once."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    denominator = max(loss.denominator(batch), 1.0)  # the only normalisation of the loss
    n_tokens = max(batch.n_policy_tokens, 1)
    sums = {"loss": 0.0, "clip_low": 0.0, "clip_high": 0.0, "approx_kl": 0.0, "entropy": 0.0}
    for micro in micro_batches(batch, settings.micro_batch_size):
        logprobs_BT, entropy_BT = token_logprobs_and_entropy(model, micro, settings.temperature)
        out = loss.fn(logprobs_BT, micro)
        (out.loss_sum / denominator).backward()
        sums["loss"] += float(out.loss_sum.detach()) / denominator
        sums["clip_low"] += float(out.clipped_low) / n_tokens
        sums["clip_high"] += float(out.clipped_high) / n_tokens
        sums["approx_kl"] += float(out.approx_kl_sum) / n_tokens
        sums["entropy"] += float((entropy_BT * micro.loss_mask_BT).sum()) / n_tokens
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    return {f"train/{k}": v for k, v in sums.items()} | {"train/grad_norm": float(grad_norm)}
