"""Greedy decoding through a given KV cache, one token per row per step, each step's token fed back: a cache that
stores or selects one column wrongly changes every later step's logits."""

from __future__ import annotations

import torch


def greedy_logits(model: torch.nn.Module, cache: object, rows: int, context: int, steps: int) -> torch.Tensor:
    """The last step's logits [rows, V] after `steps` greedy steps over a `context`-token cache of `rows` rows."""
    attention_BT = torch.ones(rows, context, dtype=torch.long)
    token_B1 = torch.zeros(rows, 1, dtype=torch.long)
    with torch.no_grad():
        for s in range(steps):
            attention_BT = torch.cat([attention_BT, torch.ones(rows, 1, dtype=torch.long)], dim=1)
            position_B1 = torch.full((rows, 1), context + s)
            out = model(input_ids=token_B1, attention_mask=attention_BT, position_ids=position_B1, cache=cache,
                        use_cache=True)
            cache = out.cache
            token_B1 = out.logits[:, -1].argmax(-1, keepdim=True)
    return out.logits[:, -1]
