"""Trained weights for a rollout engine that holds its own copy (vLLM), out of a DeepSpeed model.

The rollout side takes a plain iterator of `(name, tensor)` in Hugging Face parameter names
(`VLLMBackend.update_weights`); this module produces it, so the two meet without either
importing the other's environment (vLLM and DeepSpeed live in different virtual environments
in CI).

Under ZeRO-3 each rank holds 1/W of every parameter. `full_named_parameters` gathers them a
*chunk* at a time (consecutive parameters up to `chunk_bytes`; a bigger one travels alone) with
`deepspeed.zero.GatheredParameters`, yields the chunk's full tensors and frees them before the
next chunk: the extra memory is one chunk, never the whole model. Gathering is a collective:
every rank must drain the iterator in lock-step (`to_rank` only decides who *receives* the
tensors; the others still take part). Without ZeRO-3 parameters are whole on every rank and are
yielded as they are, with no communication.

A yielded tensor is valid until the iterator advances (the gathered storage is released with
its chunk): consumers copy what they keep, as `VLLMBackend.update_weights` does when it packs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_CHUNK_BYTES = 512 * 2**20


def is_zero3_partitioned(module: torch.nn.Module) -> bool:
    """DeepSpeed ZeRO-3 marks every partitioned parameter with `ds_id` (and keeps 1/W of it)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


def _full_bytes(p: torch.nn.Parameter) -> int:
    numel = getattr(p, "ds_numel", None) or p.numel()  # ds_numel: the full size; p.numel() is the shard
    return int(numel) * p.element_size()


def parameter_chunks(named: list[tuple[str, torch.nn.Parameter]], chunk_bytes: int) -> list[list[tuple[str, Any]]]:
    """Consecutive parameters in chunks of at most `chunk_bytes` (full size); a larger one alone.

    Consecutive, so a chunk holds whole decoder layers as far as the budget allows and the order
    is the module's (the order vLLM's loaders expect)."""
    chunks: list[list[tuple[str, Any]]] = []
    size = 0
    for name, p in named:
        nbytes = _full_bytes(p)
        if not chunks or size + nbytes > chunk_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append((name, p))
        size += nbytes
    return chunks


def full_named_parameters(module: torch.nn.Module, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                          to_rank: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every parameter of `module` (the DeepSpeed engine's `.module`).

    Collective under ZeRO-3 (every rank iterates to the end); `to_rank=None` yields on every rank
    (each rank feeding its own rollout engine), `to_rank=r` only on rank r. Tied parameters come
    once, under their first name, as `named_parameters` gives them.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    receive = to_rank is None or not dist.is_initialized() or dist.get_rank() == to_rank
    if not is_zero3_partitioned(module):
        if receive:
            for name, p in module.named_parameters():
                yield name, p.detach()
        return
    import deepspeed

    for chunk in parameter_chunks(list(module.named_parameters()), chunk_bytes):
        with torch.no_grad(), deepspeed.zero.GatheredParameters([p for _, p in chunk], modifier_rank=None):
            if receive:
                for name, p in chunk:
                    yield name, p.detach()


def push_weights(module: torch.nn.Module, rollout_backend: Any, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 to_rank: int | None = None) -> None:
    """Hand the trained weights to a rollout backend's `update_weights` (collective under ZeRO-3).

    The gather is drained to its end whatever the backend reads (ranks that receive nothing, a
    backend that stops early), so every rank takes part in every collective."""
    named = full_named_parameters(module, chunk_bytes=chunk_bytes, to_rank=to_rank)
    if to_rank is None or not dist.is_initialized() or dist.get_rank() == to_rank:
        rollout_backend.update_weights(named)
    for _ in named:
        pass
