"""One optimiser step on a `TrainBatch`: forward, loss / global denominator, backward, clip, step.

The step runs against `Replicas` (`pipeline.trainer.replicas`): `OneProcess`, or one rank of a
DeepSpeed job (`pipeline.distributed.replicas`), so both use this same code path.

Log-probs and entropies come from the same forward pass, computed over the vocabulary in
chunks of tokens so a 150k-token vocabulary never materialises a full [N, V] float32
softmax twice.

Departures from TRL/verl, for speed only: a micro-batch's rows run as a prefix tree
(`pipeline.trainer.prefix_tree`), packed into one sequence under a tree attention mask: what rows agree
on (a group's prompt, and often its opening, first call and tool output too) runs once, and no
padding runs: on groups sampled by learning_cpu's SFT model, 2.4x fewer positions and 2.05x faster
than the prompt-shared padded batch before (`benchmarks/shared_prefix_update.py`, CPU). The mask is
dense, [P, P] for P packed tokens, so attention costs more than in a padded batch; a micro-batch
whose rows share little runs padded instead (`shared_prefix.packing_pays`, a FLOP estimate; on a
GPU, where dense masks behave differently, not measured). The mask carries the model's own attention
variants, a sliding window per layer type (`pipeline.trainer.tree_attention`); a model whose attention it
cannot express always runs padded, decided at set-up (`update_settings`). The output head runs only at the trained
tokens (not on prompt, tool output or padding; TRL and verl run it on every response position).
Log-probs and gradients are those of one full pass per row (tested). Optionally (`train.update.autocast`, or a
lower `model.dtype` over float32 master weights: `pipeline.model.training_forward`) the forward runs in bf16
mixed precision with the head and all state in float32 (`forward_precision`). The old log-probs recomputed
before the update and a KL reference's run the update's own forward (`logprobs_as_updated`): the same
micro-batches, layout and precision, so that before the first step the ratio is exactly 1 and the KL 0,
in one process and under data parallelism alike. Every dropout is off in the update (`without_dropout`),
as it is in the sampler's and those forwards' eval mode: with dropout on, the first mini-batch's ratio
was not 1.
Rows are gathered with index_select, never advanced indexing: a repeated index would sum its gradients in
thread order on CPU, and the same batch would give other weights run to run (`pipeline.repeatable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from pipeline.model import without_dropout
from pipeline.rl.loss import PolicyLoss
from pipeline.trainer.replicas import OneProcess, Replicas
from pipeline.trainer.weights import FullWeights
from pipeline.trainer.prefix_tree import PackedTree, pack_tree, packing_pays, prefix_tree
from pipeline.trainer.tree_attention import TreeAttention, Unpackable, tree_attention
from pipeline.types import TrainBatch

ENTROPY_CHUNK = 2048  # trained tokens per vocabulary chunk ([2048, 150k] float32: 1.2 GB)


@dataclass(frozen=True)
class UpdateSettings:
    micro_batch_size: int
    grad_clip: float
    temperature: float  # the rollout temperature: log-probs must come from the same distribution
    # Run a micro-batch's rows as their packed prefix tree (each distinct prefix once) where that pays.
    # Gradient checkpointing re-runs it as it ran: it is one plain call (a 4D mask and explicit positions).
    share_prefixes: bool = False
    # Mixed precision: the forward's matrix products in this dtype (torch.autocast, bf16); the weights,
    # gradients, optimiser state and the output head stay in the weights' dtype. None = all in the weights'.
    autocast: torch.dtype | None = None


def token_logprobs_and_entropy(model: torch.nn.Module, batch: TrainBatch, temperature: float,
                               with_entropy: bool = True, share_prefixes: bool = False,
                               autocast: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(token_j | tokens_<j) and the entropy at j, both [B, T] aligned with input_ids, at the
    trained (loss-mask 1) positions; 0 elsewhere.

    The output head and the softmax over the vocabulary run only where a token is trained: never
    on the prompt nor on tool output, which are most of a TAPO sequence (the system prompt alone
    is ~300 tokens, a cut search result ~250, against ~50 sampled tokens) and, with a 49k-150k
    vocabulary, a large share of the step."""
    B, T = batch.input_ids_BT.shape
    first = _first_scored_position(batch.loss_mask_BT)
    # The head keeps positions first-1 .. T-1 (position j predicts token j+1): kept index c predicts
    # token first+c, so the trained tokens' column offsets from `first` index the kept positions.
    rows_N, cols_N = batch.loss_mask_BT[:, first:].nonzero(as_tuple=True)
    # a model whose attention the tree mask cannot express runs padded whoever asks (`tree_attention`)
    attention = tree_attention(model.config) if share_prefixes else None
    tree_mask = attention if isinstance(attention, TreeAttention) else None
    tree = prefix_tree(batch.input_ids_BT, batch.attention_mask_BT.sum(1).tolist()) if tree_mask is not None else None
    with forward_precision(autocast, batch.input_ids_BT.device):
        if tree is not None and tree_mask is not None and packing_pays(tree.positions(), B, T, _hidden_size(model)):
            logits_NV = _logits_over_prefix_tree(model, batch, pack_tree(tree), tree_mask, rows_N, first + cols_N)
        else:
            with _head_only_at(model, rows_N, cols_N):
                logits_NV = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT,
                                  use_cache=False, logits_to_keep=T - first + 1).logits
    if temperature > 0:
        logits_NV = logits_NV / temperature
    # At least float32 even for a bf16 model: bf16 log-probs (3 significant digits) would put
    # noise of ~1% into every importance ratio.
    out_dtype = torch.promote_types(logits_NV.dtype, torch.float32)
    N = int(rows_N.shape[0])
    logprobs_N = logits_NV.new_zeros(N, dtype=out_dtype)
    entropy_N = logits_NV.new_zeros(N, dtype=out_dtype)
    targets_N = batch.input_ids_BT[rows_N, first + cols_N]
    for start in range(0, N, ENTROPY_CHUNK):
        end = min(start + ENTROPY_CHUNK, N)
        logp_CV = F.log_softmax(logits_NV[start:end].to(out_dtype), dim=-1)
        logprobs_N[start:end] = logp_CV.gather(-1, targets_N[start:end, None])[:, 0]
        if with_entropy:
            with torch.no_grad():
                entropy_N[start:end] = -(logp_CV.exp() * logp_CV).sum(-1)
    trained = (rows_N, first + cols_N)
    return (logits_NV.new_zeros((B, T), dtype=out_dtype).index_put(trained, logprobs_N),
            logits_NV.new_zeros((B, T), dtype=out_dtype).index_put(trained, entropy_N))


