"""Every forward that feeds a log-prob matches the model's own, for every attention variant and every layout.

For each supported family, built tiny from its transformers config (2 layers, seeded, float32, no download):
Llama, Qwen2 without and with a sliding window (from `max_window_layers` on), Mistral (sliding window on every
layer), Gemma 2 and Gemma 3 (local and global layers alternating). Hypothesis draws the rows: their lengths,
which earlier row each shares a prefix with and how long, and the trained positions. Every layout the trainer
can choose (padded, the packed prefix tree, and micro-batch splits of either, as the update, the recomputed old
log-probs and a KL reference run them) must give the log-probs of the model's own forward on each row alone.
Windows are 4 tokens, so most rows run past them.
"""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, PreTrainedModel, Qwen2Config,
                          Qwen2ForCausalLM)

from pipeline.trainer import update
from pipeline.trainer.replicas import OneProcess
from pipeline.trainer.tree_attention import TreeAttention, Unpackable, tree_attention
from pipeline.trainer.update import UpdateSettings, logprobs_as_updated, token_logprobs_and_entropy, update_settings
from pipeline.trainer.weights import FullWeights
from pipeline.types import TrainBatch

VOCAB, WINDOW = 48, 4
# float32, the trainer's precision, where layouts differ by rounding (at most 3.7e-7 measured); attending past a
# window moved log-probs by 0.05 to 0.23. (Not float64: there transformers' eager attention, Gemma 2's, turns a
# padded query whose window holds only padding into NaN, its float64 mask minimum being -inf in its float32 softmax.)
TOLERANCE = 1e-5
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)
FAMILIES: dict[str, Callable[[], PreTrainedModel]] = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**TINY)),
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY)),
    "qwen2-sliding": lambda: Qwen2ForCausalLM(Qwen2Config(**TINY, use_sliding_window=True, sliding_window=WINDOW,
                                                          max_window_layers=1)),
    "mistral-sliding": lambda: MistralForCausalLM(MistralConfig(**TINY, sliding_window=WINDOW)),
    "gemma2": lambda: Gemma2ForCausalLM(Gemma2Config(**TINY, head_dim=8, sliding_window=WINDOW)),
    "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**TINY, head_dim=8, sliding_window=WINDOW,
                                                         sliding_window_pattern=2)),
}
_BUILT: dict[str, PreTrainedModel] = {}


def family(name: str) -> PreTrainedModel:
    if name not in _BUILT:
        torch.manual_seed(0)
        _BUILT[name] = FAMILIES[name]().eval()
    return _BUILT[name]


@st.composite
def shared_rows(draw) -> TrainBatch:
    """2-5 right-padded rows; each after the first repeats a prefix of an earlier row (possibly empty, possibly
    all of it) and goes on with tokens of its own; each trains on a random set of its positions."""
    B = draw(st.integers(2, 5))
    rows: list[list[int]] = []
    for b in range(B):
        shared: list[int] = []
        if b:
            parent = rows[draw(st.integers(0, b - 1))]
            shared = parent[: draw(st.integers(0, len(parent)))]
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=max(0, 2 - len(shared)), max_size=14))
        rows.append(shared + own)
    T = max(len(r) for r in rows)
    ids = torch.zeros((B, T), dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, : len(row)] = torch.tensor(row)
        attn[b, : len(row)] = 1
    trained = draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))
    mask = torch.tensor(trained, dtype=torch.float32).reshape(B, T) * attn
    mask[:, 0] = 0  # position 0 has no prediction
    mask[0, len(rows[0]) - 1] = 1  # at least one trained token
    zeros = torch.zeros((B, T))
    return TrainBatch(ids, attn, mask, zeros, zeros, n_policy_tokens=int(mask.sum()))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: threads only contend (12 examples of a family take 0.5 s of CPU on one thread)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def own_logprobs(model: PreTrainedModel, batch: TrainBatch) -> torch.Tensor:
    """[B, T] log pi(token_t | tokens_<t) from the model's own forward on each row alone, unpadded."""
    out = torch.zeros(batch.input_ids_BT.shape)
    with torch.no_grad():
        for b in range(len(batch)):
            L = int(batch.attention_mask_BT[b].sum())
            ids = batch.input_ids_BT[b : b + 1, :L]
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            out[b, 1:L] = logp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    return out * batch.loss_mask_BT


