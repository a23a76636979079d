"""DeepSpeed config generation, group sharding and rollout-stat merging (one process; the launcher: test_launch)."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.config.distributed import DistributedConfig
from pipeline.distributed.ds_config import deepspeed_config
from pipeline.distributed.sharding import assign_groups, merge_stats, problem_shard, rank_rows
from pipeline.rollout.metrics import RolloutStats
from tests.distributed.worker import make_batch


def test_config_is_generated_from_params(repo_root) -> None:
    cfg = load_config(repo_root / "params.yaml", overrides={"distributed.zero_stage": 3,
                                                             "distributed.offload_params": True,
                                                             "distributed.offload_optimizer": True})
    ds = deepspeed_config(cfg.distributed, cfg.train.update.micro_batch_size, cfg.train.optimizer.grad_clip, cfg.model.dtype)
    assert ds["train_micro_batch_size_per_gpu"] == cfg.train.update.micro_batch_size
    assert ds["gradient_clipping"] == cfg.train.optimizer.grad_clip
    assert ds["managed_gradient_accumulation"] is False and ds["gradient_accumulation_steps"] == 1
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize(("dtype", "bf16", "fp16"), [("float32", False, False), ("bfloat16", True, False),
                                                     ("float16", False, True)])
def test_precision_follows_the_model_dtype(dtype, bf16, fp16) -> None:
    ds = deepspeed_config(DistributedConfig(), 4, 1.0, dtype)
    assert (ds["bf16"]["enabled"], ds["fp16"]["enabled"]) == (bf16, fp16)
    assert ds["zero_optimization"] == {"stage": 2, "contiguous_gradients": True, "overlap_comm": False,
                                       "reduce_bucket_size": 50_000_000, "allgather_bucket_size": 50_000_000}


@pytest.mark.parametrize(("fields", "needle"), [({"zero_stage": 2, "offload_params": True}, "zero_stage 3"),
                                                ({"zero_stage": 0, "offload_optimizer": True}, "zero_stage 2 or 3"),
                                                ({"zero_stage": 1}, "zero_stage")])
def test_bad_combinations_are_named(fields, needle) -> None:
    with pytest.raises(ValueError, match=needle):
        DistributedConfig(**fields)


@given(st.lists(st.integers(1, 500), max_size=30), st.integers(1, 8))
def test_every_group_on_exactly_one_rank_and_balanced(costs, world) -> None:
    shards = assign_groups([float(c) for c in costs], world)
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(len(costs)))
    loads = [sum(costs[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(costs, default=0)  # greedy LPT bound
    assert shards == assign_groups([float(c) for c in costs], world)  # same on every rank


def test_problem_shards_partition_the_batch() -> None:
    assert [problem_shard(5, r, 2) for r in range(2)] == [[0, 2, 4], [1, 3]]
    assert problem_shard(1, 1, 2) == []


def test_rank_rows_carry_their_own_token_count() -> None:
    batch = make_batch(3, seed=0)
    parts = [rank_rows(batch, list(range(0, 4))), rank_rows(batch, list(range(4, 12)))]
    assert sum(p.n_policy_tokens for p in parts) == batch.n_policy_tokens
    assert torch.equal(parts[1].input_ids_BT, batch.input_ids_BT[4:12])


def test_merged_stats_add_up() -> None:
    a = RolloutStats(4, 2.0, 1.0, 1.0, 40, {"code": 1.0}, {"code": 1}, {"code": 0.1}, {"code": 0.5}, {1: 4},
                     {"eos": 4})
    b = RolloutStats(2, 3.0, 2.0, 0.0, 10, {"code": 4.0}, {"code": 2}, {"code": 0.3}, {"code": 0.2}, {2: 2},
                     {"eos": 1, "length": 1})
    m = merge_stats([a, b])
    assert (m.trajectories, m.wall_s, m.policy_tokens) == (6, 3.0, 50)
    assert m.calls_per_trajectory == {"code": 2.0} and m.tool_errors == {"code": 3}
    assert m.tool_latency_p95_s == {"code": 0.5} and m.turns_histogram == {1: 4, 2: 2}
    assert m.finish_reasons == {"eos": 5, "length": 1}


def test_bf16_model_gives_float32_logprobs() -> None:
    """GPU runs train in bf16; the importance ratio must not be computed from bf16 log-probs."""
    from pipeline.trainer.update import token_logprobs_and_entropy
    from tests.helpers.tiny import tiny_llama

    batch = make_batch(1, seed=0)
    lp16, ent16 = token_logprobs_and_entropy(tiny_llama(64, seed=1, dtype=torch.bfloat16), batch, 1.0)
    lp32, _ = token_logprobs_and_entropy(tiny_llama(64, seed=1), batch, 1.0)
    assert lp16.dtype == ent16.dtype == torch.float32
    assert not torch.equal(lp16, lp16.to(torch.bfloat16).float())  # more precision than bf16 holds
    assert torch.allclose(lp16, lp32, atol=0.1)
