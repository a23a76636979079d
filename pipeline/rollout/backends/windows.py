"""Sliding-window attention in the hf decoder's batch (Mistral; Qwen2 with `use_sliding_window`; Gemma 2 and 3,
whose local and global layers alternate): the masks each layer type must get there, made by the decoder itself.

The decoder's batch is not the model's own layout: rows are left-padded to a common width, and a row admitted with
a parked cache, merged into the batch or thinned out of it has padding *between* its tokens. A causal mask does not
mind (padding is masked out, the order holds), a window does: transformers measures it in cache columns, so in the
batch it cut the wrong tokens (Mistral's sampled log-probs up to 0.11 off the model's own forward at window 4), and
the cache it builds from the config keeps only the last window of each sliding layer, which the decoder's merges do
not expect (Qwen2, Gemma 2 and 3 crashed, Mistral with parked caches). So for such a model the decoder keeps every
column in its own cache (`GrowingCache`) and gives the model its masks: per layer type, a row's query attends to
the row's real tokens at positions k with k <= q and, on a sliding layer, k > q - window (transformers' own
`sliding_window_overlay`), the positions counted in the row's own tokens. A model without a window keeps the 2D
mask and the model's own masks, unchanged bit for bit.

Which layers slide, and how far, is transformers' own per-layer rule (`get_layer_types_and_kwargs`, what its cache
reads). A model this cannot express (a layer type other than full and sliding, an attention kernel that takes no
dense mask, two windows for one layer type) is refused when the backend is set up, naming `rollout.backend`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import get_layer_types_and_kwargs
from transformers.masking_utils import sliding_window_overlay

DENSE_MASK_KERNELS = ("sdpa", "eager")  # attention kernels that apply a given [B, 1, Q, K] float mask as it is
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class Windows:
    """Each layer type's window (None: every earlier token) and how the model reads its masks."""

    windows: tuple[tuple[str, int | None], ...]  # (layer type, its window)
    by_layer_type: bool  # the model reads a dict keyed by `config.layer_types`; else one mask for every layer
    layers: int

    def masks(self, attn_BK: torch.Tensor, queries: int, dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
        """[B, 1, Q, K] additive masks for the last `queries` columns of a batch whose cache columns `attn_BK` marks
        (1 = a real token of the row). A padded query attends to its own column only (finite, never read)."""
        real_BK = attn_BK.bool()
        pos_BK = attn_BK.long().cumsum(1) - 1  # a real column's position in its own row
        k_B1K, q_BQ1 = pos_BK[:, None, :], pos_BK[:, -queries:, None]
        causal_BQK = real_BK[:, None, :] & (k_B1K <= q_BQ1)
        width = attn_BK.shape[1]
        own_QK = torch.zeros((queries, width), dtype=torch.bool, device=attn_BK.device)
        own_QK[torch.arange(queries), torch.arange(width - queries, width)] = True
        masks = {}
        for kind, window in self.windows:
            allowed_BQK = causal_BQK | own_QK
            if window is not None:  # transformers' own rule: kv > q - window
                allowed_BQK = (causal_BQK & sliding_window_overlay(window)(0, 0, q_BQ1, k_B1K)) | own_QK
            masks[kind] = torch.zeros(allowed_BQK.shape, dtype=dtype, device=attn_BK.device).masked_fill(
                ~allowed_BQK, torch.finfo(dtype).min)[:, None]
        return masks if self.by_layer_type else next(iter(masks.values()))


def attention_windows(model: torch.nn.Module) -> Windows | None:
    """The windows the decoder must mask itself; None where no layer slides (the model's own masks are exact in the
    batch). Raises ValueError, naming `rollout.backend`, for a model whose attention it cannot express."""
    config = getattr(model, "config", None)
    if config is None:  # not a transformers model (a test double): nothing slides
        return None
    text = config.get_text_config(decoder=True)
    layer_types, kwargs = get_layer_types_and_kwargs(text)
    if all(kind == FULL for kind in layer_types):
        return None
    found: dict[str, set[int | None]] = {}
    for kind, layer in zip(layer_types, kwargs, strict=True):
        found.setdefault(kind, set()).add(layer.get("sliding_window") if kind == SLIDING else None)
    kernel = getattr(text, "_attn_implementation", None) or "eager"
    why = [f"layer types {sorted(set(found) - {FULL, SLIDING})}" if set(found) - {FULL, SLIDING} else "",
           f"attention kernel {kernel!r} takes no dense mask" if kernel not in DENSE_MASK_KERNELS else "",
           f"sliding windows {sorted(found.get(SLIDING, ()), key=str)}"
           if len(found.get(SLIDING, ())) > 1 or None in found.get(SLIDING, {0}) else ""]
    if any(why):
        raise ValueError(f"rollout.backend 'hf' cannot decode this model exactly ({'; '.join(w for w in why if w)}; "
                         f"sliding_window = {getattr(text, 'sliding_window', None)!r}): use rollout.backend 'vllm', or "
                         "a model whose layers use full or sliding attention with sdpa or eager attention")
    windows = tuple((kind, next(iter(sizes))) for kind, sizes in sorted(found.items()))
    by_layer_type = getattr(text, "layer_types", None) is not None
    if not by_layer_type and len(windows) > 1:  # such a model reads one mask for every layer
        raise ValueError(f"rollout.backend 'hf' cannot decode this model exactly (layers {layer_types} without "
                         "config.layer_types read one mask): use rollout.backend 'vllm'")
    return Windows(windows, by_layer_type, layers=len(layer_types))