def layouts(model: PreTrainedModel, batch: TrainBatch) -> dict[str, torch.Tensor]:
    """The log-probs of every layout the trainer can choose, packing forced wherever it is allowed (the FLOP
    estimate would send many of these small batches padded)."""
    out = {}
    with mock.patch.object(update, "packing_pays", lambda *_: True), torch.no_grad():
        for share in (False, True):
            name = "packed" if share else "padded"
            out[name] = token_logprobs_and_entropy(model, batch, 1.0, with_entropy=False, share_prefixes=share)[0]
            for size in (1, 2):
                out[f"{name}, micro-batches of {size}"] = logprobs_as_updated(
                    model, batch, UpdateSettings(size, 1e9, 1.0, share_prefixes=share))
    return {k: v * batch.loss_mask_BT for k, v in out.items()}


@pytest.mark.parametrize("name", list(FAMILIES))
@settings(max_examples=25, deadline=None, derandomize=True)
@given(batch=shared_rows())
def test_every_layout_gives_the_models_own_logprobs(name: str, batch: TrainBatch) -> None:
    model = family(name)
    own = own_logprobs(model, batch)
    for layout, logprobs in layouts(model, batch).items():
        gap = float((logprobs - own).abs().max())
        assert gap < TOLERANCE, f"{name}, {layout}: max |log-prob - own| = {gap:.3g}"


def test_the_packed_tree_runs_for_each_family_with_its_windows() -> None:
    """The property above checks the packed path, not a fall-back to padding: each family packs, with a
    window on exactly its sliding layers."""
    expected = {"llama": {"all": None}, "qwen2": {"full_attention": None},
                "qwen2-sliding": {"full_attention": None, "sliding_attention": WINDOW},
                "mistral-sliding": {"all": WINDOW}, "gemma2": {"full_attention": None, "sliding_attention": WINDOW},
                "gemma3": {"full_attention": None, "sliding_attention": WINDOW}}
    for name, windows in expected.items():
        attention = tree_attention(family(name).config)
        assert isinstance(attention, TreeAttention) and dict(attention.windows) == windows, (name, attention)


@pytest.mark.parametrize(("change", "why"), [
    ({"attention_chunk_size": 8}, "attention_chunk_size"),
    ({"use_bidirectional_attention": True}, "bidirectional"),
    ({"is_causal": False}, "bidirectional"),
    ({"_attn_implementation": "flash_attention_2"}, "flash_attention_2"),
    ({"layer_types": ["full_attention", "linear_attention"]}, "linear_attention"),
])
def test_attention_a_tree_mask_cannot_express_runs_padded_and_set_up_says_why(change: dict, why: str, capsys) -> None:
    config = LlamaConfig(**TINY)
    for key, value in change.items():
        setattr(config, key, value)
    attention = tree_attention(config)
    assert isinstance(attention, Unpackable) and why in attention.why
    replicas = OneProcess(family("llama"), torch.optim.SGD(family("llama").parameters(), lr=0.0), 1.0, FullWeights())
    with mock.patch.object(family("llama"), "config", config):
        settings_ = update_settings(4, 1.0, 1.0, replicas, None)
    assert not settings_.share_prefixes
    assert why in capsys.readouterr().err


def test_a_model_that_cannot_run_packed_runs_padded_whoever_asks() -> None:
    """A caller asking for prefix sharing (the SFT step does) gets the padded forward of a model whose attention
    the tree mask cannot express: here Mistral's window, hidden from `tree_attention` as chunked attention."""
    model = family("mistral-sliding")
    batch = _a_shared_batch()
    with mock.patch.object(model.config, "attention_chunk_size", 8, create=True), \
            mock.patch.object(update, "packing_pays", lambda *_: True), torch.no_grad():
        asked = token_logprobs_and_entropy(model, batch, 1.0, share_prefixes=True)[0]
    assert torch.allclose(asked * batch.loss_mask_BT, own_logprobs(model, batch), atol=TOLERANCE, rtol=0)


def _a_shared_batch() -> TrainBatch:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (3, 24), generator=g)
    ids[1, :12] = ids[0, :12]
    ids[2, :20] = ids[0, :20]
    attn = torch.ones_like(ids)
    mask = attn.float()
    mask[:, :6] = 0
    zeros = torch.zeros(ids.shape)
    return TrainBatch(ids, attn, mask, zeros, zeros, n_policy_tokens=int(mask.sum()))
