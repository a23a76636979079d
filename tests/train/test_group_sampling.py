"""Dynamic sampling by refill: a dropped group is replaced inside the running rollout."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.advantage import is_informative
from pipeline.config import ConfigError, load_config
from pipeline.group_sampling import collect_in_rounds, collect_with_refill, group_collector
from pipeline.paths import REPO_ROOT
from pipeline.train import set_up
from tests.train.toy_task import build_direct_model, toy_config


def test_refill_draws_until_the_batch_is_full_and_not_one_problem_more(tmp_path: Path) -> None:
    # Groups of 2 coin flips agree half the time, so about half the groups are dropped and replaced.
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, group_size=2, prompts_per_step=3, max_gen_rounds=2,
                     refill_dropped_groups=True)
    tr = set_up(cfg, {}, resume=False)
    assert tr.collect_groups is collect_with_refill
    drawn_per_step, cursor = [], 0
    for _ in range(6):
        collected = tr.collect_groups(tr)
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
    assert tr.engine.calls == 6  # one rollout a step, however many replacements
    tr.engine.close()


def params(**overrides):
    return load_config(REPO_ROOT / "params.yaml", overrides=overrides)


def test_the_sampling_is_chosen_once_and_refused_where_it_cannot_work() -> None:
    assert group_collector(params()) is collect_in_rounds
    assert group_collector(params(**{"train.refill_dropped_groups": True})) is collect_with_refill
    with pytest.raises(ValueError, match="single-process"):
        group_collector(params(**{"train.refill_dropped_groups": True, "distributed.enabled": True}))
    with pytest.raises(ValueError, match="rollout.schedule: continuous"):
        group_collector(params(**{"train.refill_dropped_groups": True, "rollout.schedule": "turn-synchronous"}))
    with pytest.raises(ConfigError, match="train.refill_dropped_groups needs train.algorithm.dynamic_sampling"):
        params(**{"train.refill_dropped_groups": True, "train.algorithm.dynamic_sampling": False})