def update_settings(micro_batch_size: int, grad_clip: float, temperature: float, replicas: Replicas,
                    autocast: torch.dtype | None) -> UpdateSettings:
    """The update's settings, decided once at set-up. Rows run as prefix trees where the replicas do
    (`Replicas.share_prefixes`) and the tree mask can express the model's attention; otherwise padded,
    and the log says why."""
    share = replicas.share_prefixes
    attention = tree_attention(replicas.module.config) if share else None
    if isinstance(attention, Unpackable):
        print(f"train: rows run padded, not as prefix trees: a tree mask cannot express the model's {attention.why}",
              file=sys.stderr, flush=True)
        share = False
    return UpdateSettings(micro_batch_size, grad_clip, temperature, share_prefixes=share, autocast=autocast)


def forward_precision(autocast: torch.dtype | None, device: torch.device) -> contextlib.AbstractContextManager:
    """The training forward's precision: autocast to `autocast` (None: the weights' own dtype, no context).

    Under bf16 autocast a 2-core CPU with AVX512-BF16 runs SmolLM2's update 1.5x faster
    (benchmarks/autocast_update.py); the price is that the update's log-probs differ from the sampler's
    float32 ones by ~0.014 nats a token on average (the head kept in float32, see `_head_only_at`), noise
    the importance ratio carries unless `train.update.logprobs_source: recompute` takes the old log-probs from this
    same forward (then the ratio is exactly 1 before the first step: benchmarks/autocast_logprob_gap.py). Only the training forward is cast: decoding one token at a time is bound
    by memory traffic and small-matrix overhead, and measured no faster in bf16."""
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=autocast)


