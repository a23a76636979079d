"""The names, shapes and dtypes of a checkpoint's tensors, read from safetensors headers, and the check a weight push
passes before any server loads it.

A reload that fails half-way (a wrong shape, a missing tensor) can leave a vLLM server unable to reload again until
it is restarted, so a push is checked against the layout of the checkpoint the server started from, on both sides:
by the trainer before it writes or sends anything (`check_layout`), and by the server's receiver before it touches
its model. Dtypes may differ (the server casts to its own); names and shapes may not.

Pure Python and the standard library only: the receiver imports this inside vLLM's worker processes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

# name -> (shape, dtype as safetensors names it: F32, BF16, ...)
Layout = dict[str, tuple[tuple[int, ...], str]]

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


class WeightLayoutError(ValueError):
    """A push whose tensors are not the checkpoint's: names the first differences."""


def file_layout(path: Path) -> tuple[Layout, dict[str, str]]:
    """The tensors of one safetensors file and its metadata, from its header (the tensors are not read)."""
    with Path(path).open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > MAX_HEADER_BYTES:
            raise WeightLayoutError(f"{path}: a safetensors header of {size} bytes is not one")
        header = json.loads(f.read(size))
    metadata = header.pop("__metadata__", None) or {}
    return {name: (tuple(entry["shape"]), entry["dtype"]) for name, entry in header.items()}, metadata


def checkpoint_layout(model_dir: Path) -> Layout:
    """Every tensor of a Hugging Face checkpoint directory (all its safetensors files)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise WeightLayoutError(f"{model_dir} holds no safetensors file to check a push against")
    layout: Layout = {}
    for path in files:
        layout |= file_layout(path)[0]
    return layout


def layout_of(named_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(shape) for name, shape in named_shapes}


def check_layout(expected: Layout, pushed: Mapping[str, tuple[int, ...]]) -> None:
    """Raise `WeightLayoutError` unless `pushed` (name -> shape) has exactly the checkpoint's names and shapes."""
    missing = sorted(set(expected) - set(pushed))
    unexpected = sorted(set(pushed) - set(expected))
    wrong = sorted(n for n in set(expected) & set(pushed) if tuple(pushed[n]) != tuple(expected[n][0]))
    if missing or unexpected or wrong:
        parts = [f"{len(missing)} missing (e.g. {missing[:3]})" if missing else "",
                 f"{len(unexpected)} not in the checkpoint (e.g. {unexpected[:3]})" if unexpected else "",
                 "shapes differ: " + ", ".join(f"{n} {tuple(pushed[n])} != {expected[n][0]}" for n in wrong[:3])
                 if wrong else ""]
        raise WeightLayoutError("the pushed weights are not the served model's: " + "; ".join(p for p in parts if p))


def as_json(layout: Layout) -> dict[str, list]:
    """The layout as JSON (what the receiver answers over collective_rpc)."""
    return {name: [list(shape), dtype] for name, (shape, dtype) in layout.items()}


def from_json(data: Mapping[str, list]) -> Layout:
    return {name: (tuple(shape), dtype) for name, (shape, dtype) in data.items()}
