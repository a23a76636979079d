"""Precision and layout under data parallelism (2 gloo ranks, DeepSpeed on CPU; `precision_worker`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

# The first start on a clean checkout compiles DeepSpeed's CPU communication op (1.5-5 min).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def seen(two_rank_run: Path) -> dict:
    return torch.load(two_rank_run / "precision.pt", weights_only=False)


@pytest.mark.slow
def test_deepspeed_low_precision_steps_float32_masters_that_all_move(seen: dict) -> None:
    """bf16 (and fp16 where the accelerator has it): one AdamW step at lr 1e-5 moves nearly every master weight."""
    for dtype in ("bfloat16", "float16"):
        if dtype not in seen:
            continue
        r = seen[dtype]
        assert r["module_dtypes"] == [f"torch.{dtype}"] and r["master_dtypes"] == ["torch.float32"], r
        assert r["share"] >= 0.99, r


@pytest.mark.slow
@pytest.mark.parametrize("case", ["same_forward", "first_update"])
def test_reference_old_logprobs_and_update_agree_exactly_before_the_first_step(seen: dict, case: str) -> None:
    """On 2 ranks with a bf16 forward, rows padded: every micro-batch of every rank trains at ratio exactly 1
    against a reference equal to the policy (KL exactly 0); the reference ran the update's layout. On rows that
    would pack, a packed reference beside the padded update differed, and its KL term pushed a gradient."""
    r = seen[case]
    assert r["share_prefixes"] is False
    assert all(all(rank) and rank for rank in r["exact"]), r["exact"]
    assert r["metrics"]["train/ref_kl"] == 0.0 and r["metrics"]["train/approx_kl"] == 0.0
    if case == "same_forward":  # zero advantages, and the KL at its minimum: nothing to move
        assert r["metrics"]["train/grad_norm"] == 0.0
