"""Weights for the vLLM rollout engine out of DeepSpeed (2 gloo ranks, CPU): the ZeRO-3 gather,
chunk by chunk, gives exactly the single-process model's parameters (`weight_sync_worker`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from pipeline.distributed.launch import on_this_machine, run_ranks

# The first start on a clean checkout compiles DeepSpeed's CPU communication op (1.5-5 min).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def synced(tmp_path_factory, repo_root: Path) -> tuple[dict, dict]:
    out = tmp_path_factory.mktemp("weight_sync")
    env = dict(os.environ) | {"PYTHONPATH": str(repo_root),
                              "TORCH_EXTENSIONS_DIR": str(repo_root / ".cache" / "torch_extensions")}
    result = run_ranks(["-m", "tests.distributed.weight_sync_worker", str(out)], on_this_machine(2),
                       log_dir=out / "rank_logs", env=env | {"OMP_NUM_THREADS": "1"}, timeout_s=900)
    assert result.returncode == 0, f"ranks failed (launcher exit {result.returncode}):\n{result.tail}"
    return (torch.load(out / "weight_sync.pt", weights_only=False),
            torch.load(out / "weight_sync_rank1.pt", weights_only=False))


def assert_exact(received: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(received) == list(expected)  # every parameter once, in the module's order
    for name, tensor in expected.items():
        assert received[name].shape == tensor.shape, name
        assert torch.equal(received[name], tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rank0_one_param", "rank0_three_params", "all_ranks_whole_model",
                                  "after_early_stop", "trainer_push", "zero2"])
def test_gathered_weights_equal_the_single_process_model(synced, case: str) -> None:
    rank0, rank1 = synced
    assert_exact(rank0[case]["received"], rank0["reference"])
    if case in ("all_ranks_whole_model", "trainer_push"):  # each rank feeds its own engine
        assert_exact(rank1[case]["received"], rank0["reference"])
    else:
        assert rank1[case]["received"] == {}  # rank 1 took part in the gather but received nothing


@pytest.mark.slow
def test_zero3_gather_holds_one_chunk_at_a_time(synced) -> None:
    r = synced[0]
    n = r["n_params"]
    assert r["whole_after"] == 0  # the test engine really shards every parameter
    assert r["rank0_one_param"]["chunks"] == n and r["rank0_one_param"]["most_gathered"] == 1
    three = r["rank0_three_params"]
    assert 1 < three["largest_chunk"] < n and three["most_gathered"] <= three["largest_chunk"]
    assert r["all_ranks_whole_model"]["most_gathered"] == n


@pytest.mark.slow
def test_a_consumer_that_stops_early_leaves_the_ranks_in_step(synced) -> None:
    rank0, rank1 = synced
    for received in (rank0["early_stop"]["received"], rank1["early_stop"]["received"]):
        assert list(received) == list(rank0["reference"])[:2]
    # the next gather worked (asserted exact above): the drained one kept the collectives aligned


@pytest.mark.slow
def test_gathered_after_an_optimiser_step_are_the_new_weights(synced) -> None:
    r = synced[0]
    assert_exact(r["stepped"]["received"], r["stepped_reference"])
    assert not torch.equal(r["stepped_reference"]["model.embed_tokens.weight"], r["reference"]["model.embed_tokens.weight"])
