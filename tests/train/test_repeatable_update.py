"""The update repeats to the bit: the same batch and weights give the same gradient however the threads run.

Rows of a prefix tree that predict from one node gather its logits more than once, and the backward of advanced
indexing adds the copies' gradients with atomic adds in thread order on CPU; Adam's first step then turns a last-bit
difference into different weights. Measured on the main job: the same first step to the bit, 5 different sets of
weights in 12 runs. These tests run with 2 threads (the suite's other tests use 1, which hides the race)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import given, settings, strategies as st

from pipeline.config.train import DAPOLoss
from pipeline.repeatable import use_deterministic_kernels
from pipeline.rl.loss import make_policy_loss
from pipeline.trainer.prefix_tree import packing_pays, prefix_tree
from pipeline.trainer.update import _rows_at, token_logprobs_and_entropy
from pipeline.types import TrainBatch
from tests.helpers.tiny import tiny_llama

REPEATS = 6


@pytest.fixture(autouse=True)
def two_threads() -> Iterator[None]:
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        use_deterministic_kernels(deterministic)


def _group(vocab: int, rows: int = 8, prompt: int = 64, response: int = 24) -> TrainBatch:
    """One prompt, then rows that agree in pairs for 8 tokens and go on alone: every row's first trained token
    is predicted from the prompt's last position, each pair's next 7 from their shared node."""
    g = torch.Generator().manual_seed(3)
    T = prompt + response
    ids = torch.randint(0, vocab, (rows, T), generator=g)
    ids[:, :prompt] = ids[0, :prompt]
    for r in range(0, rows, 2):
        ids[r + 1, prompt:prompt + 8] = ids[r, prompt:prompt + 8]
    attn = torch.ones(rows, T, dtype=torch.long)
    mask = attn.clone().float()
    mask[:, :prompt] = 0
    adv = torch.randn(rows, 1, generator=g).expand(rows, T) * mask
    old = -torch.rand(rows, T, generator=g) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


def _gradients(model: torch.nn.Module, batch: TrainBatch, repeats: int = REPEATS) -> list[torch.Tensor]:
    loss = make_policy_loss(DAPOLoss(kl_coef=0.0))
    out = []
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        logprobs, _ = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=True)
        loss.fn(logprobs, batch).loss_sum.backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return out


def _all_equal(tensors: list[torch.Tensor]) -> bool:
    return all(torch.equal(tensors[0], t) for t in tensors[1:])


def test_the_prefix_tree_update_gives_one_gradient_with_the_fast_kernels() -> None:
    """No deterministic mode: the update's own gathers sum repeated rows in a fixed order."""
    use_deterministic_kernels(False)
    batch = _group(vocab=4096)
    tree = prefix_tree(batch.input_ids_BT, batch.attention_mask_BT.sum(1).tolist())
    model = tiny_llama(4096, seed=1)
    assert packing_pays(tree.positions(), *batch.input_ids_BT.shape, model.config.hidden_size)  # the tree path
    grads = _gradients(model, batch)
    assert grads[0].abs().sum() > 0 and _all_equal(grads)


class _GatherTwice(torch.nn.Module):
    """A model part that gathers a row more than once by advanced indexing (as MoE routers and custom heads do)."""

    def __init__(self, index: torch.Tensor) -> None:
        super().__init__()
        self.index = index

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[self.index]


def _model_gathering_twice(seed: int) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    torch.manual_seed(seed)
    weight = torch.nn.Parameter(torch.randn(64, 256))
    index = torch.randint(0, 64, (4096,), generator=torch.Generator().manual_seed(seed))
    part, upstream = _GatherTwice(index), torch.randn(4096, 256)

    def gradient() -> torch.Tensor:
        weight.grad = None
        (part(weight) * upstream).sum().backward()
        return weight.grad.clone()

    return part, gradient


def test_deterministic_kernels_make_a_models_own_repeated_gather_repeat() -> None:
    """What run.deterministic buys beyond our own gathers: a model's kernel that races (here a repeated
    advanced-indexing gather) sums in one order once the stage turns deterministic kernels on."""
    _, gradient = _model_gathering_twice(seed=5)
    use_deterministic_kernels(True)
    assert _all_equal([gradient() for _ in range(20)])  # without: 10 distinct gradients in 20 (2 threads, quiet)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 5), st.data())
def test_rows_at_is_advanced_indexing(batch: int, width: int, hidden: int, data: st.DataObject) -> None:
    """The index_select gather equals hidden[rows, cols] for any pairs, repeated ones included, and so does its
    gradient (up to the summation order, which is what differs)."""
    n = data.draw(st.integers(1, 12))
    rows = torch.tensor(data.draw(st.lists(st.integers(0, batch - 1), min_size=n, max_size=n)))
    cols = torch.tensor(data.draw(st.lists(st.integers(0, width - 1), min_size=n, max_size=n)))
    x = torch.randn(batch, width, hidden, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(n, hidden, dtype=torch.float64)
    ours = _rows_at(x, rows, cols)
    assert torch.equal(ours, x[rows, cols])
    (g_ours,) = torch.autograd.grad((ours * upstream).sum(), x)
    (g_ref,) = torch.autograd.grad((x[rows, cols] * upstream).sum(), x)
    assert torch.allclose(g_ours, g_ref, rtol=0, atol=1e-12)
