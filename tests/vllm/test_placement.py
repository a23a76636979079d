"""vLLM placement options (`rollout.vllm`) and the chunked weight push, with tensor parallelism
on CPU (needs `.venv-vllm`).

The push takes a plain `(name, tensor)` iterator: here one that overwrites each tensor as soon as
the next is asked for, as the ZeRO-3 gather of `pipeline.distributed.weight_sync` frees each
chunk, so the backend must copy every tensor when it arrives."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pipeline.config.rollout import VLLMConfig
from pipeline.rollout.backends.vllm import VLLMBackend, engine_device_ids, placement_args
from pipeline.rollout.backends.vllm_weights import layer_aligned_chunks, layer_key
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.test_vllm_backend import LONG_QUESTIONS, generate, reference_logprobs
from tests.vllm.tiny_vllm import load_tiny, save_tiny, tiny_model

HIDDEN, LAYERS = 512, 3  # ~9 MB per decoder layer: a 1 MiB budget would cut inside one (q | k, v) if allowed to


def test_sleep_mode_on_cpu_fails_before_starting_an_engine(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"rollout\.vllm\.enable_sleep_mode.*no sleep mode on this platform"):
        VLLMBackend(tiny_dir, max_batch=2, max_model_len=256, options=VLLMConfig(enable_sleep_mode=True))


def test_placement_args_follow_the_config() -> None:
    colocated = VLLMConfig(gpu_memory_utilization=0.3)
    assert placement_args(colocated, cuda=True, local_rank=1, current_device=1) == {
        "tensor_parallel_size": 1, "enable_sleep_mode": False, "gpu_memory_utilization": 0.3, "device_ids": [1]}
    separate = VLLMConfig(placement="separate", devices=(4, 5, 6, 7), tensor_parallel_size=2)
    assert placement_args(separate, cuda=True, local_rank=1, current_device=1)["device_ids"] == [6, 7]
    assert placement_args(separate, cuda=False) == {"tensor_parallel_size": 2, "enable_sleep_mode": False}


def test_engine_devices_of_each_rank() -> None:
    separate = VLLMConfig(placement="separate", devices=(2, 3), tensor_parallel_size=1)
    assert [engine_device_ids(separate, r, r) for r in (0, 1)] == [[2], [3]]
    with pytest.raises(ValueError, match="no 1 GPU.*local rank 2"):
        engine_device_ids(separate, 2, 2)
    with pytest.raises(ValueError, match="GPU 3, the one it trains on"):
        engine_device_ids(separate, 1, 3)


def test_chunks_are_cut_between_decoder_layers_only() -> None:
    model = tiny_model(len(tiny_tokenizer()), seed=0, hidden=HIDDEN, layers=LAYERS)
    named = list(model.named_parameters())
    chunks = list(layer_aligned_chunks(named, 2**20))
    assert [n for c in chunks for n, _ in c] == [n for n, _ in named]  # every tensor once, in order
    assert len(chunks) == LAYERS + 1
    keys = [{layer_key(n) for n, _ in c} for c in chunks]
    for a, b in zip(keys, keys[1:]):
        assert not a & b  # no layer split over two chunks
    assert list(layer_aligned_chunks(named, 2**40)) == [named]


def freed_after_use(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields copies and overwrites each with NaN once the consumer asks for the next one."""
    for name, p in model.named_parameters():
        t = p.detach().clone()
        yield name, t
        t.fill_(float("nan"))


@pytest.fixture(scope="module")
def tp_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMBackend]:
    path = save_tiny(tmp_path_factory.mktemp("tiny-tp"), seed=0, hidden=HIDDEN, layers=LAYERS)
    # Two CPU workers; vLLM's automatic thread binding wants one NUMA node per worker.
    old = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        options = VLLMConfig(placement="separate", tensor_parallel_size=2, push_chunk_mib=1)
        with VLLMBackend(path, max_batch=4, max_model_len=512, seed=0, options=options) as backend:
            yield backend
    finally:
        if old is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = old


@pytest.mark.timeout(600)
def test_tensor_parallel_engine_takes_a_chunked_push(tp_backend: VLLMBackend) -> None:
    tok = tiny_tokenizer()
    old = load_tiny(Path(tp_backend.path))
    before, _, _ = generate(tp_backend, tok, LONG_QUESTIONS[:2], temperature=0.0)
    for seq in before:  # two workers, each with half of every layer, sample what the HF model gives
        torch.testing.assert_close(torch.tensor(seq.logprobs), reference_logprobs(old, seq, 0.0), atol=2e-3, rtol=0)
    new = tiny_model(len(tok), seed=1, hidden=HIDDEN, layers=LAYERS)
    n_params = len(list(new.parameters()))
    assert tp_backend.update_weights(freed_after_use(new)) == n_params  # LAYERS + 1 chunks of 1 MiB
    after, _, _ = generate(tp_backend, tok, LONG_QUESTIONS[:2], temperature=0.0)
    for seq in after:  # every layer, in every chunk, on both workers, holds the new weights
        torch.testing.assert_close(torch.tensor(seq.logprobs), reference_logprobs(new, seq, 0.0), atol=2e-3, rtol=0)
    assert [s.response_ids for s in after] != [s.response_ids for s in before]
