"""A KV cache that appends in place: transformers' `DynamicCache` with preallocated headroom.

`DynamicCache` grows by `torch.cat` on every decoding step, so each new token copies the whole
cache of every layer: O(T) memory traffic per token and O(T^2) per sequence. On CPU with
SmolLM2-135M, avoiding that copy makes a decoding step 1.06x faster at 16 rows x 400 tokens and
1.23x at 16 x 800 (`benchmarks/kv_cache.py`; benchmarks/RESULTS.md "KV cache"). Here each layer's keys and values live in a buffer
with room to spare; a step writes one column and hands attention a view of the filled part.
When the buffer is full it grows by half again (amortised O(1) per token, like a vector).

The filled view is bit-identical to what `DynamicCache` would hold, so logits are unchanged;
everything that reads `layer.keys` / `layer.values` (the decoder's merge, row selection and
parking) sees ordinary tensors. A layer whose tensors were replaced from outside (transformers'
own `crop` or `batch_select_indices`) starts a new buffer from them on its next update.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

MIN_HEADROOM_TOKENS = 64  # a fresh buffer has room for at least this many steps
GROWTH = 1.5  # capacity multiplier when a buffer fills up


class GrowingLayer(DynamicLayer):
    """One layer's keys and values [B, H, T, D] as views into buffers [B, H, capacity, D].

    `max_tokens` (0 = none) caps the headroom: the decoder never holds more columns than its
    total-token budget, so room beyond it would only waste memory."""

    def __init__(self, max_tokens: int = 0) -> None:
        super().__init__()
        self.max_tokens = max_tokens

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._handed_out: torch.Tensor | None = None  # the `keys` view last returned, to notice replacement
        self._filled = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._key_buffer is not None and self.keys is not self._handed_out:
            # replaced from outside (crop, row selection): start a buffer from them
            keys, values = self._held()
            self.hold_stacked([keys], [values], keys.shape[-2])
        new = key_states.shape[-2]
        key_buffer, value_buffer = self._key_buffer, self._value_buffer
        if key_buffer is None or value_buffer is None or self._filled + new > key_buffer.shape[-2]:
            key_buffer, value_buffer = self._reserve(key_states, value_states, self._filled + new)
        end = self._filled + new
        key_buffer[:, :, self._filled:end] = key_states
        value_buffer[:, :, self._filled:end] = value_states
        self._filled = end
        keys, values = key_buffer[:, :, :end], value_buffer[:, :, :end]
        self.keys, self.values = keys, values
        self._handed_out = keys
        return keys, values

    def _held(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values this layer holds (set once it is initialised)."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def hold_stacked(self, key_blocks: list[torch.Tensor], value_blocks: list[torch.Tensor], width: int) -> None:
        """Hold row blocks [B_i, H, T_i, D] stacked along rows, each right-aligned to `width` columns
        with zeros before it (padding must be finite: masked attention still multiplies it by 0).
        The blocks are written straight into the new buffers: one copy, where stacking and then
        adopting would copy twice (this runs at every admission and retirement)."""
        k0, v0 = key_blocks[0], value_blocks[0]
        rows = sum(k.shape[0] for k in key_blocks)
        self.lazy_initialization(k0, v0)
        key_buffer, value_buffer = self._reserve(k0.new_empty((rows, k0.shape[1], 0, k0.shape[-1])),
                                                 v0.new_empty((rows, v0.shape[1], 0, v0.shape[-1])), width)
        start = 0
        for keys, values in zip(key_blocks, value_blocks, strict=True):
            end, pad = start + keys.shape[0], width - keys.shape[-2]
            for buffer, block in ((key_buffer, keys), (value_buffer, values)):
                buffer[start:end, :, :pad].zero_()
                buffer[start:end, :, pad:width] = block
            start = end
        self._filled = width
        self.keys, self.values = key_buffer[:, :, :width], value_buffer[:, :, :width]
        self._handed_out = self.keys

    def capacity(self) -> int:
        return 0 if self._key_buffer is None else self._key_buffer.shape[-2]

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Move the filled part into buffers with room for `needed` tokens and some headroom; the new buffers."""
        capacity = max(needed + MIN_HEADROOM_TOKENS, int(needed * GROWTH))
        if self.max_tokens:
            capacity = max(needed, min(capacity, self.max_tokens))
        old_keys, old_values = self._key_buffer, self._value_buffer
        shape_k = (*key_states.shape[:2], capacity, key_states.shape[-1])
        shape_v = (*value_states.shape[:2], capacity, value_states.shape[-1])
        key_buffer, value_buffer = key_states.new_empty(shape_k), value_states.new_empty(shape_v)
        if self._filled and old_keys is not None and old_values is not None:  # a filled layer has buffers
            key_buffer[:, :, :self._filled] = old_keys[:, :, :self._filled]
            value_buffer[:, :, :self._filled] = old_values[:, :, :self._filled]
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        return key_buffer, value_buffer

    def reset(self) -> None:
        super().reset()
        self._key_buffer = self._value_buffer = self._handed_out = None
        self._filled = 0


class GrowingCache(DynamicCache):
    """`DynamicCache(ddp_cache_data=kv)` with `GrowingLayer`s: the same contents, appended in place."""

    def __init__(self, kv: Iterable[tuple[torch.Tensor, torch.Tensor]], max_tokens: int = 0) -> None:
        kv = list(kv)
        layers = [GrowingLayer(max_tokens) for _ in kv]
        Cache.__init__(self, layers=[*layers])
        for layer, (keys, values) in zip(layers, kv, strict=True):
            layer.update(keys, values)

    @classmethod
    def empty(cls, layers: int, max_tokens: int = 0) -> GrowingCache:
        """A cache of `layers` empty layers, each keeping every column it is given (a model's own cache, built
        from its config, keeps only the last window of a sliding layer)."""
        cache = cls([], max_tokens)
        cache.layers = [GrowingLayer(max_tokens) for _ in range(layers)]
        return cache

    @classmethod
    def stacked(cls, blocks: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]], width: int,
                max_tokens: int = 0) -> GrowingCache:
        """Row blocks (per layer: keys, values [B_i, H, T_i, D], T_i <= width) stacked along rows, each
        left-padded with zeros to `width` columns (see `GrowingLayer.hold_stacked`)."""
        cache = cls([], max_tokens)
        layers = [GrowingLayer(max_tokens) for _ in blocks[0]]
        cache.layers = [*layers]
        for i, layer in enumerate(layers):
            layer.hold_stacked([block[i][0] for block in blocks], [block[i][1] for block in blocks], width)
        return cache
