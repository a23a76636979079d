"""Where a micro-batch's training forward splits into a shared prefix pass and per-row continuations.

The G rows of a group share their prompt, and after a cold start they often share much more: a
fact row opens with the same thought, the same query (the question) and therefore the same
~260 tokens of search output before the rows diverge at the answer. Running each distinct
prefix once and the rows only from the cut on gives the same log-probs and gradients as one
full pass per row (the prefix's KV cache stays in the autograd graph, and the log-prob of a
trained token inside a shared prefix is the same for every row that shares it; each row still
weighs it with its own advantage).

The cut L is chosen per micro-batch to minimise the tokens the model runs over,
U(L) * L + B * (T - L), where U(L) is the number of distinct length-L prefixes among the B rows
of width T: at the prompt boundary (what TRL and verl never share at all) or deeper, where
most rows still agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PrefixPlan:
    length: int  # L: tokens [0, L) of each row run once per distinct prefix
    unique_U: list[int]  # one representative row per distinct prefix, in order of first appearance
    expand_B: list[int]  # for every row, the index of its prefix among the representatives

    def tokens_run(self, width: int) -> int:
        """Token positions the model runs over: the distinct prefixes, then every row's continuation."""
        return len(self.unique_U) * self.length + len(self.expand_B) * (width - self.length)


def common_prefix_lengths(ids_BT: torch.Tensor) -> np.ndarray:
    """[B, B] length of the longest common prefix of each pair of rows (padding compared as tokens)."""
    ids = ids_BT.detach().cpu().numpy()
    B, T = ids.shape
    lcp = np.full((B, B), T, dtype=np.int64)
    for i in range(B - 1):
        differ = ids[i + 1:] != ids[i]
        lengths = np.where(differ.any(1), differ.argmax(1), T)
        lcp[i, i + 1:] = lengths
        lcp[i + 1:, i] = lengths
    return lcp


def prefix_classes(lcp_BB: np.ndarray, length: int) -> tuple[list[int], list[int]]:
    """Rows whose first `length` tokens agree, as (representatives, each row's representative index).
    Agreeing on a prefix is an equivalence, so comparing with one member of a class is enough."""
    unique: list[int] = []
    expand: list[int] = []
    for row in range(lcp_BB.shape[0]):
        slot = next((j for j, rep in enumerate(unique) if lcp_BB[rep, row] >= length), None)
        if slot is None:
            slot = len(unique)
            unique.append(row)
        expand.append(slot)
    return unique, expand


def plan_shared_prefix(ids_BT: torch.Tensor, first_trained: int) -> PrefixPlan:
    """The cut that runs the fewest token positions, at least at `first_trained - 1` (the end of the
    shortest prompt: every row's tokens before it are prompt) and at most T - 1 (every row keeps at
    least one position in the continuation, so the cache and the rows line up)."""
    B, T = ids_BT.shape
    floor = max(first_trained - 1, 0)
    lcp = common_prefix_lengths(ids_BT)
    deeper = {int(n) for n in lcp[np.triu_indices(B, 1)] if n > floor}
    best: PrefixPlan | None = None
    for length in sorted({floor} | {min(n, T - 1) for n in deeper}):
        plan = PrefixPlan(length, *prefix_classes(lcp, length))
        if best is None or plan.tokens_run(T) < best.tokens_run(T):
            best = plan
    assert best is not None
    return best
