"""GrowingCache: the same keys, values and logits as DynamicCache, appended in place."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from pipeline.rollout.kv_cache import MIN_HEADROOM_TOKENS, GrowingCache
from tests.helpers.greedy import greedy_logits
from tests.helpers.tiny import tiny_llama


def _prefix_kv(model, ids_BT: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with torch.no_grad():
        out = model(input_ids=ids_BT, use_cache=True)
    return [(layer.keys, layer.values) for layer in out.cache.layers]


def test_decoding_through_a_growing_cache_gives_identical_logits() -> None:
    model = tiny_llama(64, seed=3).eval()
    ids = torch.randint(0, 64, (3, 10), generator=torch.Generator().manual_seed(0))
    kv = _prefix_kv(model, ids[:, :-1])
    steps = 2 * MIN_HEADROOM_TOKENS + 5  # past the first buffer's capacity: a regrowth happens on the way
    # Greedy tokens are fed back, so a single wrong cache column on any step changes the last logits.
    dynamic = greedy_logits(model, DynamicCache(ddp_cache_data=kv), 3, 9, steps)
    growing = greedy_logits(model, GrowingCache(kv), 3, 9, steps)
    assert torch.equal(dynamic, growing)


def test_a_step_with_room_writes_in_place_and_a_full_buffer_grows() -> None:
    k = torch.randn(2, 1, 5, 4)
    cache = GrowingCache([(k, k.clone())])
    layer = cache.layers[0]
    buffer_ptr, capacity = layer.keys.data_ptr(), layer.capacity()
    assert capacity >= 5 + MIN_HEADROOM_TOKENS
    appended = []
    for _ in range(capacity - 5):  # fill the headroom: no new buffer
        step = torch.randn(2, 1, 1, 4)
        appended.append(step)
        keys, _ = layer.update(step, step)
        assert keys.data_ptr() == buffer_ptr
    keys, values = layer.update(step, step)  # one more: a bigger buffer, same contents
    assert layer.capacity() > capacity and keys.data_ptr() != buffer_ptr
    assert torch.equal(keys, torch.cat([k, *appended, step], dim=2))
    assert torch.equal(values[:, :, 5:], torch.cat([*appended, step], dim=2))


def test_headroom_is_capped_by_max_tokens_but_never_below_what_is_held() -> None:
    k = torch.randn(1, 1, 30, 2)
    assert GrowingCache([(k, k)], max_tokens=40).layers[0].capacity() == 40
    assert GrowingCache([(k, k)], max_tokens=20).layers[0].capacity() == 30


def test_tensors_replaced_from_outside_are_adopted() -> None:
    k = torch.arange(2 * 3, dtype=torch.float32).reshape(2, 1, 3, 1)
    cache = GrowingCache([(k, k)])
    cache.layers[0].batch_select_indices(torch.tensor([1]))  # transformers' own row selection: plain tensors
    step = torch.full((1, 1, 1, 1), 9.0)
    keys, values = cache.layers[0].update(step, step)
    assert keys.flatten().tolist() == [3.0, 4.0, 5.0, 9.0] and torch.equal(keys, values)
    assert cache.get_seq_length() == 4


def test_stacked_blocks_are_right_aligned_over_zeros_and_appendable() -> None:
    a = torch.full((2, 1, 3, 2), 1.0)
    b = torch.full((1, 1, 5, 2), 2.0)
    cache = GrowingCache.stacked([[(a, -a)], [(b, -b)]], width=5)
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert keys.shape == (3, 1, 5, 2) and torch.equal(values, -keys)
    assert keys[:2, 0, :, 0].tolist() == [[0.0, 0.0, 1.0, 1.0, 1.0]] * 2 and keys[2, 0, :, 0].tolist() == [2.0] * 5
    step = torch.full((3, 1, 1, 2), 7.0)
    keys, _ = cache.layers[0].update(step, step)
    assert keys.shape == (3, 1, 6, 2) and keys[:, 0, -1, 0].tolist() == [7.0] * 3
    assert keys[:2, 0, :5, 0].tolist() == [[0.0, 0.0, 1.0, 1.0, 1.0]] * 2


def test_runs_of_consecutive_rows() -> None:
    from pipeline.rollout.backends.hf import _runs

    assert _runs([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]
    assert _runs([]) == [] and _runs([4]) == [(4, 5)]