@contextlib.contextmanager
def _head_only_at(model: torch.nn.Module, rows_N: torch.Tensor, cols_N: torch.Tensor) -> Iterator[None]:
    """While open, the model's output head sees only the (row, kept position) pairs given: its
    [B, K, H] input is cut to [N, H] by a pre-hook, so a forward's `.logits` is [N, V].

    A hook rather than calling the head on hidden states ourselves, so that every call still goes
    through the model's own forward: DeepSpeed's engine (ZeRO-3 gathers the head's weights there),
    peft's adapters, and model-specific logit post-processing (e.g. soft-capping) all apply."""
    # torch types a Module's other attributes Tensor | Module; the model (or the engine or wrapper that forwards
    # to it) is a transformers model
    head = model.get_output_embeddings()  # type: ignore[operator]
    handle = head.register_forward_pre_hook(lambda _head, args: (_rows_at(args[0], rows_N, cols_N), *args[1:]))
    head_outside_autocast = torch.is_autocast_enabled(rows_N.device.type)
    if head_outside_autocast:
        own_forward = head.__dict__.get("forward")  # e.g. accelerate's device hook, which wraps the class's
        head.forward = _outside_autocast(head)  # an instance attribute: shadows the class's forward
    try:
        yield
    finally:
        handle.remove()
        if head_outside_autocast:
            del head.forward
            if own_forward is not None:
                head.forward = own_forward


def _rows_at(hidden_BKH: torch.Tensor, rows_N: torch.Tensor, cols_N: torch.Tensor) -> torch.Tensor:
    """hidden_BKH[rows_N, cols_N] as [N, H], by index_select: its backward sums in a fixed order (advanced
    indexing's backward accumulates with atomic adds, in thread order, wherever an index repeats)."""
    B, K, H = hidden_BKH.shape
    return hidden_BKH.reshape(B * K, H).index_select(0, rows_N * K + cols_N)


