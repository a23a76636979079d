"""Scored groups -> right-padded `TrainBatch` tensors with per-token advantages.

Each trajectory's per-token advantages land on its *sampled* response tokens; prompt,
tool-output and padding tokens get loss mask 0, so they are excluded from both the numerator and the
denominator of the loss (TAPO's code zeroes their advantage but still counts them).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import torch

from pipeline.types import ScoredGroup, TrainBatch


def make_train_batch(groups: list[ScoredGroup], advantages: list[np.ndarray], pad_id: int) -> TrainBatch:
    """`advantages`: one [R] array per trajectory, groups flattened in order (see advantage.token_advantages)."""
    trajs = [t for g in groups for t in g.group.trajectories]
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in trajs)
    B = len(trajs)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    attention = torch.zeros((B, width), dtype=torch.long)
    loss_mask = torch.zeros((B, width), dtype=torch.float32)
    old_lp = torch.zeros((B, width), dtype=torch.float32)
    adv = torch.zeros((B, width), dtype=torch.float32)
    for i, (t, a_R) in enumerate(zip(trajs, advantages, strict=True)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, : p + r] = torch.tensor(t.prompt_ids + t.response_ids)
        attention[i, : p + r] = 1
        loss_mask[i, p : p + r] = torch.tensor(t.loss_mask, dtype=torch.float32)
        old_lp[i, p : p + r] = torch.tensor(t.logprobs, dtype=torch.float32)
        adv[i, p : p + r] = torch.as_tensor(a_R, dtype=torch.float32) * loss_mask[i, p : p + r]
    return TrainBatch(input_ids, attention, loss_mask, old_lp, adv, n_policy_tokens=int(loss_mask.sum()))


def mini_batch_groups(groups: list[ScoredGroup], n: int) -> list[list[ScoredGroup]]:
    """Whole groups, in order, as min(n, len(groups)) mini-batches whose sizes differ by at most one.

    A group is never split: its rows share their prompt's pass and their advantages are relative to each other."""
    k = min(n, len(groups))
    if k < 1:
        raise ValueError(f"mini_batch_groups needs n >= 1 and at least one group (got n={n}, {len(groups)} groups)")
    size, extra = divmod(len(groups), k)
    bounds = [i * size + min(i, extra) for i in range(k + 1)]
    return [groups[a:b] for a, b in zip(bounds, bounds[1:])]


def unique_rows(keys: list[Hashable]) -> tuple[list[int], list[int]]:
    """Rows with equal keys need one computation: the first row of each distinct key (in order
    of first appearance), and for every row the position of its key among them, to index_select
    the shared results back to all rows."""
    first: dict[Hashable, int] = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    slot = {key: j for j, key in enumerate(first)}
    return list(first.values()), [slot[key] for key in keys]
