"""Continuous-batching generation with transformers (the `hf` backend; CPU or GPU).

The decoder keeps a batch of sequences generating together. Between two decoding steps it
drops the rows that just ended a segment (at a tool call, an answer, EOS or a budget) and
admits rows whose tool result has arrived: their context is prefilled and their KV cache
merged into the running batch (both left-padded to a common length). So a sequence waiting
on a tool never holds up the others, and the generator idles only when every unfinished
sequence is waiting on a tool.

Sampled tokens are appended exactly as sampled (never decoded and re-tokenized), with the
log-probability of the temperature-scaled distribution they were drawn from.

Departure from vLLM-style engines: no prefix cache, so a re-admitted sequence prefills its
whole context again; at the lengths this backend serves (a few thousand tokens) that costs
far less than idling on tools.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache

from pipeline.rollout.sequence import Sequence

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, H, T, D]
STOP_TAIL_TOKENS = 16  # tokens decoded to look for a stop string that spans token boundaries


@dataclass(frozen=True)
class SamplingParams:
    temperature: float  # 0 = greedy
    top_p: float
    max_policy_tokens: int
    max_total_tokens: int


@dataclass
class DecoderStats:
    busy_s: float = 0.0
    idle_s: float = 0.0
    sampled_tokens: int = 0
    prefill_tokens: int = 0
    steps: int = 0


@dataclass
class _Batch:
    rows: list[Sequence] = field(default_factory=list)
    stops: list[tuple[str, ...]] = field(default_factory=list)
    cache: DynamicCache | None = None
    attn_BT: torch.Tensor | None = None  # [B, T] 1 = real token in the cache
    next_ids_B: torch.Tensor | None = None  # [B] sampled, not yet fed
    positions_B: torch.Tensor | None = None  # [B] position id of the next fed token


class Scheduler(Protocol):
    """What the decoder needs from the rollout loop (implemented by rollout.engine)."""

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]: ...
    def wait_ready(self, timeout_s: float) -> None: ...
    def unfinished(self) -> int: ...
    def segment_ended(self, seq: Sequence, reason: str) -> None: ...


class HFDecoder:
    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, params: SamplingParams,
                 *, max_batch: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.params = params
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @torch.no_grad()
    def run(self, scheduler: Scheduler) -> DecoderStats:
        """Generate until every sequence has finished; segment ends go to the scheduler."""
        stats, batch = DecoderStats(), _Batch()
        was_training = self.model.training
        self.model.eval()
        try:
            while scheduler.unfinished() > 0:
                free = self.max_batch - len(batch.rows)
                new = scheduler.take_ready(free) if free > 0 else []
                if not new and not batch.rows:
                    t0 = time.perf_counter()
                    scheduler.wait_ready(0.05)
                    stats.idle_s += time.perf_counter() - t0
                    continue
                t0 = time.perf_counter()
                if new:
                    self._admit(batch, new, stats, scheduler)
                if batch.rows:
                    self._step(batch, stats, scheduler)
                stats.busy_s += time.perf_counter() - t0
        finally:
            self.model.train(was_training)
        return stats

    def _admit(self, batch: _Batch, new: list[tuple[Sequence, tuple[str, ...]]], stats: DecoderStats,
               scheduler: Scheduler) -> None:
        contexts = [seq.context_ids for seq, _ in new]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(new), width), dtype=torch.long)
        for i, ctx in enumerate(contexts):  # left padding keeps every row's last token at the end
            ids[i, width - len(ctx):] = torch.tensor(ctx)
            attn[i, width - len(ctx):] = 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids.to(self.device), attention_mask=attn.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1)
        stats.prefill_tokens += int(attn.sum())
        next_ids = self._sample(out.logits[:, -1, :], [seq for seq, _ in new])
        new_kv = _kv(out.cache)
        new_positions = attn.sum(-1)
        if batch.rows:
            kv, batch_attn = _merge(_kv(batch.cache), batch.attn_BT, new_kv, attn.to(self.device))
            batch.next_ids_B = torch.cat([batch.next_ids_B, next_ids])
            batch.positions_B = torch.cat([batch.positions_B, new_positions.to(self.device)])
        else:
            kv, batch_attn = new_kv, attn.to(self.device)
            batch.next_ids_B, batch.positions_B = next_ids, new_positions.to(self.device)
        batch.cache, batch.attn_BT = DynamicCache(ddp_cache_data=kv), batch_attn
        batch.rows += [seq for seq, _ in new]
        batch.stops += [stops for _, stops in new]
        self._retire_stopped(batch, list(range(len(batch.rows) - len(new), len(batch.rows))), scheduler)

    def _step(self, batch: _Batch, stats: DecoderStats, scheduler: Scheduler) -> None:
        ones = torch.ones((len(batch.rows), 1), dtype=batch.attn_BT.dtype, device=self.device)
        batch.attn_BT = torch.cat([batch.attn_BT, ones], dim=1)
        out = self.model(input_ids=batch.next_ids_B[:, None], attention_mask=batch.attn_BT,
                         position_ids=batch.positions_B[:, None], cache=batch.cache, use_cache=True)
        batch.cache = out.cache
        batch.positions_B = batch.positions_B + 1
        batch.next_ids_B = self._sample(out.logits[:, -1, :], batch.rows)
        stats.steps += 1
        stats.sampled_tokens += len(batch.rows)
        self._retire_stopped(batch, list(range(len(batch.rows))), scheduler)

    def _sample(self, logits_BV: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
        """Sample one token per row and append it (mask 1) with its log-prob."""
        logits_BV = logits_BV.float().cpu()
        temperature = self.params.temperature
        logp_BV = F.log_softmax(logits_BV / temperature if temperature > 0 else logits_BV, dim=-1)
        if temperature == 0:
            tokens_B = logp_BV.argmax(-1)
        else:
            probs_BV = _top_p(logp_BV.exp(), self.params.top_p)
            tokens_B = torch.cat([torch.multinomial(p_V, 1, generator=seq.rng) for p_V, seq in zip(probs_BV, rows)])
        chosen_B = logp_BV.gather(-1, tokens_B[:, None])[:, 0]
        entropy_B = -(logp_BV.exp() * logp_BV).sum(-1)  # of the distribution sampled from (TEPO reads it)
        for seq, tok, lp, h in zip(rows, tokens_B.tolist(), chosen_B.tolist(), entropy_B.tolist(), strict=True):
            seq.append_sampled(tok, lp, h)
        return tokens_B.to(self.device)

    def _retire_stopped(self, batch: _Batch, candidates: list[int], scheduler: Scheduler) -> None:
        ended = {i: reason for i in candidates if (reason := self._segment_end(batch.rows[i], batch.stops[i]))}
        if not ended:
            return
        keep = [i for i in range(len(batch.rows)) if i not in ended]
        for i, reason in ended.items():
            scheduler.segment_ended(batch.rows[i], reason)
        _select_rows(batch, keep)

    def _segment_end(self, seq: Sequence, stops: tuple[str, ...]) -> str | None:
        last = seq.response_ids[-1]
        if last in self.eos_ids:
            return "eos"
        tail_ids = seq.response_ids[max(seq.segment_start, len(seq.response_ids) - STOP_TAIL_TOKENS):]
        if stops and any(s in self.tokenizer.decode(tail_ids) for s in stops):
            return "stop"
        if seq.policy_tokens >= self.params.max_policy_tokens or len(seq.context_ids) >= self.params.max_total_tokens:
            return "budget"
        return None


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return {i for i in ids if i is not None}


def _top_p(probs_BV: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs_BV
    sorted_p, order = probs_BV.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p  # keep the smallest prefix reaching top_p
    sorted_p[drop] = 0.0
    return torch.zeros_like(probs_BV).scatter(-1, order, sorted_p)


def _kv(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _merge(kv_a: KV, attn_a: torch.Tensor, kv_b: KV, attn_b: torch.Tensor) -> tuple[KV, torch.Tensor]:
    """Stack two left-padded batches; padded cache slots are masked out by attn."""
    width = max(attn_a.shape[1], attn_b.shape[1])
    kv = [
        (torch.cat([_left_pad(ka, width, 2), _left_pad(kb, width, 2)]),
         torch.cat([_left_pad(va, width, 2), _left_pad(vb, width, 2)]))
        for (ka, va), (kb, vb) in zip(kv_a, kv_b, strict=True)
    ]
    return kv, torch.cat([_left_pad(attn_a, width, 1), _left_pad(attn_b, width, 1)])


def _select_rows(batch: _Batch, keep: list[int]) -> None:
    """Keep the given rows and drop cache columns that are padding in every remaining row."""
    batch.rows = [batch.rows[i] for i in keep]
    batch.stops = [batch.stops[i] for i in keep]
    if not keep:
        batch.cache = batch.attn_BT = batch.next_ids_B = batch.positions_B = None
        return
    index = torch.tensor(keep, device=batch.attn_BT.device)
    attn = batch.attn_BT.index_select(0, index)
    first_real = int(attn.any(0).int().argmax())
    kv = [(k.index_select(0, index)[:, :, first_real:], v.index_select(0, index)[:, :, first_real:])
          for k, v in _kv(batch.cache)]
    batch.cache = DynamicCache(ddp_cache_data=kv)
    batch.attn_BT = attn[:, first_real:]
    batch.next_ids_B = batch.next_ids_B.index_select(0, index)
    batch.positions_B = batch.positions_B.index_select(0, index)
