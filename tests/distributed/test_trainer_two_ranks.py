"""The trainer of `pipeline.train`, unchanged, on 2 gloo ranks with DeepSpeed ZeRO-3 (CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

# The first start on a clean checkout compiles DeepSpeed's CPU communication op (1.5-5 min).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def trained(two_rank_run: Path) -> tuple[dict, Path]:
    return torch.load(two_rank_run / "trainer.pt", weights_only=False), two_rank_run


@pytest.mark.slow
def test_rollouts_sharded_and_gathered_whole(trained) -> None:
    r, _ = trained
    for step in ("first", "second", "third"):
        assert r[step]["kept_same_on_all_ranks"]  # every rank saw every group, in the same order
        assert r[step]["n_kept"] == 3 and r[step]["trajectories"] == 6.0  # 3 problems x 2 samples, over 2 ranks
        assert r[step]["rollout_matches_policy"]  # the ZeRO-3 rollout copy follows each optimiser step
        assert r[step]["metrics"]["train/skipped"] == 0.0


@pytest.mark.slow
def test_steps_update_and_resume_exactly(trained) -> None:
    r, _ = trained
    assert not torch.equal(r["before_second"], r["after"])
    assert (r["resumed_state"].step, r["resumed_state"].data_cursor) == (1, 3)
    assert torch.equal(r["resumed_after"], r["after"])  # same rollouts, same update after resume
    assert r["third"]["kept"] == r["second"]["kept"]  # the resumed run samples the same trajectories
    assert r["third"]["metrics"] == r["second"]["metrics"]


@pytest.mark.slow
def test_final_model_is_a_hugging_face_directory(trained) -> None:
    r, tmp = trained
    model = AutoModelForCausalLM.from_pretrained(tmp / "policy", dtype=torch.float32)
    assert torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), r["after"])


@pytest.mark.slow
def test_refill_across_ranks_draws_from_the_window_in_order(two_rank_run: Path) -> None:
    steps = torch.load(two_rank_run / "refill.pt", weights_only=False)
    drawn = []
    for i, step in enumerate(steps):
        assert step["collector"] == "ShardedRefilling"
        (seen, kept), other = step["seen_kept"][0], step["seen_kept"][1]
        assert (seen, kept) == tuple(other)  # every rank saw every group, in the same order
        assert seen[:3] == step["window"][:3]  # the step's three problems start, on ranks 0 1 0
        assert is_subsequence(seen[3:], step["window"][3:])  # refills: the window's reserve, in order
        assert len(kept) <= 3 and step["cursor"] == 6 * (i + 1)  # the window is consumed whole
        assert step["metrics"]["train/problems_drawn"] == len(seen)
        assert step["metrics"]["rollout/trajectories"] == 2 * len(seen)
        drawn.append(len(seen))
    assert max(drawn) > 3  # some rank replaced a dropped group


def is_subsequence(part: list, whole: list) -> bool:
    rest = iter(whole)
    return all(any(x == y for y in rest) for x in part)
