"""The KL anchor on the openings of dropped groups (`pipeline.rl.anchor`): what an opening keeps, that it
trains the KL term alone (no gradient while the policy equals the reference, a pull when it does not),
its config check, and its wiring into the training loop."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.rl.advantage import group_advantages, group_filter, token_advantages
from pipeline.rl.anchor import dropped_openings, opening, step_openings
from pipeline.trainer.batching import make_train_batch
from pipeline.config.reward import TepoDense, TepoOff, TepoSparse
from tests.helpers.tepo import variant
from pipeline.config.train import DAPOLoss, GRPOLoss, SamplingSection, TrainConfig
from pipeline.rl.loss import make_policy_loss
from pipeline.trainer.reference import FrozenReference
from pipeline.train import run
from pipeline.types import Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, ToolResult, Trajectory
from pipeline.trainer.update import UpdateSettings, policy_gradient_step
from tests.helpers.tiny import tiny_llama
from tests.train.test_learning import read_history
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = pytest.mark.integration  # training runs

VOCAB = 64
PROBLEM = Problem("fact-1", "q", ("a",), "fact", "nq_open", "train")


def searching_trajectory(seed: int) -> Trajectory:
    """Prompt of 6 tokens; 3 sampled tokens, a 4-token tool output (mask 0), 5 sampled tokens."""
    rng = np.random.default_rng(seed)
    mask = (1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1)
    response = tuple(int(x) for x in rng.integers(3, VOCAB, len(mask)))
    logprobs = tuple(float(-rng.uniform(0.5, 3.0)) * m for m in mask)
    call = ToolCall("search", "q", ToolResult("passages", True), (0, 3), (3, 7))
    # as the rollout records them: an entropy at each sampled token, None at the tool's
    return Trajectory(PROBLEM.id, (1, 2, 3, 4, 5, 6), response, mask, logprobs, (call,), "answer", "text", 2,
                      entropies=tuple(0.5 if m else None for m in mask))


def scored(rewards: list[float], seed: int) -> ScoredGroup:
    trajectories = tuple(searching_trajectory(seed + i) for i in range(len(rewards)))
    return ScoredGroup(Group(PROBLEM, trajectories),
                       tuple(RewardBreakdown(True, r, 0.0, 0.0, total=r) for r in rewards))


def test_an_opening_is_the_first_tokens_without_tool_calls() -> None:
    t = searching_trajectory(0)
    cut = opening(t, 5)
    assert cut.prompt_ids == t.prompt_ids
    assert cut.response_ids == t.response_ids[:5] and cut.loss_mask == (1, 1, 1, 0, 0)  # output stays masked
    assert cut.logprobs == t.logprobs[:5] and cut.entropies == t.entropies[:5]
    assert cut.tool_calls == () and cut.finish_reason == "max_tokens"
    assert opening(t, 100) == dataclasses.replace(t, tool_calls=(), turns=1)  # a shorter response: all of it
    with pytest.raises(ValueError, match="n_tokens"):
        opening(t, 0)


def test_only_dropped_groups_are_cut_and_only_when_something_was_kept() -> None:
    kept, dropped = [scored([1.0, 0.0], 0)], [scored([0.0, 0.0], 10)]
    openings = step_openings(kept, dropped, 4)
    assert len(openings) == 1
    assert [len(t.response_ids) for t in openings[0].group.trajectories] == [4, 4]
    assert openings[0].rewards == dropped[0].rewards
    assert step_openings(kept, dropped, 0) == []  # the anchor is off
    assert step_openings([], dropped, 4) == []  # no informative group: no update, as without the anchor
    assert dropped_openings(dropped, 0) == []


def wrong_of_lengths(lengths: list[float], seed: int) -> ScoredGroup:
    """All wrong (accuracy 0), totals differing only by the overlong penalty: dropped by DAPO's filter."""
    trajectories = tuple(searching_trajectory(seed + i) for i in range(len(lengths)))
    return ScoredGroup(Group(PROBLEM, trajectories),
                       tuple(RewardBreakdown(True, 0.0, 0.0, x, total=x) for x in lengths))


