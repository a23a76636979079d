"""The prefix tree of a micro-batch, and the same log-probs and gradients from it as from full passes."""

from __future__ import annotations

import torch

from pipeline.config.train import DAPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.trainer.prefix_tree import MAX_PACKED_POSITIONS, common_prefix_lengths, pack_tree, packing_pays, prefix_tree
from pipeline.types import TrainBatch
from pipeline.trainer.update import token_logprobs_and_entropy
from tests.helpers.tiny import tiny_llama

PROMPT, OPENING, TOOL = 20, 6, 12  # a group's prompt; the rows' common opening; tool output after it


def test_common_prefix_lengths_by_hand() -> None:
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 9], [1, 2, 3, 4]])
    assert common_prefix_lengths(ids, [4, 4, 4, 3]).tolist() == [[4, 3, 2, 3], [3, 4, 2, 3], [2, 2, 4, 2],
                                                                 [3, 3, 2, 3]]


def test_prefix_tree_by_hand() -> None:
    """Rows 0 and 3 agree to row 3's end (row 0 goes on alone), row 1 leaves them at token 3, row 2 at 2."""
    ids = torch.tensor([[1, 2, 3, 4, 7], [1, 2, 3, 5, 0], [1, 2, 9, 9, 0], [1, 2, 3, 4, 0]])
    tree = prefix_tree(ids, [5, 4, 4, 4])
    assert (tree.start, tree.end, tree.rows) == (0, 2, (0, 1, 2, 3))
    left, right = tree.children
    assert (left.start, left.end, left.rows, right.start, right.end, right.rows) == (2, 3, (0, 1, 3), 2, 4, (2,))
    deeper, alone = left.children
    assert (deeper.start, deeper.end, deeper.rows, alone.start, alone.end, alone.rows) == (3, 4, (0, 3), 3, 4, (1,))
    assert [(n.start, n.end, n.rows) for n in deeper.children] == [(4, 5, (0,))]
    # each distinct prefix once: 2 + 1 + 1 + 1 + 1 + 2 positions; padded, the batch would run 4 x 5
    assert tree.positions() == 8
    assert prefix_tree(ids[:, :1], [1, 1, 1, 1]).positions() == 1


def test_rows_that_differ_at_once_hang_from_an_empty_root() -> None:
    ids = torch.tensor([[1, 2, 3], [4, 2, 3]])
    tree = prefix_tree(ids, [3, 2])
    assert (tree.start, tree.end) == (0, 0)
    assert [(n.start, n.end, n.rows) for n in tree.children] == [(0, 3, (0,)), (0, 2, (1,))]


def test_packed_tree_mask_follows_the_tree() -> None:
    """Pre-order packing of the tree above: root [1 2], then [3] (rows 0, 1, 3), [4] (rows 0, 3), [7] (row 0),
    [5] (row 1), then [9 9] (row 2). A token sees its ancestors' tokens and its own node's earlier ones."""
    ids = torch.tensor([[1, 2, 3, 4, 7], [1, 2, 3, 5, 0], [1, 2, 9, 9, 0], [1, 2, 3, 4, 0]])
    packed = pack_tree(prefix_tree(ids, [5, 4, 4, 4]))
    assert packed.offsets == [0, 2, 3, 4, 5, 6]
    assert ids[packed.rows_P, packed.positions_P].tolist() == [1, 2, 3, 4, 7, 5, 9, 9]
    assert packed.positions_P.tolist() == [0, 1, 2, 3, 4, 3, 2, 3]
    sees = {i: [j for j in range(8) if packed.attend_PP[i, j]] for i in range(8)}
    assert sees == {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 2, 3, 4], 5: [0, 1, 2, 5],
                    6: [0, 1, 6], 7: [0, 1, 6, 7]}
    assert packed.index(3, 3) == 3 and packed.index(1, 3) == 5 and packed.index(2, 3) == 7


def test_packing_pays_where_rows_share_and_not_for_long_distinct_rows() -> None:
    # SmolLM2-135M's width; a group of 8 rows padded to 640 tokens
    assert packing_pays(1800, rows=8, width=640, hidden_size=576)  # measured: a calculator group's tree
    assert not packing_pays(8 * 500, rows=8, width=640, hidden_size=576)  # nothing shared: attention over 4000^2
    assert not packing_pays(MAX_PACKED_POSITIONS + 1, rows=64, width=4096, hidden_size=4096)  # the mask's size


