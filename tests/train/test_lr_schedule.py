"""The learning rate over a run: warm-up, then constant, linear or cosine decay to a floor."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipeline.config import ConfigError
from pipeline.trainer.lr_schedule import lr_multiplier
from pipeline.train import set_up, update
from tests.helpers.training import collect_batch
from tests.train.toy_task import build_direct_model, toy_config


def test_constant_is_the_warm_up_then_the_peak() -> None:
    f = lr_multiplier("constant", warmup_steps=3, total_steps=10, min_ratio=0.5)
    assert [f(s) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert lr_multiplier("constant", 0, 10, 0.0)(0) == 1.0


def test_linear_and_cosine_decay_by_hand() -> None:
    # 2 warm-up updates, then 4 updates of decay from 1.0 towards a floor of 0.2
    linear = lr_multiplier("linear", warmup_steps=2, total_steps=6, min_ratio=0.2)
    assert [linear(s) for s in range(8)] == pytest.approx([1 / 3, 2 / 3, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    cosine = lr_multiplier("cosine", warmup_steps=0, total_steps=4, min_ratio=0.0)
    halves = [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert [cosine(s) for s in range(4)] == pytest.approx(halves)  # 1.0, 0.854, 0.5, 0.146: the last update trains
    assert cosine(4) == pytest.approx(0.0) and cosine(99) == pytest.approx(0.0)


def test_an_unknown_decay_names_the_key() -> None:
    with pytest.raises(ValueError, match="train.optimizer.lr_decay"):
        lr_multiplier("exponential", 0, 10, 0.0)  # type: ignore[arg-type]


def test_the_trainer_builds_the_configured_schedule_and_a_restored_one_continues(tmp_path: Path) -> None:
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, steps=4, warmup_steps=1, lr_decay="cosine", min_lr_ratio=0.1, lr=1e-3)
    tr = set_up(cfg, {})
    expected = lr_multiplier("cosine", 1, 4, 0.1)
    seen = []
    for s in range(5):
        seen.append(tr.scheduler.get_last_lr()[0])
        tr.replicas.optimizer.step()
        tr.scheduler.step()
        if s == 1:
            saved = tr.scheduler.state_dict()
    assert seen == pytest.approx([1e-3 * expected(s) for s in range(5)])
    assert seen[1] == pytest.approx(1e-3) and seen[4] == pytest.approx(1e-4)

    restored = set_up(toy_config(tmp_path / "again", model_dir, steps=4, warmup_steps=1, lr_decay="cosine",
                                 min_lr_ratio=0.1, lr=1e-3), {})
    restored.scheduler.load_state_dict(saved)
    assert restored.scheduler.get_last_lr()[0] == pytest.approx(seen[2])


def test_the_config_rejects_an_unknown_decay(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="params.yaml: train.optimizer.lr_decay: Input should be 'constant', 'linear' or 'cosine'"):
        toy_config(tmp_path, tmp_path, lr_decay="step")
    with pytest.raises(ConfigError, match="train.optimizer.min_lr_ratio"):
        toy_config(tmp_path, tmp_path, min_lr_ratio=1.5)


def test_the_logged_rate_is_the_rate_each_step_stepped_with(tmp_path: Path) -> None:
    """`train/lr` of a step is the rate its optimiser steps used (it was the next step's: one step ahead)."""
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, steps=4, warmup_steps=2, lr_decay="linear", min_lr_ratio=0.1, lr=1e-3,
                     ppo_epochs=2)
    tr = set_up(cfg, {})
    used: list[float] = []
    tr.replicas.optimizer.register_step_pre_hook(lambda opt, *_: used.append(opt.param_groups[0]["lr"]))
    expected, updates = lr_multiplier("linear", 2, 4, 0.1), 0
    try:
        for _ in range(4):
            kept, _ = collect_batch(tr)
            used.clear()
            logged = update(tr, kept)
            if logged["train/skipped"]:  # no informative group: no optimiser step, the schedule stays
                continue
            assert len(used) == 2 and set(used) == {logged["train/lr"]}
            assert logged["train/lr"] == pytest.approx(1e-3 * expected(updates))
            updates += 1
    finally:
        tr.engine.close()
    assert updates >= 2
