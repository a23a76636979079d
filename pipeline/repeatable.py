"""What makes a stage's numbers repeat: one seed for every generator, and torch's deterministic kernels.

A seed alone does not make an update repeat. Some kernels add into one place from several threads with
atomic adds, in whatever order the threads run: on CPU, the backward of advanced indexing where an index
repeats (`x[index]`; rows of a prefix tree that predict from one node gather it twice) summed one
micro-batch's gradients differently in 3 of 5 fresh processes, and the main job's train stage, sampling the
same first step to the bit, ended that step with 5 different sets of weights in 12 runs (Adam's first steps
turn a last-bit difference into a visible one). On CUDA many more kernels do this (index_add, scatter_add,
the attention backward) and cuBLAS needs a fixed workspace to repeat (`CUBLAS_WORKSPACE_CONFIG`).
`torch.use_deterministic_algorithms` swaps each such kernel for an ordered one where torch has it;
`warn_only`: a kernel with none warns once instead of stopping a run. The update also avoids the worst
case itself (`pipeline.trainer.update` gathers rows with index_select, whose backward sums in order on CPU).
`run.deterministic: false` gives the faster kernels back (`benchmarks/deterministic_update.py` measures the
cost).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def use_deterministic_kernels(enabled: bool) -> None:
    """torch's deterministic kernels on (or off) for this process; call before the first CUDA matmul."""
    if enabled:  # read when cuBLAS makes its handle; a user's own setting wins
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    # Deterministic mode would also fill every torch.empty with NaN (to expose a kernel that reads memory it never
    # wrote): a pass over every new activation. Left off: such a kernel shows anyway, as runs that differ, which
    # the repeat tests (tests/train/test_repeatable_update.py) and a repeated stage catch.
    # a module attribute torch sets at import, missing from its stubs
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


def make_repeatable(seed: int, deterministic: bool) -> None:
    seed_everything(seed)
    use_deterministic_kernels(deterministic)
