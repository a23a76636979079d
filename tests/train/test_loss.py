"""Loss values by hand, micro-batch invariance, masks, and that one step moves every parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pipeline.rl.advantage import group_advantages
from pipeline.config.train import DAPOLoss, DrGRPOLoss, GRPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.types import TrainBatch
from pipeline.trainer.update import (UpdateSettings, masked_logprobs_no_grad, micro_batches, policy_gradient_step,
                             token_logprobs_and_entropy)
from tests.helpers.tiny import tiny_llama


def batch_of(old_BT, adv_BT, mask_BT) -> TrainBatch:
    old, adv, mask = (torch.tensor(x, dtype=torch.float64) for x in (old_BT, adv_BT, mask_BT))
    ids = torch.zeros(old.shape, dtype=torch.long)
    return TrainBatch(ids, torch.ones_like(ids), mask, old, adv * mask, n_policy_tokens=int(mask.sum()))


def test_dapo_loss_by_hand() -> None:
    # token 1: ratio e^0.5 = 1.6487 > 1.28 with A=+1 -> clipped: -1.28
    # token 2: ratio e^-0.5 = 0.6065 < 0.8 with A=-1 -> max(0.6065, 0.8) = 0.8
    # token 3: masked (tool output) -> excluded from numerator and denominator
    batch = batch_of([[0.0, 0.0, 0.0]], [[1.0, -1.0, 5.0]], [[1.0, 1.0, 0.0]])
    new = torch.tensor([[0.5, -0.5, 3.0]], dtype=torch.float64)
    loss = make_policy_loss(DAPOLoss())
    out = loss.fn(new, batch)
    assert math.isclose(float(out.loss_sum), -1.28 + 0.8, rel_tol=1e-9)
    assert loss.denominator(batch) == 2.0
    assert float(out.clipped_high) == 1.0 and float(out.clipped_low) == 1.0


def test_dual_clip_bounds_negative_advantages() -> None:
    batch = batch_of([[0.0]], [[-1.0]], [[1.0]])
    out = make_policy_loss(DAPOLoss(dual_clip=3.0)).fn(torch.tensor([[math.log(20.0)]], dtype=torch.float64), batch)
    assert math.isclose(float(out.loss_sum), 3.0)  # -A * c, not -A * 20


def test_grpo_is_sequence_mean() -> None:
    batch = batch_of([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 0.0]])
    loss = make_policy_loss(GRPOLoss())
    out = loss.fn(torch.zeros(2, 2, dtype=torch.float64), batch)
    assert math.isclose(float(out.loss_sum), -2.0)  # each sequence's mean is -1
    assert loss.denominator(batch) == 2.0


def test_dr_grpo_is_a_token_sum_over_sequences_times_the_length_constant() -> None:
    """Liu et al. 2025 by hand: no 1/|o_i| mean, so a long sequence's tokens weigh as much as a short one's.

    Row 0: 3 policy tokens at ratio 1, A = +1 -> -3; row 1: 1 policy token (one masked), A = -1, ratio
    e^-0.1 = 0.905 inside [0.8, 1.2] -> +0.905. Sum -2.095 over 2 sequences x L = 16."""
    batch = batch_of([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]],
                     [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    new = torch.tensor([[0.0, 0.0, 0.0], [-0.1, 5.0, 5.0]], dtype=torch.float64)
    loss = make_policy_loss(DrGRPOLoss(), max_policy_tokens=16)
    out = loss.fn(new, batch)
    assert math.isclose(float(out.loss_sum), -3.0 + math.exp(-0.1), rel_tol=1e-12)
    assert loss.denominator(batch) == 2 * 16
    # GRPO on the same batch means each sequence first: -1 + 0.905
    assert math.isclose(float(make_policy_loss(GRPOLoss()).fn(new, batch).loss_sum), -1.0 + math.exp(-0.1))
    with pytest.raises(ValueError, match="rollout.max_policy_tokens"):
        make_policy_loss(DrGRPOLoss())


def test_dr_grpo_advantages_are_centred_not_std_divided() -> None:
    from pipeline.rl.advantage import advantages_of
    from pipeline.types import Group, Problem, RewardBreakdown, ScoredGroup
    group = ScoredGroup(Group(Problem("p", "q", ("1",), "math", "gsm8k", "train"), ()),
                        tuple(RewardBreakdown(True, r, 0.0, 0.0, total=r) for r in (1.0, 0.0, 0.0, 0.0)))
    np.testing.assert_allclose(advantages_of([group], DrGRPOLoss())[0], [0.75, -0.25, -0.25, -0.25])
    assert abs(advantages_of([group], DAPOLoss())[0][0]) > 1.0  # std-divided: 0.75 / 0.5


def test_approx_kl_is_k3_of_kl_old_to_new_with_r_new_over_old() -> None:
    """k3 = (r - 1) - log r with r = new / old (samples from old): by hand for two tokens."""
    batch = batch_of([[0.0, -1.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    new = torch.tensor([[0.3, -1.5]], dtype=torch.float64)  # log r = 0.3 and -0.5
    expected = sum(math.exp(x) - 1.0 - x for x in (0.3, -0.5))
    for algo in (DAPOLoss(), GRPOLoss(), DrGRPOLoss()):
        assert math.isclose(float(make_policy_loss(algo, 8).fn(new, batch).approx_kl_sum), expected, rel_tol=1e-12)
    # the old estimate used r = old / new: (e^-0.3 - 1 + 0.3) + (e^0.5 - 1 - 0.5) differs
    assert not math.isclose(expected, sum(math.exp(-x) - 1.0 + x for x in (0.3, -0.5)), rel_tol=1e-3)


def test_group_advantages_use_the_unbiased_std_as_verl_and_trl() -> None:
    r = np.array([1.0, 0.0, 0.0, 1.0])
    np.testing.assert_allclose(group_advantages(r, std_normalize=False), [0.5, -0.5, -0.5, 0.5])
    # by hand: sum of squares 4 x 0.25 = 1 over G - 1 = 3, std sqrt(1/3); 0.5 / sqrt(1/3) = 0.8660
    a = 0.5 / math.sqrt(1.0 / 3.0)
    np.testing.assert_allclose(group_advantages(r, std_normalize=True), [a, -a, -a, a], atol=1e-5)
    # the same as torch.std (unbiased by default, verl's and TRL's convention)
    rewards = torch.tensor([0.3, 1.0, -0.2, 0.0, 0.7], dtype=torch.float64)
    theirs = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    np.testing.assert_allclose(group_advantages(rewards.numpy(), std_normalize=True), theirs.numpy(), rtol=1e-12)


def _random_batch(vocab: int, seed: int = 0) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    B, T = 8, 12
    ids = torch.randint(0, vocab, (B, T), generator=g)
    lengths = torch.randint(6, T + 1, (B,), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask = attn.clone().double()
    mask[:, :3] = 0  # prompt
    mask[::2, 4:6] = 0  # tool output inside some responses
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * mask
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


@pytest.mark.parametrize("algo", [DAPOLoss(), GRPOLoss(), DrGRPOLoss()])
def test_micro_batching_does_not_change_the_gradient(algo) -> None:
    """1 x 8 and 8 x 1 micro-batches give the same gradient (float64, within 1e-6)."""
    grads = []
    for micro in (8, 1):
        model = tiny_llama(64, seed=1, dtype=torch.float64)
        batch = _random_batch(64)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: we only read the gradients
        policy_gradient_step(model, opt, batch, make_policy_loss(algo, 16), UpdateSettings(micro, 1e9, 1.0))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=0)
    assert grads[0].abs().sum() > 0


def test_micro_batches_are_cut_to_their_longest_row() -> None:
    """A micro-batch of short rows runs at its own width; results go back to the batch's width."""
    batch = _random_batch(64)
    lengths = batch.attention_mask_BT.sum(-1).tolist()
    for i, micro in enumerate(micro_batches(batch, 3)):
        assert micro.input_ids_BT.shape[1] == max(lengths[3 * i:3 * i + 3])
        assert torch.equal(micro.input_ids_BT, batch.input_ids_BT[3 * i:3 * i + 3, :micro.input_ids_BT.shape[1]])
    assert min(m.input_ids_BT.shape[1] for m in micro_batches(batch, 1)) < batch.input_ids_BT.shape[1]
    model = tiny_llama(64, seed=3, dtype=torch.float64)
    cut, whole = (masked_logprobs_no_grad(model, batch, size, 1.0) for size in (1, 8))
    assert cut.shape == whole.shape and torch.allclose(cut, whole, atol=1e-10, rtol=0)
    assert bool((whole != 0).any())