@pytest.mark.parametrize("tepo", [variant(TepoOff()), variant(TepoDense())])
@pytest.mark.parametrize("dropped", [[0.1, 0.1, 0.1], [0.0, 0.0, -0.0625]])
def test_an_opening_has_zero_advantage(tepo, dropped) -> None:
    """Whatever the dropped group's totals: under the accuracy metric they may differ (length penalty)."""
    kept = [scored([1.0, 0.0], 0)]
    group = wrong_of_lengths(dropped, 10)
    keep = group_filter(DAPOLoss(), tepo)
    assert not keep(group)
    groups = kept + step_openings(kept, [group], 6)
    advantages = token_advantages(groups, DAPOLoss(), tepo, keep)
    assert all(np.all(a == 0.0) for a in advantages[2:]) and np.abs(advantages[0]).sum() > 0


@st.composite
def rollout(draw, seed: int) -> Trajectory:
    """A trajectory as the rollout records it: sampled runs (entropy, log-prob) between tool outputs (mask 0,
    no entropy), each output recorded as its call's span."""
    mask, calls, entropies = [], [], []
    for _ in range(draw(st.integers(0, 2))):
        start = len(mask)
        sampled = draw(st.integers(1, 4))
        output = draw(st.integers(1, 4))
        mask += [1] * sampled + [0] * output
        calls.append(ToolCall("search", "q", ToolResult("p", True), (start, start + sampled),
                              (start + sampled, start + sampled + output)))
    mask += [1] * draw(st.integers(1, 4))
    entropies = [draw(st.floats(0.0, 5.0)) if m else None for m in mask]
    response = tuple(3 + (seed + i) % (VOCAB - 3) for i in range(len(mask)))
    logprobs = tuple(-0.5 * m for m in mask)
    return Trajectory(PROBLEM.id, (1, 2, 3), response, tuple(mask), logprobs, tuple(calls), "answer", "text",
                      len(calls) + 1, entropies=tuple(entropies))


@st.composite
def scored_groups(draw) -> list[ScoredGroup]:
    groups = []
    for k in range(draw(st.integers(2, 5))):
        size = draw(st.integers(2, 4))
        trajectories = tuple(draw(rollout(10 * k + i)) for i in range(size))
        accuracies = [draw(st.sampled_from([0.0, 1.0])) for _ in range(size)]
        rewards = tuple(RewardBreakdown(True, a, 0.0, 0.0, entropy=-a * draw(st.sampled_from([0.0, 0.5])),
                                        total=a) for a in accuracies)
        groups.append(ScoredGroup(Group(PROBLEM, trajectories), rewards))
    return groups


@pytest.mark.parametrize("tepo", [TepoOff(), TepoSparse(), TepoDense()], ids=["off", "sparse", "dense"])
@settings(max_examples=60, deadline=None)
@given(groups=scored_groups(), n_tokens=st.integers(1, 12))
def test_openings_train_nothing_but_the_kl_under_every_tepo_variant(tepo, groups: list[ScoredGroup],
                                                                     n_tokens: int) -> None:
    """Whatever an opening's cut holds (tool output included), it gets zero advantage and leaves the kept
    groups' advantages as they were: TEPO dense once judged openings again, and the output tokens inside the cut
    (no entropy, no longer in any call's span) failed the step."""
    resolved = variant(tepo)
    keep = group_filter(DAPOLoss(), resolved)
    kept = [g for g in groups if keep(g)]
    dropped = [g for g in groups if not keep(g)]
    openings = step_openings(kept, dropped, n_tokens)
    alone = token_advantages(kept, DAPOLoss(), resolved, keep)
    together = token_advantages(kept + openings, DAPOLoss(), resolved, keep)
    n_kept = sum(len(g.group.trajectories) for g in kept)
    assert all(np.array_equal(a, b) for a, b in zip(alone, together[:n_kept], strict=True))
    assert all(np.all(a == 0.0) for a in together[n_kept:])
    assert len(together) - n_kept == sum(len(g.group.trajectories) for g in openings)


