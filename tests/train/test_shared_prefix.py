"""Sharing a prefix deeper than the prompt: the cut, and the same log-probs and gradients as full passes."""

from __future__ import annotations

import torch

from pipeline.config.train import DAPOLoss
from pipeline.loss import make_policy_loss
from pipeline.shared_prefix import common_prefix_lengths, plan_shared_prefix, prefix_classes
from pipeline.types import TrainBatch
from pipeline.update import token_logprobs_and_entropy
from tests.helpers.tiny import tiny_llama

PROMPT, OPENING, TOOL = 20, 6, 12  # a group's prompt; the rows' common opening; tool output after it


def test_common_prefix_lengths_and_classes_by_hand() -> None:
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9, 9], [1, 2, 3, 4]])
    lcp = common_prefix_lengths(ids)
    assert lcp.tolist() == [[4, 3, 2, 4], [3, 4, 2, 3], [2, 2, 4, 2], [4, 3, 2, 4]]
    assert prefix_classes(lcp, 2) == ([0], [0, 0, 0, 0])
    assert prefix_classes(lcp, 3) == ([0, 2], [0, 0, 1, 0])
    assert prefix_classes(lcp, 4) == ([0, 1, 2], [0, 1, 2, 0])


def test_the_cut_minimises_the_tokens_run() -> None:
    """8 rows of width 40 sharing 10 tokens; 6 of them share 30. Cut at 10: 1*10 + 8*30 = 250 positions;
    at 30: 3 prefixes (the six, and the two others) * 30 + 8*10 = 170; at 39 (all distinct): 8*39 + 8 = 320."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (8, 40), generator=g)
    ids[:, :10] = ids[0, :10]
    ids[:6, :30] = ids[0, :30]
    plan = plan_shared_prefix(ids, first_trained=11)
    assert plan.length == 30 and plan.unique_U == [0, 6, 7] and plan.expand_B == [0, 0, 0, 0, 0, 0, 1, 2]
    assert plan.tokens_run(40) == 170
    assert plan_shared_prefix(ids[6:], first_trained=11).length == 10  # two rows: the prompt cut is cheapest


def test_identical_rows_keep_one_continuation_position() -> None:
    ids = torch.arange(12).repeat(4, 1)
    plan = plan_shared_prefix(ids, first_trained=5)
    assert plan.length == 11 and plan.unique_U == [0] and plan.expand_B == [0, 0, 0, 0]


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


def _logprobs_entropy_grad(batch: TrainBatch, share: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    model = tiny_llama(64, seed=4, dtype=torch.float64)
    logprobs, entropy = token_logprobs_and_entropy(model, batch, 1.0, share_prompts=share)
    make_policy_loss(DAPOLoss(kl_coef=0.0)).fn(logprobs, batch).loss_sum.backward()
    return logprobs.detach(), entropy, torch.cat([p.grad.flatten() for p in model.parameters()])


def test_a_prefix_shared_past_the_prompt_gives_the_same_logprobs_and_gradient() -> None:
    """Trained tokens inside the shared part are computed once and weighed by each row's own advantage."""
    for identical in (False, True):
        batch = _agreeing_group(64, identical)
        plan = plan_shared_prefix(batch.input_ids_BT, PROMPT + 1)
        assert plan.length > PROMPT + OPENING  # the cut lies past trained tokens of the response
        (lp0, h0, g0), (lp1, h1, g1) = (_logprobs_entropy_grad(batch, share) for share in (False, True))
        scored = batch.loss_mask_BT.bool()
        assert torch.allclose(lp0[scored], lp1[scored], atol=1e-10)
        assert torch.allclose(h0[scored], h1[scored], atol=1e-10)
        assert torch.all(lp1[~scored] == 0)
        # the same 1e-6 bound as the shared-prompt test (the tiny model's rotary tables stay float32)
        assert torch.allclose(g0, g1, atol=1e-6, rtol=0) and g0.abs().sum() > 0
