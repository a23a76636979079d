"""Several optimiser steps per rollout batch: `ppo_epochs` passes, each over `ppo_mini_batches`
mini-batches of whole groups, every mini-batch normalised by its own policy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.trainer.batching import mini_batch_groups
from pipeline.rl.loss import make_policy_loss
from pipeline.train import prepared_batch, set_up, update
from tests.helpers.training import collect_batch
from pipeline.trainer.update import UpdateSettings, policy_gradient_step
from tests.train.toy_task import build_direct_model, toy_config


def test_mini_batches_keep_groups_whole_and_in_order() -> None:
    groups = [f"g{i}" for i in range(5)]  # stand-ins: the split only slices the list
    assert mini_batch_groups(groups, 2) == [["g0", "g1", "g2"], ["g3", "g4"]]
    assert mini_batch_groups(groups, 3) == [["g0", "g1"], ["g2", "g3"], ["g4"]]
    assert mini_batch_groups(groups, 9) == [[g] for g in groups]  # never an empty mini-batch
    assert mini_batch_groups(groups, 1) == [groups]
    with pytest.raises(ValueError, match="n=0"):
        mini_batch_groups(groups, 0)


def test_openings_are_spread_over_the_mini_batches() -> None:
    kept, anchored = ["k0", "k1", "k2"], ["a0", "a1"]  # kept groups, dropped groups' openings (KL only)
    assert mini_batch_groups(kept, 2, anchored) == [["k0", "k1", "a0"], ["k2", "a1"]]
    assert mini_batch_groups(kept, 3, anchored) == [["k0", "a0"], ["k1", "a1"], ["k2"]]
    assert mini_batch_groups(kept, 1, anchored) == [kept + anchored]
    # Never a mini-batch of openings alone (an optimiser step on the KL term only): as many as there are kept groups.
    assert mini_batch_groups(["k0"], 2, anchored) == [["k0", "a0", "a1"]]
    with pytest.raises(ValueError, match="0 groups"):
        mini_batch_groups([], 2, anchored)


def adam_steps(optimizer: torch.optim.Optimizer) -> int:
    return int(next(iter(optimizer.state.values()))["step"])


def test_each_mini_batch_is_its_own_optimiser_step(tmp_path: Path) -> None:
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, prompts_per_step=3, max_gen_rounds=3, ppo_epochs=2, ppo_mini_batches=2)
    tr = set_up(cfg, {})
    kept, _ = collect_batch(tr)
    assert len(kept) == 3  # the coin flip makes informative groups: mini-batches of 2 and 1 groups
    initial = {n: p.detach().clone() for n, p in tr.replicas.model.named_parameters()}

    metrics = update(tr, kept)
    assert adam_steps(tr.replicas.optimizer) == 4  # 2 epochs x 2 mini-batches
    assert metrics["train/skipped"] == 0.0

    # The same updates written out: each mini-batch a separate step over its own tokens, the two
    # mini-batches in order, twice; old log-probs are those the rollout recorded.
    manual = set_up(toy_config(tmp_path / "manual", model_dir), {})
    assert all(torch.equal(p, initial[n]) for n, p in manual.replicas.model.named_parameters())
    halves = [prepared_batch(manual, groups)[0] for groups in (kept[:2], kept[2:])]
    assert halves[0].n_policy_tokens + halves[1].n_policy_tokens == sum(
        t.policy_token_count for g in kept for t in g.group.trajectories)
    settings = UpdateSettings(cfg.train.update.micro_batch_size, cfg.train.optimizer.grad_clip, cfg.rollout.temperature,
                              share_prefixes=True)
    for _ in range(2):
        for batch in halves:
            policy_gradient_step(manual.replicas.model, manual.replicas.optimizer, batch, make_policy_loss(cfg.train.algorithm), settings)
    for (name, ours), theirs in zip(tr.replicas.model.named_parameters(), manual.replicas.model.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-7, msg=name)
        assert not torch.equal(ours, initial[name]), name

    # One step over the whole batch lands elsewhere: the split is not a no-op.
    whole = set_up(toy_config(tmp_path / "whole", model_dir), {})
    update(whole, kept)
    assert adam_steps(whole.replicas.optimizer) == 1
    assert any(not torch.equal(a, b) for a, b in zip(tr.replicas.model.parameters(), whole.replicas.model.parameters(), strict=True))
    for t in (tr, manual, whole):
        t.engine.close()
