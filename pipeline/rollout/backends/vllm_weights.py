"""How trained weights travel into a running vLLM engine (the `vllm` backend's `update_weights`).

Tensors cross vLLM's RPC channel as plain data (name, dtype, shape, bytes): it decodes tensors nested in arguments
as lists. They go in chunks cut only between decoder layers, since vLLM fuses a layer's projections and processes a
layer once all of it has loaded. `WeightSync` is the worker extension vLLM mixes into each worker; it imports
nothing of vLLM, so a worker loads it without this package's engine code."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch


# What vLLM logs, per layer, for the layers a partial reload leaves alone: expected with chunked pushes.
_PARTIAL_RELOAD_NOISE = re.compile(r"Failed to load weights|were not loaded from checkpoint")


class _DropPartialReloadNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _PARTIAL_RELOAD_NOISE.search(str(record.msg))


class WeightSync:
    """Worker extension: methods vLLM mixes into each worker, called via `collective_rpc`."""

    def tapo_load_weights(self, packed: list[tuple[str, str, list[int], bytes]], partial: bool = False) -> int:
        # reload_weights, not model.load_weights: after loading, vLLM post-processes the layers
        # (e.g. CPU weight repacking) and plain load_weights no longer applies to them. Layers
        # absent from a partial chunk keep their current (processed) weights.
        runner = self.model_runner  # type: ignore[attr-defined]  # set by the vLLM worker
        loggers = [logging.getLogger(f"vllm.model_executor.model_loader.reload.{m}") for m in ("layerwise", "inplace")]
        noise = _DropPartialReloadNoise()
        if partial:
            for log in loggers:
                log.addFilter(noise)
        try:
            runner.reload_weights(weights_iterator=(unpack_tensor(p) for p in packed))
        finally:
            for log in loggers:
                log.removeFilter(noise)
        return len(packed)


def pack_tensor(name: str, tensor: torch.Tensor) -> tuple[str, str, list[int], bytes]:
    """Plain data for vLLM's RPC channel, which decodes tensors nested in arguments as lists."""
    t = tensor.detach().to("cpu").contiguous()
    return name, str(t.dtype).removeprefix("torch."), list(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()


def unpack_tensor(packed: tuple[str, str, list[int], bytes]) -> tuple[str, torch.Tensor]:
    name, dtype, shape, data = packed
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype))
    return name, flat.reshape(shape)


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def layer_key(name: str) -> str:
    """The decoder layer a HF parameter belongs to (`model.layers.3`), else the name itself."""
    m = _LAYER.match(name)
    return m.group(1) if m else name


def layer_aligned_chunks(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int,
                         pack=None) -> Iterator[list[Any]]:
    """Consecutive tensors (packed by `pack`, default as is) in chunks of at least `chunk_bytes` or
    the end, cut only where the decoder layer changes. Each tensor is packed as it arrives (the
    iterator may free it on the next step, as `pipeline.distributed.weight_sync` does)."""
    chunk: list[Any] = []
    size, last = 0, None
    for name, tensor in named_tensors:
        key = layer_key(name)
        if chunk and size >= chunk_bytes and key != last:
            yield chunk
            chunk, size = [], 0
        chunk.append(pack(name, tensor) if pack else (name, tensor))
        size += tensor.numel() * tensor.element_size()
        last = key
    if chunk:
        yield chunk