def test_equal_rewards_give_exactly_zero_advantages() -> None:
    # 0.1 three times: the float mean is not exactly 0.1, which used to leave ~1e-11 after the std division
    assert np.all(group_advantages(np.full(3, 0.1), std_normalize=True) == 0.0)
    assert np.all(group_advantages(np.full(3, 0.1), std_normalize=False) == 0.0)
    half = 0.5 / np.sqrt(0.5)  # (r - mean) / unbiased std: std of [1, 0] with ddof 1 is sqrt(1/2)
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0.0]), std_normalize=True), [half, -half], atol=1e-5)


def step_gradient(groups: list[ScoredGroup], reference_seed: int) -> tuple[torch.Tensor, int]:
    """The gradient of one DAPO + KL step of a fixed float64 tiny policy on `groups`, and the batch's token count."""
    algo = DAPOLoss(kl_coef=0.5)
    batch = make_train_batch(groups, token_advantages(groups, algo, variant(TepoOff()), group_filter(algo, variant(TepoOff()))), pad_id=0)
    batch = dataclasses.replace(batch, old_logprobs_BT=batch.old_logprobs_BT.double(),  # float64 throughout
                                loss_mask_BT=batch.loss_mask_BT.double(), advantages_BT=batch.advantages_BT.double())
    settings = UpdateSettings(4, 1e9, 1.0)
    batch = FrozenReference(tiny_llama(VOCAB, seed=reference_seed, dtype=torch.float64)).attach(batch, settings)
    model = tiny_llama(VOCAB, seed=1, dtype=torch.float64)
    policy_gradient_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, make_policy_loss(algo), settings)
    return torch.cat([p.grad.flatten() for p in model.parameters()]), batch.n_policy_tokens


def test_openings_train_the_kl_term_alone() -> None:
    kept, dropped = [scored([1.0, 0.0], 0)], [scored([0.0, 0.0], 10)]
    alone, n_kept = step_gradient(kept, reference_seed=1)
    anchored, n_all = step_gradient(kept + step_openings(kept, dropped, 6), reference_seed=1)
    assert n_all == n_kept + 2 * 3  # each opening's 3 sampled tokens (the tool output inside the cut is masked)
    # Reference == policy: an opening adds no gradient (zero advantage, KL at its minimum), only tokens to the
    # denominator (DAPO's token mean over the batch). Not to 1e-12: the attention softmax runs in float32 even
    # in a float64 model (transformers' eager attention), so scaling the loss by 1/22 rounds at ~1e-7.
    torch.testing.assert_close(anchored * n_all, alone * n_kept, atol=1e-6, rtol=0)
    # A policy that has moved away from the reference: the openings pull it back.
    alone, _ = step_gradient(kept, reference_seed=2)
    anchored, _ = step_gradient(kept + step_openings(kept, dropped, 6), reference_seed=2)
    assert float((anchored * n_all - alone * n_kept).norm()) > 1e-3


def test_the_anchor_needs_a_kl_term_and_dynamic_sampling() -> None:
    assert TrainConfig(sampling=SamplingSection(anchor_dropped_tokens=32), algorithm=DAPOLoss(kl_coef=0.2)).sampling.anchor_dropped_tokens == 32
    for algo in (DAPOLoss(), DAPOLoss(kl_coef=0.2, dynamic_sampling=False), GRPOLoss(kl_coef=0.1)):
        with pytest.raises(ValueError, match="train.sampling.anchor_dropped_tokens"):
            TrainConfig(sampling=SamplingSection(anchor_dropped_tokens=32), algorithm=algo)


def test_a_run_trains_on_the_openings_of_dropped_groups(tmp_path: Path) -> None:
    """Tool-free toy run, groups of 2 on a coin flip: about half the groups agree and are dropped."""
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, group_size=2, steps=4, checkpoints__every=4, prompts_per_step=4,
                     anchor_dropped_tokens=3, **{"algorithm.kl_coef": 0.1})
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"max_tool_calls": 0})})
    run(cfg, {}, metrics_dir=tmp_path / "metrics")
    history = read_history(tmp_path / "metrics" / "train_history.jsonl")
    for step in history.values():
        dropped = round(4 * (1 - step["train/kept_group_fraction"]))  # one generation round of 4 groups
        expected = 0 if step["train/skipped"] else dropped
        assert step["train/anchored_groups"] == expected, step
    assert sum(step["train/anchored_groups"] for step in history.values()) > 0
