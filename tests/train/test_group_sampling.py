"""Dynamic sampling by refill: a dropped group is replaced inside the running rollout."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch.distributed as dist

from pipeline.rl.advantage import is_informative
from pipeline.config import ConfigError, load_config
from pipeline.distributed.sharding import ShardedRollouts, window_shares
from pipeline.sampling.dynamic_sampling import InRounds, Refilling, ShardedRefilling, sampler_for
from pipeline.paths import REPO_ROOT
from pipeline.train import set_up
from tests.helpers.training import collect
from tests.helpers.recipe import PLAIN_RECIPE
from tests.train.toy_task import build_direct_model, toy_config


def test_refill_draws_until_the_batch_is_full_and_not_one_problem_more(tmp_path: Path) -> None:
    # Groups of 2 coin flips agree half the time, so about half the groups are dropped and replaced.
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, group_size=2, prompts_per_step=3, max_gen_rounds=2,
                     refill_dropped_groups=True)
    tr = set_up(cfg, {})
    assert tr.sampler == Refilling(3, 2, 2)
    drawn_per_step, cursor = [], 0
    for _ in range(6):
        collected = collect(tr)
        seen, kept = collected.seen, collected.kept
        assert all(is_informative(g) for g in kept) and not any(is_informative(g) for g in collected.dropped)
        assert [g for g in seen if g in kept] == kept and len(kept) + len(collected.dropped) == len(seen)
        if len(kept) == 3:  # full: the last problem drawn is the one that filled the batch
            assert seen[-1] is kept[-1]
        else:  # the cap on problems drawn: prompts_per_step x max_gen_rounds
            assert len(seen) == 6
        assert len(kept) <= 3 and tr.stream.cursor - cursor == len(seen)
        assert collected.metrics["train/problems_drawn"] == len(seen)
        assert collected.metrics["rollout/trajectories"] == 2 * len(seen)
        drawn_per_step.append(len(seen))
        cursor = tr.stream.cursor
    assert max(drawn_per_step) > 3  # some step did replace a dropped group
    assert tr.engine.rollouts_started == 6  # one rollout a step, however many replacements
    tr.engine.close()


def params(**overrides):
    return load_config(REPO_ROOT / "params.yaml", overrides=PLAIN_RECIPE | overrides)


def chosen(cfg):
    return sampler_for(cfg.train.sampling, cfg.rollout, cfg.distributed.enabled)


def test_the_sampling_is_chosen_once_and_refused_where_it_cannot_work() -> None:
    assert type(chosen(params())) is InRounds
    assert type(chosen(params(**{"train.sampling.refill_dropped_groups": True}))) is Refilling
    assert type(chosen(params(**{"train.sampling.refill_dropped_groups": True, "distributed.enabled": True}))) \
        is ShardedRefilling
    with pytest.raises(ConfigError, match="train.sampling.refill_dropped_groups = True, rollout.schedule = turn-synchronous"):
        params(**{"train.sampling.refill_dropped_groups": True, "rollout.schedule": "turn-synchronous"})
    with pytest.raises(ConfigError, match="train.sampling.refill_dropped_groups needs train.algorithm.dynamic_sampling"):
        params(**{"train.sampling.refill_dropped_groups": True, "train.algorithm.dynamic_sampling": False})


@pytest.mark.parametrize(("target", "size", "world"), [(3, 6, 2), (3, 9, 2), (2, 6, 3), (4, 4, 2), (1, 3, 2)])
def test_window_shares_split_a_refilled_step_among_ranks(target: int, size: int, world: int) -> None:
    shares = [window_shares(target, size, rank, world) for rank in range(world)]
    assert sorted(i for mine, _ in shares for i in mine) == list(range(target))  # each head problem once
    assert sorted(i for _, reserve in shares for i in reserve) == list(range(target, size))  # each spare once
    for mine, reserve in shares:
        assert reserve == sorted(reserve) and all(i >= target for i in reserve)
        assert mine or not reserve  # a rank that starts nothing has nothing to replace
        # a rank's reserve is as large as its share of the head, give or take one: its refills keep pace
        assert abs(len(reserve) - len(mine) * (size - target) / target) <= 1


def test_sharded_refill_draws_from_the_window_in_order_and_skips_the_rest(tmp_path: Path) -> None:
    # One gloo rank: the data-parallel collector's own code path, with every spare problem in its reserve.
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, group_size=2, prompts_per_step=3, max_gen_rounds=2,
                     refill_dropped_groups=True)
    tr = set_up(cfg, {})
    sharded, sampler = ShardedRollouts(tr.engine), ShardedRefilling(3, 2, 2)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        drawn_per_step = []
        for step in range(6):
            window = copy.deepcopy(tr.stream).take(6)
            collected = sampler.collect(sharded, tr.stream, tr.reward, tr.keep)
            seen, kept = collected.seen, collected.kept
            assert [g.group.problem for g in seen] == window[: len(seen)]  # the head, then spares in order
            assert tr.stream.cursor == 6 * (step + 1)  # the whole window is consumed, used or not
            assert all(is_informative(g) for g in kept) and not any(is_informative(g) for g in collected.dropped)
            assert len(kept) <= 3 and (len(kept) == 3 or len(seen) == 6)
            assert collected.metrics["rollout/trajectories"] == 2 * len(seen)
            assert collected.metrics["train/problems_skipped"] == 6 - len(seen)
            drawn_per_step.append(len(seen))
        assert max(drawn_per_step) > 3 and min(drawn_per_step) < 6  # refills happened, and not always to the cap
    finally:
        dist.destroy_process_group()
        tr.engine.close()