def test_masked_tokens_get_no_gradient_signal() -> None:
    """Changing the log-probs or advantages of masked tokens changes nothing."""
    model = tiny_llama(64, seed=2, dtype=torch.float64)
    batch = _random_batch(64)
    loss = make_policy_loss(DAPOLoss())
    logprobs, _ = token_logprobs_and_entropy(model, batch, 1.0)
    noisy = TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT,
                       batch.old_logprobs_BT + 7.0 * (1 - batch.loss_mask_BT),
                       batch.advantages_BT + 3.0 * (1 - batch.loss_mask_BT), batch.n_policy_tokens)
    assert torch.equal(loss.fn(logprobs, batch).loss_sum, loss.fn(logprobs, noisy).loss_sum)


def test_every_parameter_moves_after_one_step() -> None:
    model = tiny_llama(64, seed=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = _random_batch(64)
    batch = TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT.float(),
                       batch.old_logprobs_BT.float(), batch.advantages_BT.float(), batch.n_policy_tokens)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    policy_gradient_step(model, opt, batch, make_policy_loss(DAPOLoss()), UpdateSettings(4, 1.0, 1.0))
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p, before[n])]
    assert unchanged == []


def test_logprobs_match_a_plain_forward() -> None:
    model = tiny_llama(64, seed=5, dtype=torch.float64)
    batch = _random_batch(64)
    logprobs, entropy = token_logprobs_and_entropy(model, batch, 1.0)
    full = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_mask_BT).logits.log_softmax(-1)
    expected = full[:, :-1].gather(-1, batch.input_ids_BT[:, 1:, None])[..., 0]
    trained = batch.loss_mask_BT.bool()
    trained[:, 0] = False  # position 0 has no prediction
    # untrained positions inside responses too, so the test covers the head cut to trained tokens
    assert bool((~trained[:, 1:] & batch.attention_mask_BT[:, 1:].bool() & trained.any(0)[None, 1:]).any())
    assert torch.allclose(logprobs[:, 1:][trained[:, 1:]], expected[trained[:, 1:]], atol=1e-10)
    assert torch.all(logprobs[~trained] == 0) and torch.all(entropy[~trained] == 0)
    vocab_entropy = -(full.exp() * full).sum(-1)[:, :-1]
    assert torch.allclose(entropy[:, 1:][trained[:, 1:]], vocab_entropy[trained[:, 1:]], atol=1e-10)