def _outside_autocast(head: torch.nn.Module) -> Callable[..., torch.Tensor]:
    """The head's forward in its weights' dtype under an autocast context: in bf16 its logits (values
    ~10-30, 3 significant digits) would add ~0.01 nats of noise to every log-prob (measured on SmolLM2:
    mean |log-prob error| 0.032 with the head in bf16, 0.020 with it in float32). It runs only at the
    trained tokens, so full precision costs little."""
    forward, dtype = head.forward, head.weight.dtype  # a Linear's weight, which torch types Tensor | Module

    def run(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return forward(hidden.to(dtype), *args, **kwargs)  # type: ignore[arg-type]  # (dtype, above)
    return run


def masked_logprobs_no_grad(model: torch.nn.Module, batch: TrainBatch, micro_batch_size: int,
                            temperature: float, autocast: torch.dtype | None = None,
                            share_prefixes: bool = True) -> torch.Tensor:
    """[B, T] log-probs of the batch's tokens under `model`, without gradient, 0 off the loss mask."""
    settings = UpdateSettings(micro_batch_size, float("inf"), temperature, share_prefixes, autocast)
    return logprobs_as_updated(model, batch, settings)


def logprobs_as_updated(model: torch.nn.Module, batch: TrainBatch, settings: UpdateSettings,
                        passes: int = 0) -> torch.Tensor:
    """[B, T] log-probs of the batch's tokens under `model`, without gradient, 0 off the loss mask, by the
    update's own forward: its micro-batches, layout (packed or padded) and precision, so that a model equal
    to the policy gives exactly the update's log-probs (old log-probs recomputed, a KL reference's). At least
    `passes` forwards run, the last micro-batch repeated (a ZeRO-3 rank runs as many as the busiest)."""
    parts = micro_batches(batch, settings.micro_batch_size)
    with torch.no_grad():
        out = [token_logprobs_and_entropy(model, parts[min(i, len(parts) - 1)], settings.temperature,
                                          with_entropy=False, share_prefixes=settings.share_prefixes,
                                          autocast=settings.autocast)[0] for i in range(max(passes, len(parts)))]
    return padded_cat(out[: len(parts)], batch.input_ids_BT.shape[1]) * batch.loss_mask_BT


def recomputed_old_logprobs(replicas: Replicas, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch:
    """The batch with its old log-probs taken from the policy before this step's first update, by the
    update's own forward (same precision, packing and head; dropout off in both: the ratio is exactly 1 before
    the first step). Every rank runs as many forwards as the busiest (ZeRO-3 gathers parameters inside each)."""
    n_passes = replicas.all_reduce_max(len(micro_batches(batch, settings.micro_batch_size)))
    replicas.model.eval()
    old_BT = logprobs_as_updated(replicas.model, batch, settings, passes=n_passes)
    return dataclasses.replace(batch, old_logprobs_BT=old_BT)


class SampledLogprobs:
    """`train.update.logprobs_source: rollout`: the importance ratio's old log-probs are the ones recorded at sampling."""

    def attach(self, replicas: Replicas, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch:
        return batch


class RecomputedLogprobs:
    """`train.update.logprobs_source: recompute`: the old log-probs from the update's forward (`recomputed_old_logprobs`)."""

    def attach(self, replicas: Replicas, batch: TrainBatch, settings: UpdateSettings) -> TrainBatch:
        return recomputed_old_logprobs(replicas, batch, settings)


def old_logprobs_source(name: str) -> SampledLogprobs | RecomputedLogprobs:
    """The old log-probs' source, chosen once at set-up (`train.update.logprobs_source`)."""
    return RecomputedLogprobs() if name == "recompute" else SampledLogprobs()


def _logits_over_prefix_tree(model: torch.nn.Module, batch: TrainBatch, packed: PackedTree, attention: TreeAttention,
                             rows_N: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """[N, V] logits predicting token tokens_N[n] of row rows_N[n], running each distinct prefix once.

    The rows' prefix tree (`pipeline.trainer.prefix_tree`) runs as one packed sequence under a tree mask, each
    token at its own position: what rows share runs once (its gradient is the sum over the rows below),
    and no padding runs. Token t of a row is predicted at position t - 1, in the node of the row's path
    that holds that position (same context, hence the same logits for every row through it). The mask is cut
    for each kind of attention the model's layers run (`attention`: sliding windows)."""
    device = batch.input_ids_BT.device
    wanted = [packed.index(row, token - 1) for row, token in zip(rows_N.tolist(), tokens_N.tolist(), strict=True)]
    heads = sorted(set(wanted))
    slot = {p: i for i, p in enumerate(heads)}
    ids_P = batch.input_ids_BT[packed.rows_P.to(device), packed.positions_P.to(device)]
    embeddings = model.get_input_embeddings()  # type: ignore[operator]  # a transformers model's, as above
    masks = attention.masks(packed.attend_PP, packed.positions_P, embeddings.weight.dtype)
    masks = {k: m.to(device) for k, m in masks.items()} if isinstance(masks, dict) else masks.to(device)
    cols = torch.tensor(heads, dtype=torch.long, device=device)
    with _head_only_at(model, torch.zeros_like(cols), cols):
        logits = model(input_ids=ids_P[None], position_ids=packed.positions_P[None].to(device),
                       attention_mask=masks, use_cache=False, logits_to_keep=len(ids_P)).logits
    # index_select, not logits[index]: rows through one node repeat its index, and the backward of advanced
    # indexing adds repeated rows' gradients in whatever order the threads run (not reproducible on CPU)
    return logits.index_select(0, torch.tensor([slot[p] for p in wanted], dtype=torch.long, device=device))


def _hidden_size(model: torch.nn.Module) -> int:
    """The model's width, for the packing cost (a DeepSpeed engine forwards `config` to its module)."""
    return int(model.config.hidden_size)  # type: ignore[union-attr, arg-type]  # torch types it Tensor | Module


def _first_scored_position(loss_mask_BT: torch.Tensor) -> int:
    """The earliest position any row trains on (at least 1: position 0 has no prediction)."""
    scored_T = loss_mask_BT.bool().any(0)
    return max(int(scored_T.int().argmax()), 1) if bool(scored_T.any()) else loss_mask_BT.shape[1] - 1


def micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    """Consecutive rows (a group's rows stay together when size is a multiple of the group size), each
    micro-batch cut to its own longest row: a step mixes short calculator and long search rollouts."""
    return [batch.select(slice(i, i + size)).trimmed() for i in range(0, len(batch), size)]


def padded_cat(parts_BT: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-micro-batch [b, t <= width] results as one [B, width] tensor, zero where a micro-batch was cut."""
    return torch.cat([F.pad(part, (0, width - part.shape[1])) for part in parts_BT])


def mean_over_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """One step's update metrics from its several optimiser steps (epochs x mini-batches): their mean."""
    return {k: sum(u[k] for u in updates) / len(updates) for k in updates[0]}


def policy_gradient_step(model: PreTrainedModel, optimizer: torch.optim.Optimizer, batch: TrainBatch,
                         loss: PolicyLoss, settings: UpdateSettings) -> dict[str, float]:
    """Accumulate gradients over micro-batches, then clip and step once (one process, all weights)."""
    replicas = OneProcess(model, optimizer, settings.grad_clip, FullWeights(), settings.share_prefixes)
    return apply_policy_gradient(replicas, batch, loss, settings)


def apply_policy_gradient(replicas: Replicas, batch: TrainBatch, loss: PolicyLoss, settings: UpdateSettings,
                          weight: float = 1.0) -> dict[str, float]:
    """One optimiser step on this rank's `batch`; the denominator is summed over all ranks.

    `weight` 0 marks a rank without data this step: it still runs as many forward/backward
    passes as the busiest rank (ZeRO reduces gradients inside every backward, so all ranks
    must call it equally often) but contributes nothing.
    """
    replicas.model.train()  # gradient checkpointing runs in training mode only
    without_dropout(replicas.module)  # the sampler's forward is in eval mode: the update must see its policy
    replicas.zero_grad()
    # the loss's normaliser, and the count of sampled tokens that the diagnostics are means over
    denominator, n_tokens = replicas.all_reduce_sum([loss.denominator(batch) * weight,
                                                     float(batch.diagnostic_mask_BT.sum()) * weight])
    denominator = max(denominator, 1.0)  # the only normalisation of the loss
    n_tokens = max(n_tokens, 1)
    parts = micro_batches(batch, settings.micro_batch_size)
    n_passes = replicas.all_reduce_max(len(parts))
    sums = {"loss": 0.0, "clip_low": 0.0, "clip_high": 0.0, "approx_kl": 0.0, "ref_kl": 0.0, "entropy": 0.0}
    for i in range(n_passes):
        micro, w = (parts[i], weight) if i < len(parts) else (parts[0], 0.0)
        logprobs_BT, entropy_BT = token_logprobs_and_entropy(replicas.model, micro, settings.temperature,
                                                             share_prefixes=settings.share_prefixes,
                                                             autocast=settings.autocast)
        out = loss.fn(logprobs_BT, micro)
        scaled = out.loss_sum / denominator
        replicas.backward(scaled if w == 1.0 else scaled * w)
        sums["loss"] += w * float(out.loss_sum.detach()) / denominator
        sums["clip_low"] += w * float(out.clipped_low) / n_tokens
        sums["clip_high"] += w * float(out.clipped_high) / n_tokens
        sums["approx_kl"] += w * float(out.approx_kl_sum) / n_tokens
        sums["ref_kl"] += w * float(out.ref_kl_sum) / n_tokens
        sums["entropy"] += w * float((entropy_BT * micro.diagnostic_mask_BT).sum()) / n_tokens
    grad_norm = replicas.step()
    totals = dict(zip(sums, replicas.all_reduce_sum(list(sums.values())), strict=True))
    return {f"train/{k}": v for k, v in totals.items()} | {"train/grad_norm": grad_norm}
