"""What the training-update benchmarks share: their command line, the base model, and one function of
`pipeline.update` swapped for its baseline while the baseline side runs (both sides in one process)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

import torch

import pipeline.update as update
from pipeline.model import load_policy
from pipeline.paths import REPO_ROOT


def args_and_base_model(description: str) -> tuple[argparse.Namespace, torch.nn.Module, object]:
    """`--reps` (alternations of the two sides) and `--threads`; SmolLM2-135M-Instruct from models/base, fp32."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_policy(str(REPO_ROOT / "models" / "base"), "float32", "cpu")
    return args, model, tokenizer


@contextlib.contextmanager
def swapped(name: str, replacement: Callable) -> Iterator[None]:
    """`pipeline.update.<name>` is `replacement` while open (the update looks its helpers up at call time)."""
    original = getattr(update, name)
    setattr(update, name, replacement)
    try:
        yield
    finally:
        setattr(update, name, original)