def _grouped_batch(vocab: int, prompt_len: int = 20, groups: int = 2, group_size: int = 4) -> TrainBatch:
    """Right-padded rows whose G copies share a prompt (different prompts, equal lengths per group)."""
    g = torch.Generator().manual_seed(3)
    B, T = groups * group_size, prompt_len + 10
    ids = torch.randint(0, vocab, (B, T), generator=g)
    lengths = torch.randint(prompt_len + 2, T + 1, (B,), generator=g)
    plen = [prompt_len - 2 * (i // group_size) for i in range(B)]  # the second group's prompt is shorter
    for i in range(B):
        ids[i, :plen[i]] = ids[(i // group_size) * group_size, :plen[i]]
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask = attn.clone().double()
    for i in range(B):
        mask[i, :plen[i]] = 0
    mask[::2, plen[0] + 3:plen[0] + 5] = 0  # tool output inside some responses
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T) * mask
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


def test_shared_prompt_forward_gives_the_same_logprobs_and_gradient() -> None:
    """Running each group's prompt once (KV shared, with gradient) equals one full pass per row."""
    batch = _grouped_batch(64)
    results = []
    for share in (False, True):
        model = tiny_llama(64, seed=4, dtype=torch.float64)
        logprobs, entropy = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=share)
        make_policy_loss(DAPOLoss()).fn(logprobs, batch).loss_sum.backward()
        results.append((logprobs.detach(), entropy, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp0, h0, g0), (lp1, h1, g1) = results
    scored = batch.loss_mask_BT.bool()
    assert torch.allclose(lp0[scored], lp1[scored], atol=1e-10) and torch.allclose(h0[scored], h1[scored], atol=1e-10)
    # measured max difference 6e-9 on entries up to 0.3 (the tiny model's rotary tables stay float32);
    # the same 1e-6 bound as the micro-batching invariance above
    assert torch.allclose(g0, g1, atol=1e-6, rtol=0) and g0.abs().sum() > 0
