"""Scored groups -> right-padded `TrainBatch` tensors with per-token advantages.

Each trajectory's per-token advantages land on its *sampled* response tokens; prompt,
tool-output and padding tokens get loss mask 0, so they are excluded from both the numerator and the
denominator of the loss (TAPO's code zeroes their advantage but still counts them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from pipeline.types import ScoredGroup, TrainBatch

T = TypeVar("T")


def make_train_batch(groups: list[ScoredGroup], advantages: list[np.ndarray], pad_id: int,
                     mask_tool_output: bool = True) -> TrainBatch:
    """`advantages`: one [R] array per trajectory, groups flattened in order (see advantage.token_advantages).
    With `mask_tool_output` False every response token is trained on, tool output included (the masking
    ablation: the advantage then reaches the tokens a tool wrote, and they count in the normaliser); the batch
    then keeps the sampled tokens apart (`sampled_mask_BT`), for the step's diagnostics."""
    trajs = [t for g in groups for t in g.group.trajectories]
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    B = len(trajs)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    loss_mask = torch.zeros((B, width), dtype=torch.float32)
    sampled = torch.zeros((B, width), dtype=torch.float32)
    old_lp = torch.zeros((B, width), dtype=torch.float32)
    adv = torch.zeros((B, width), dtype=torch.float32)
    for i, (t, a_R) in enumerate(zip(trajs, advantages, strict=True)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, : p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        attention[i, : p + r] = 1
        sampled[i, p : p + r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        loss_mask[i, p : p + r] = sampled[i, p : p + r] if mask_tool_output else 1.0
        old_lp[i, p : p + r] = torch.tensor(t.logprobs, dtype=torch.float32)
        adv[i, p : p + r] = torch.as_tensor(a_R, dtype=torch.float32) * loss_mask[i, p : p + r]
    return TrainBatch(input_ids, attention, loss_mask, old_lp, adv, n_policy_tokens=int(loss_mask.sum()),
                      sampled_mask_BT=None if mask_tool_output else sampled)


def mini_batch_groups(kept: list[ScoredGroup], n: int,
                      anchored: Sequence[ScoredGroup] = ()) -> list[list[ScoredGroup]]:
    """Whole groups, in order, as min(n, len(kept)) mini-batches whose sizes differ by at most one, each
    followed by its share of the `anchored` openings (`pipeline.rl.anchor`), split the same way.

    A group is never split: its rows share their prompt's pass and their advantages are relative to each other.
    The openings are spread over the mini-batches rather than appended to the last: a mini-batch of openings
    alone would be an optimiser step on the KL term only, on no reward."""
    k = min(n, len(kept))
    if k < 1:
        raise ValueError(f"mini_batch_groups needs n >= 1 and at least one kept group (got n={n}, {len(kept)} groups)")
    shares = zip(even_parts(kept, k), even_parts(anchored, k), strict=True)
    return [list(part) + list(anchors) for part, anchors in shares]


def even_parts(items: Sequence[T], k: int) -> list[Sequence[T]]:
    """`items` in order as k consecutive parts whose sizes differ by at most one (empty parts when fewer than k)."""
    size, extra = divmod(len(items), k)
    bounds = [i * size + min(i, extra) for i in range(k + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:])]
