"""The rows of a micro-batch as a prefix tree, so the training forward runs every distinct prefix once.

The G rows of a group share their prompt, and after a cold start they often share much more: a
fact row opens with the same thought and the same query (the question), so the ~260 tokens of
search output after it are the same too, and the rows part only at the answer. Rows also differ in
length, and a padded batch runs every row to the longest one (calculator groups: ~40% of the
positions of a group's padded batch are padding, measured on learning_cpu's SFT model).

The tree's nodes are maximal runs of tokens that a fixed set of rows agree on, and a row's tokens
are the path from the root to its leaf. The nodes run once each, packed into one sequence under a
tree attention mask (`pack_tree`: a token attends to its ancestors' tokens, at its position in its
rows), so a micro-batch is one forward call. A trained token inside a shared node is computed once
and weighed by each row's own advantage, so the log-probs and gradients are those of one full pass
per row (tested). The positions run are the number of distinct prefixes of the rows, the least any
sharing can do; TRL and verl run B x T (padding included).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PrefixNode:
    start: int  # the node's tokens are positions [start, end) of each of its rows
    end: int
    rows: tuple[int, ...]  # rows that agree on tokens [0, end); rows[0] supplies the tokens
    children: tuple[PrefixNode, ...]  # where the rows that go on past `end` part

    def walk(self) -> Iterator[PrefixNode]:
        """This node, then its subtrees (pre-order: a parent before its children)."""
        yield self
        for child in self.children:
            yield from child.walk()

    def positions(self) -> int:
        """Token positions the model runs over for the whole tree."""
        return sum(node.end - node.start for node in self.walk())


def common_prefix_lengths(ids_BT: torch.Tensor, lengths_B: list[int]) -> np.ndarray:
    """[B, B] length of the longest common prefix of each pair of rows' real tokens (the diagonal: the
    row's length)."""
    ids = ids_BT.detach().cpu().numpy()
    B, T = ids.shape
    lcp = np.full((B, B), T, dtype=np.int64)
    for i in range(B - 1):
        differ = ids[i + 1:] != ids[i]
        lengths = np.where(differ.any(1), differ.argmax(1), T)
        lcp[i, i + 1:] = lengths
        lcp[i + 1:, i] = lengths
    real = np.asarray(lengths_B, dtype=np.int64)
    return np.minimum(lcp, np.minimum.outer(real, real))


def prefix_tree(ids_BT: torch.Tensor, lengths_B: list[int]) -> PrefixNode:
    """The rows' real tokens (right-padded to T; row b has lengths_B[b]) as a prefix tree. The root holds
    what all rows agree on (nothing if their first tokens differ)."""
    lcp = common_prefix_lengths(ids_BT, lengths_B)
    return _node(lcp, tuple(range(len(lengths_B))), start=0)


def _node(lcp: np.ndarray, rows: tuple[int, ...], start: int) -> PrefixNode:
    end = int(lcp[np.ix_(rows, rows)].min())
    going_on = [r for r in rows if lcp[r, r] > end]
    return PrefixNode(start, end, rows, tuple(_node(lcp, part, end) for part in _agreeing(lcp, going_on, end + 1)))


def _agreeing(lcp: np.ndarray, rows: list[int], length: int) -> list[tuple[int, ...]]:
    """`rows` split into the sets that agree on their first `length` tokens (an equivalence, so one
    member of a set stands for it), in order of first appearance."""
    parts: list[list[int]] = []
    for row in rows:
        home = next((part for part in parts if lcp[part[0], row] >= length), None)
        if home is None:
            parts.append([row])
        else:
            home.append(row)
    return [tuple(part) for part in parts]


@dataclass(frozen=True)
class PackedTree:
    """A prefix tree's nodes as one sequence (pre-order), run in one forward call under a tree mask: each
    token attends to the tokens of its node's ancestors and to its own node's earlier tokens, at its
    position in its rows. One call, not one per node: each call's backward computes a full-size gradient
    of every weight, and on a CPU nine calls per anchored group took 1.7x the time of two padded ones."""

    nodes: list[PrefixNode]  # pre-order
    offsets: list[int]  # where each node's tokens start in the packed sequence
    rows_P: torch.Tensor  # [P] the row a packed token is read from (its node's first row)
    positions_P: torch.Tensor  # [P] its position in its rows
    attend_PP: torch.Tensor  # [P, P] bool: packed token i may attend to packed token j

    def index(self, row: int, position: int) -> int:
        """The packed index of `row`'s token at `position`."""
        k = next(k for k, node in enumerate(self.nodes) if row in node.rows and node.start <= position < node.end)
        return self.offsets[k] + position - self.nodes[k].start


def pack_tree(tree: PrefixNode) -> PackedTree:
    nodes = list(tree.walk())
    parent = {id(child): k for k, node in enumerate(nodes) for child in node.children}
    # ancestor-or-self, node by node; a parent precedes its children in pre-order, so row k copies its parent's
    above_KK = torch.zeros((len(nodes), len(nodes)), dtype=torch.bool)
    for k, node in enumerate(nodes):
        if id(node) in parent:
            above_KK[k] = above_KK[parent[id(node)]]
        above_KK[k, k] = True
    sizes = [node.end - node.start for node in nodes]
    offsets = [0, *np.cumsum(sizes).tolist()][:-1]
    node_P = torch.repeat_interleave(torch.arange(len(nodes)), torch.tensor(sizes, dtype=torch.long))
    rows_P = torch.tensor([nodes[k].rows[0] for k in node_P.tolist()], dtype=torch.long)
    positions_P = torch.cat([torch.arange(node.start, node.end) for node in nodes])
    order_P = torch.arange(len(node_P))
    attend_PP = above_KK[node_P[:, None], node_P[None, :]] & (order_P[:, None] >= order_P[None, :])
    return PackedTree(nodes, [int(o) for o in offsets], rows_P, positions_P.long(), attend_PP)


MAX_PACKED_POSITIONS = 8192  # the [P, P] mask alone is 256 MB in float32 here; longer micro-batches run padded


def packing_pays(packed_positions: int, rows: int, width: int, hidden_size: int) -> bool:
    """Whether the packed tree costs less than the rows padded to `width`. Its mask is dense, so attention
    runs over P x P pairs where a padded batch runs B x T x T: with little sharing, long rows lose more to
    attention than the tree saves. Forward cost per position ~ 24 L d^2 (a transformer's linear layers),
    per attended pair ~ 4 L d, so a pair weighs 1 / (6 d) of a position."""
    if packed_positions > MAX_PACKED_POSITIONS:
        return False
    pair = 1.0 / (6 * hidden_size)
    return packed_positions + pair * packed_positions**2 < rows * width + pair * rows * width**2
