"""Continuous-batching generation with transformers (the `hf` backend; CPU or GPU).

The decoder keeps a batch of sequences generating together. Between two decoding steps it
drops the rows that just ended a segment (at a tool call, an answer, EOS or a budget) and
admits the rows the scheduler hands it: their context is prefilled and their KV cache merged
into the running batch (both left-padded to a common length). So a sequence waiting on a tool
never holds up the others. The scheduler counts decoding steps (`take_ready` is called once per
step) and hands back a row whose tool was called at step s at step s + `rollout.readmit_after_steps`
(`rollout.schedule.Clocked`), so which rows share a batch, and hence every row's float rounding, does not
depend on how fast tools answer.

Sampled tokens are appended exactly as sampled (never decoded and re-tokenized), with the
log-probability of the temperature-scaled distribution they were drawn from. Each row draws
from its own generator (`next_token.py`), so its tokens do not depend on which rows share its batch,
which depends on tool latency.

A parked sequence keeps its own KV cache (the real columns of its row, copied out when it
leaves the batch), so on re-admission only the new tokens are prefilled: the last sampled
token and the tool output. Without it, every tool turn re-prefills the whole context, which
on CPU cost ~70% of rollout time (measured with the rollout-overlap benchmark). The parked
caches are bounded by `max_parked_kv_tokens`; a sequence over the bound re-prefills instead.
Sequences admitted together with the same context (a group's G fresh samples, or samples that
wrote the same call and got the same tool output) are prefilled once and share that cache. The
batch cache is a `GrowingCache` (pipeline/rollout/kv_cache.py): a decoding step writes one column
in place instead of copying the whole cache. Every prompt also opens with the same system turn (the
rules and tool examples: 274 of ~313 tokens of a TAPO prompt offering both tools, SmolLM2), which is
prefilled once per rollout; each fresh row starts from its cache (`Sequence.shared_prefix_len`).
Beyond that, unlike vLLM's prefix cache, nothing is shared between sequences: a general
cross-sequence cache would need a block allocator, which vLLM already is.

A model with sliding-window layers gets its attention masks from the decoder (`windows.py`): in the batch's
layout the model's own would measure its windows in cache columns, not in the row's positions.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import CacheLayerMixin, DynamicCache

from pipeline.config.rollout import RolloutConfig
from pipeline.protocols.tokens import decode
from pipeline.rollout.backends.decoding import DecoderStats, SamplingParams, Scheduler, eos_ids
from pipeline.rollout.backends.next_token import sample_tokens
from pipeline.rollout.backends.windows import Windows, attention_windows
from pipeline.rollout.kv_cache import GrowingCache
from pipeline.rollout.sequence import Sequence, unique_rows

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, H, T, D]
STOP_TAIL_TOKENS = 16  # tokens decoded to look for a stop string that spans token boundaries
MIN_SHARED_PREFIX_TOKENS = 16  # a shorter system turn is prefilled with each row: not worth a cache


@dataclass
class _Batch:
    rows: list[Sequence] = field(default_factory=list)
    stops: list[tuple[str, ...]] = field(default_factory=list)
    cache: DynamicCache | None = None
    attn_BT: torch.Tensor | None = None  # [B, T] 1 = real token in the cache
    next_ids_B: torch.Tensor | None = None  # [B] sampled, not yet fed
    positions_B: torch.Tensor | None = None  # [B] position id of the next fed token

    def live(self) -> tuple[DynamicCache, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The cache, attn_BT, next_ids_B and positions_B of a batch with rows (all None while it has none)."""
        assert self.cache is not None and self.attn_BT is not None
        assert self.next_ids_B is not None and self.positions_B is not None
        return self.cache, self.attn_BT, self.next_ids_B, self.positions_B


