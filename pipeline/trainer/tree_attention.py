"""The packed prefix tree's attention masks: one per kind of attention the model's layers run.

A micro-batch's prefix tree runs as one packed sequence under a dense mask (`pipeline.trainer.prefix_tree`),
and a model takes a 4D mask as given: it reaches the layers unchanged, the model adds nothing of its own. So
the mask must already say everything the model's own mask says for one row alone. For a causal mask the tree
mask is that; a sliding window (Mistral; Qwen2 with `use_sliding_window`, from layer `max_window_layers` on;
Gemma 2 and 3, whose local and global layers alternate) also cuts what lies `sliding_window` or more positions
back in the row, and on a model whose layers differ each layer type gets its own mask (transformers takes a
dict keyed by `config.layer_types`). Without this, packed rows attended past their window: log-probs off by
up to 0.23 against the model's own forward at window 8, on tiny Mistral, Qwen2 and Gemma models.

`tree_attention` reads from the model's config, once, what its layers run. A model whose attention it cannot
express (chunked, bidirectional or ALiBi attention, a layer type other than full and sliding, or an attention
kernel that takes no dense mask, such as flash attention) gets an `Unpackable` with the reason, and its rows
run padded, where the model builds its own masks (exact; tests/train/test_attention_variants.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.masking_utils import sliding_window_overlay

DENSE_MASK_KERNELS = ("sdpa", "eager")  # attention kernels that apply a given [B, 1, Q, K] float mask as it is
MASKED_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True)
class TreeAttention:
    """What each layer type of the model attends to, as the tree masks must say it."""

    windows: tuple[tuple[str, int | None], ...]  # (layer type, its sliding window; None: every earlier token)
    by_layer_type: bool  # the model reads one mask per layer type (config.layer_types); else one mask for all

    def masks(self, attend_PP: torch.Tensor, positions_P: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
        """[1, 1, P, P] additive masks (0 where packed token i may attend to j, the dtype's minimum elsewhere): the
        tree's `attend_PP` cut by each layer type's window, measured in the rows' own positions (a token attends
        only to tokens of its own rows, so their distance is the distance in each of those rows)."""
        masks = {kind: _additive(_windowed(attend_PP, positions_P, window), dtype) for kind, window in self.windows}
        return masks if self.by_layer_type else next(iter(masks.values()))


@dataclass(frozen=True)
class Unpackable:
    why: str  # which part of the model's attention a dense tree mask cannot express


def tree_attention(config) -> TreeAttention | Unpackable:
    """The masks the packed tree must give `config`'s model, or why it cannot run packed."""
    kernel = getattr(config, "_attn_implementation", None) or "eager"
    if kernel not in DENSE_MASK_KERNELS:
        return Unpackable(f"attention kernel {kernel!r} takes no dense tree mask")
    if not getattr(config, "is_causal", True) or getattr(config, "use_bidirectional_attention", False):
        return Unpackable("bidirectional attention")
    for key in ("attention_chunk_size", "alibi"):  # Llama 4's chunked attention; ALiBi biases built from a 2D mask
        if getattr(config, key, None):
            return Unpackable(f"{key} = {getattr(config, key)!r}")
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:  # one kind for every layer: sliding where the config has a window (Mistral's rule)
        return TreeAttention((("all", window),), by_layer_type=False)
    unknown = sorted(set(layer_types) - set(MASKED_LAYER_TYPES))
    if unknown:
        return Unpackable(f"layer types {unknown}")
    if "sliding_attention" in layer_types and not isinstance(window, int):
        return Unpackable(f"sliding layers with sliding_window = {window!r}")
    kinds = sorted(set(layer_types))
    return TreeAttention(tuple((kind, window if kind == "sliding_attention" else None) for kind in kinds),
                         by_layer_type=True)


def _windowed(attend_PP: torch.Tensor, positions_P: torch.Tensor, window: int | None) -> torch.Tensor:
    if window is None:
        return attend_PP
    # transformers' own overlay, so the window means what it means in the model's mask (kv > q - window)
    inside = sliding_window_overlay(window)(0, 0, positions_P[:, None], positions_P[None, :])
    return attend_PP & inside


def _additive(allowed_PP: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    blocked = torch.zeros(allowed_PP.shape, dtype=dtype).masked_fill(~allowed_PP, torch.finfo(dtype).min)
    return blocked[None, None]