def _agreeing_group(vocab: int, identical: bool = False) -> TrainBatch:
    """A group of 6 right-padded rows: one prompt; rows 0-3 also share an opening (trained) and the tool
    output after it (not trained), rows 4-5 diverge at the opening; rows 2 and 3 are identical to the end."""
    g = torch.Generator().manual_seed(7)
    B, T = 6, PROMPT + OPENING + TOOL + 8
    ids = torch.randint(0, vocab, (B, T), generator=g)
    ids[:, :PROMPT] = ids[0, :PROMPT]
    shared = PROMPT + OPENING + TOOL
    ids[:4, :shared] = ids[0, :shared]
    ids[3] = ids[2]
    if identical:
        ids[:] = ids[0]
    lengths = torch.tensor([T, T - 3, T - 1, T - 1, T - 5, T])
    if identical:
        lengths[:] = T
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask = attn.clone().double()
    mask[:, :PROMPT] = 0
    mask[:4, PROMPT + OPENING:shared] = 0  # the tool output of the agreeing rows
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * mask
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


def _logprobs_entropy_grad(batch: TrainBatch, share: bool, checkpointing: bool = False
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    model = tiny_llama(64, seed=4, dtype=torch.float64)
    mlp_calls = []
    if checkpointing:  # layers re-run in the backward, with the packed tree's mask and positions
        model.gradient_checkpointing_enable()
        model.train()
        model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: mlp_calls.append(1))
    logprobs, entropy = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share)
    make_policy_loss(DAPOLoss(kl_coef=0.0)).fn(logprobs, batch).loss_sum.backward()
    assert len(mlp_calls) == (2 if checkpointing else 0)  # the forward, then its re-run in the backward
    return logprobs.detach(), entropy, torch.cat([p.grad.flatten() for p in model.parameters()])


def _assert_same(batch: TrainBatch, full: tuple[torch.Tensor, ...], shared: tuple[torch.Tensor, ...]) -> None:
    """Log-probs, entropies (at trained tokens; log-probs 0 elsewhere) and gradient of full passes and shared."""
    (lp0, h0, g0), (lp1, h1, g1) = full, shared
    scored = batch.loss_mask_BT.bool()
    assert torch.allclose(lp0[scored], lp1[scored], atol=1e-10)
    assert torch.allclose(h0[scored], h1[scored], atol=1e-10)
    assert torch.all(lp1[~scored] == 0)
    # the same 1e-6 bound as the shared-prompt test (the tiny model's rotary tables stay float32)
    assert torch.allclose(g0, g1, atol=1e-6, rtol=0) and g0.abs().sum() > 0


def test_a_prefix_shared_past_the_prompt_gives_the_same_logprobs_and_gradient() -> None:
    """Trained tokens inside the shared part are computed once and weighed by each row's own advantage."""
    for identical in (False, True):
        batch = _agreeing_group(64, identical)
        tree = prefix_tree(batch.input_ids_BT, batch.attention_mask_BT.sum(1).tolist())
        shared = [n for n in tree.walk() if len(n.rows) > 1]
        assert max(n.end for n in shared) > PROMPT + OPENING  # rows share trained tokens of the response
        assert tree.positions() < int(batch.attention_mask_BT.sum())
        assert packing_pays(tree.positions(), *batch.input_ids_BT.shape, tiny_llama(64).config.hidden_size)
        _assert_same(batch, *(_logprobs_entropy_grad(batch, share) for share in (False, True)))


def test_the_packed_tree_under_gradient_checkpointing_gives_the_same_logprobs_and_gradient() -> None:
    """The packed tree is one plain forward call (a 4D mask and explicit positions, no cache between calls),
    so checkpointed layers re-run it as they ran: the same log-probs and gradient as full passes without."""
    batch = _agreeing_group(64)
    _assert_same(batch, *(_logprobs_entropy_grad(batch, share, checkpointing=share) for share in (False, True)))