class HFDecoder:
    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, params: SamplingParams,
                 *, max_batch: int, max_parked_kv_tokens: int = 0) -> None:
        self.model = model
        # sliding-window layers: the decoder's own masks and full caches (`windows.py`); None: the model's own
        self.windows: Windows | None = attention_windows(model)
        self.dtype = next(model.parameters()).dtype
        self.tokenizer = tokenizer
        self.params = params
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        self.eos_ids = eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_parked_kv_tokens = max_parked_kv_tokens
        self._parked: dict[int, tuple[Sequence, KV]] = {}  # id(seq) -> its cache of context_ids[:-1]
        self._parked_tokens = 0
        self._prefixes: dict[tuple[int, ...], KV] = {}  # a system turn's tokens -> its cache ([H, T, D] per layer)
        self._pieces: dict[int, str] = {}  # token id -> its text alone (see _may_end_a_stop)

    @torch.no_grad()
    def run(self, scheduler: Scheduler) -> DecoderStats:
        """Generate until every sequence has finished; segment ends go to the scheduler."""
        stats, batch = DecoderStats(), _Batch()
        was_training = self.model.training
        self.model.eval()
        try:
            while scheduler.unfinished() > 0:
                # called once per step even with a full batch: the scheduler counts steps (its clock), and
                # may block there for a tool answer due at this step (idle time, like wait_ready's)
                t0 = time.perf_counter()
                new = scheduler.take_ready(max(self.max_batch - len(batch.rows), 0))
                if not new and not batch.rows:
                    scheduler.wait_ready(0.05)
                    stats.idle_s += time.perf_counter() - t0
                    continue
                stats.idle_s += time.perf_counter() - t0
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
        """Prefill the new rows (only what their parked caches lack) and merge them into the batch."""
        self._drop_finished_parked()
        seqs = [seq for seq, _ in new]
        pasts = [self._take_parked(seq) for seq in seqs]
        pasts = [self._shared_prefix(seq, stats) if past is None else past for seq, past in zip(seqs, pasts)]
        past_len = max((_kv_len(p) for p in pasts if p is not None), default=0)
        suffixes = [seq.context_ids[_kv_len(p) if p is not None else 0:] for seq, p in zip(seqs, pasts)]
        width = max(len(s) for s in suffixes)
        ids = torch.full((len(new), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(new), past_len + width), dtype=torch.long)
        positions = torch.zeros((len(new), width), dtype=torch.long)
        for i, (suffix, past) in enumerate(zip(suffixes, pasts)):  # right-aligned: each row ends at the last column
            cached = _kv_len(past) if past is not None else 0
            ids[i, width - len(suffix):] = torch.tensor(suffix)
            attn[i, past_len - cached:past_len] = 1
            attn[i, past_len + width - len(suffix):] = 1
            positions[i, width - len(suffix):] = torch.arange(cached, cached + len(suffix))
        unique, expand = unique_rows([prefill_key(seq, past) for seq, past in zip(seqs, pasts)])
        pasts_u = [pasts[i] for i in unique]
        cache = _stack_pasts(pasts_u, past_len) if past_len else self._new_cache()
        out = self.model(input_ids=ids[unique].to(self.device), attention_mask=self._mask(attn[unique], width),
                         position_ids=positions[unique].to(self.device), cache=cache, use_cache=True, logits_to_keep=1)
        expand_B = torch.tensor(expand, device=self.device)
        prefilled = sum(len(suffixes[i]) for i in unique)
        stats.prefill_tokens += prefilled
        stats.reused_tokens += sum(_kv_len(p) for p in pasts if p is not None) + sum(map(len, suffixes)) - prefilled
        next_ids = self._sample(out.logits[:, -1, :].index_select(0, expand_B), seqs)
        new_kv = [(k.index_select(0, expand_B), v.index_select(0, expand_B)) for k, v in _kv(out.cache)]
        new_attn = attn.to(self.device)
        new_positions = torch.tensor([len(seq.context_ids) - 1 for seq in seqs], device=self.device)
        if batch.rows:
            held, attn_BT, next_ids_B, positions_B = batch.live()
            batch.cache, batch.attn_BT = _merge(_kv(held), attn_BT, new_kv, new_attn, self.params.max_total_tokens)
            batch.next_ids_B = torch.cat([next_ids_B, next_ids])
            batch.positions_B = torch.cat([positions_B, new_positions])
        else:
            batch.cache, batch.attn_BT = GrowingCache(new_kv, self.params.max_total_tokens), new_attn
            batch.next_ids_B, batch.positions_B = next_ids, new_positions
        batch.rows += seqs
        batch.stops += [stops for _, stops in new]
        self._retire_stopped(batch, list(range(len(batch.rows) - len(new), len(batch.rows))), scheduler)

    def _shared_prefix(self, seq: Sequence, stats: DecoderStats) -> KV | None:
        """The cache of the row's system turn (prefilled on first use), for a row without its own cache."""
        n = seq.shared_prefix_len
        if n < MIN_SHARED_PREFIX_TOKENS or len(seq.context_ids) <= n:
            return None
        key = tuple(seq.prompt_ids[:n])
        if key not in self._prefixes:
            out = self.model(input_ids=torch.tensor([key], device=self.device),
                             attention_mask=self._mask(torch.ones((1, n), dtype=torch.long), n),
                             position_ids=torch.arange(n, device=self.device)[None], cache=self._new_cache(),
                             use_cache=True, logits_to_keep=1)
            self._prefixes[key] = [(k[0], v[0]) for k, v in _kv(out.cache)]
            stats.prefill_tokens += n
        return self._prefixes[key]

    # --- parked caches ------------------------------------------------------------------
    def _park(self, batch: _Batch, i: int, fed: int) -> None:
        """Copy row i's real cache columns (its first `fed` context tokens) out of the batch,
        if the bound allows. The last sampled token is not among them: it was never fed."""
        seq = batch.rows[i]
        if seq.finish_reason is not None or self._parked_tokens + fed > self.max_parked_kv_tokens:
            return
        cache, attn_BT, _, _ = batch.live()
        real = attn_BT[i].bool()
        kv = [(k[i][:, real], v[i][:, real]) for k, v in _kv(cache)]
        assert _kv_len(kv) == fed, "the parked cache must cover exactly the fed context"
        self._parked[id(seq)] = (seq, kv)
        self._parked_tokens += fed

    def _take_parked(self, seq: Sequence) -> KV | None:
        entry = self._parked.pop(id(seq), None)
        if entry is None:
            return None
        self._parked_tokens -= _kv_len(entry[1])
        return entry[1]

    def _drop_finished_parked(self) -> None:
        """A sequence can finish while parked (its tool output hit the token budget)."""
        for key, (seq, kv) in list(self._parked.items()):
            if seq.finish_reason is not None:
                del self._parked[key]
                self._parked_tokens -= _kv_len(kv)

    def _step(self, batch: _Batch, stats: DecoderStats, scheduler: Scheduler) -> None:
        cache, attn_BT, next_ids_B, positions_B = batch.live()
        ones = torch.ones((len(batch.rows), 1), dtype=attn_BT.dtype, device=self.device)
        batch.attn_BT = attn_BT = torch.cat([attn_BT, ones], dim=1)
        out = self.model(input_ids=next_ids_B[:, None], attention_mask=self._mask(attn_BT, 1),
                         position_ids=positions_B[:, None], cache=cache, use_cache=True)
        batch.cache = out.cache
        batch.positions_B = positions_B + 1
        batch.next_ids_B = self._sample(out.logits[:, -1, :], batch.rows)
        stats.steps += 1
        stats.sampled_tokens += len(batch.rows)
        self._retire_stopped(batch, list(range(len(batch.rows))), scheduler)

    def _mask(self, attn_BK: torch.Tensor, queries: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """What the model is given as its attention mask for the last `queries` columns: the 2D mask, from which it
        builds its own, or, with sliding windows, the masks of each layer type (`windows.py`)."""
        attn_BK = attn_BK.to(self.device)
        return attn_BK if self.windows is None else self.windows.masks(attn_BK, queries, self.dtype)

    def _new_cache(self) -> GrowingCache | None:
        """The cache of a forward without a past: the model's own (None), or with sliding windows one that keeps
        every column (the model's keeps only a sliding layer's last window, which merges and masks do not expect)."""
        return None if self.windows is None else GrowingCache.empty(self.windows.layers)

    def _sample(self, logits_BV: torch.Tensor, rows: list[Sequence]) -> torch.Tensor:
        return sample_tokens(logits_BV, rows, self.params).to(self.device)

    def _retire_stopped(self, batch: _Batch, candidates: list[int], scheduler: Scheduler) -> None:
        ended = {i: reason for i in candidates if (reason := self._segment_end(batch.rows[i], batch.stops[i]))}
        if not ended:
            return
        keep = [i for i in range(len(batch.rows)) if i not in ended]
        for i, reason in ended.items():
            fed = len(batch.rows[i].context_ids) - 1  # before the scheduler appends any tool output
            scheduler.segment_ended(batch.rows[i], reason)
            if self.max_parked_kv_tokens:
                self._park(batch, i, fed)
        _select_rows(batch, keep, self.params.max_total_tokens)

    def _segment_end(self, seq: Sequence, stops: tuple[str, ...]) -> str | None:
        last = seq.response_ids[-1]
        if last in self.eos_ids:
            return "eos"
        if stops and self._may_end_a_stop(last, stops):
            tail_ids = seq.response_ids[max(seq.segment_start, len(seq.response_ids) - STOP_TAIL_TOKENS):]
            if any(s in self.tokenizer.decode(tail_ids) for s in stops):
                return "stop"
        if seq.policy_tokens >= self.params.max_policy_tokens or len(seq.context_ids) >= self.params.max_total_tokens:
            return "budget"
        return None

    def _may_end_a_stop(self, token_id: int, stops: tuple[str, ...]) -> bool:
        """Whether `token_id`'s text holds the last character of a stop string. A stop string first appears
        in the decoded tail when its last character arrives; an ASCII character is one byte in any byte-level
        vocabulary, so no other token can bring it, and the tail is decoded only after a token that can (this
        decode took 6% of the decoder's time). A stop ending in another character is always checked."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = decode(self.tokenizer, [token_id])
        return any(stop[-1] in piece or not stop[-1].isascii() for stop in stops)


def prefill_key(seq: Sequence, past: KV | None) -> Hashable:
    """Rows admitted together with equal keys are prefilled once and share the cache. Same context and
    cache length: a group's G fresh copies of one prompt, and copies that sampled the same tokens and got
    the same tool output (after a cold start, most rows of a fact group search the same query and get
    ~260 identical tokens)."""
    return tuple(seq.context_ids), _kv_len(past) if past is not None else 0


def _kv(cache: DynamicCache) -> KV:
    return [_layer_kv(layer) for layer in cache.layers]


def _layer_kv(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """An attention layer's keys and values, once a forward filled them."""
    if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
        raise TypeError(f"the decoder reads attention caches; a {type(layer).__name__} holds no keys and values")
    return layer.keys, layer.values


def _kv_len(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return kv[0][0].shape[-2]


def _stack_pasts(pasts: list[KV | None], width: int) -> GrowingCache:
    """Per-row caches ([H, T_i, D] per layer; None = no cache) left-padded into one cache of `width` columns."""
    template = next(p for p in pasts if p is not None)
    no_cache = [(k.new_empty((1, k.shape[0], 0, k.shape[-1])), v.new_empty((1, v.shape[0], 0, v.shape[-1])))
                for k, v in template]
    return GrowingCache.stacked([no_cache if p is None else [(k[None], v[None]) for k, v in p] for p in pasts], width)


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _merge(kv_a: KV, attn_a: torch.Tensor, kv_b: KV, attn_b: torch.Tensor, max_tokens: int
           ) -> tuple[GrowingCache, torch.Tensor]:
    """Stack two left-padded batches; padded cache slots are masked out by attn."""
    width = max(attn_a.shape[1], attn_b.shape[1])
    cache = GrowingCache.stacked([kv_a, kv_b], width, max_tokens)
    return cache, torch.cat([_left_pad(attn_a, width, 1), _left_pad(attn_b, width, 1)])


def _select_rows(batch: _Batch, keep: list[int], max_tokens: int) -> None:
    """Keep the given rows and drop cache columns that are padding in every remaining row."""
    batch.rows = [batch.rows[i] for i in keep]
    batch.stops = [batch.stops[i] for i in keep]
    if not keep:
        batch.cache = batch.attn_BT = batch.next_ids_B = batch.positions_B = None
        return
    cache, attn_BT, next_ids_B, positions_B = batch.live()
    index = torch.tensor(keep, device=attn_BT.device)
    attn = attn_BT.index_select(0, index)
    first_real = int(attn.any(0).int().argmax())
    kv = _kv(cache)
    blocks = [[(k[start:end, :, first_real:], v[start:end, :, first_real:]) for k, v in kv]
              for start, end in _runs(keep)]  # views: the kept rows are copied once, into the new cache
    batch.cache = GrowingCache.stacked(blocks, attn.shape[1] - first_real, max_tokens)
    batch.attn_BT = attn[:, first_real:]
    batch.next_ids_B = next_ids_B.index_select(0, index)
    batch.positions_B = positions_B.index_select(0, index)


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Ascending indices as [start, end) runs of consecutive values: [0, 1, 2, 5, 6] -> [(0, 3), (5, 7)]."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


class HFBackend:
    """The `hf` backend: a fresh continuous-batching decoder per rollout over the shared model."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, cfg: RolloutConfig) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        attention_windows(model)  # a model the decoder cannot decode exactly is refused here, at set-up

    def decoder(self, params: SamplingParams, seed: int) -> HFDecoder:
        # `seed` is unused here: each sequence carries its own generator (seeded by the engine).
        return HFDecoder(self.model, self.tokenizer, params, max_batch=self.cfg.max_batch_sequences,
                         max_parked_kv_tokens=self.cfg.max_parked_kv_tokens)

    def update_weights(self, named_tensors) -> None:
        """Nothing to push: the decoder samples from the trained module itself."""

    def close(self) -> None:  # the model belongs to the caller
        pass
