"""Dynamic sampling filters on what DAPO filters on (correctness by default), TEPO's tool-level signal
counts as signal, and every sampling path applies the one filter resolved at set-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.rl.advantage import (InformativeFilter, group_filter, is_informative, keep_every_group,
                                token_advantages)
from pipeline.config.reward import TepoDense, TepoOff, TepoSparse
from tests.helpers.tepo import variant
from pipeline.config.train import DAPOLoss, DrGRPOLoss, GRPOLoss
from pipeline.distributed.sharding import ShardedRollouts
from pipeline.sampling.dynamic_sampling import InRounds, Refilling, RefillRule, ShardedRefilling
from pipeline.train import set_up
from pipeline.types import Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, ToolResult, Trajectory
from tests.train.toy_task import build_direct_model, toy_config

CALC = Problem("c", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")
FACT = Problem("f", "Who?", ("Marie Curie",), "fact", "nq_open", "train")


def calling(entropies: tuple[float, ...] = (1.0,) * 4 + (0.0,) * 2 + (1.0,) * 4) -> Trajectory:
    """Segment 0: tokens 0-3 (the call), tool output 4-5 (mask 0), segment 1: tokens 6-9 (the answer)."""
    call = ToolCall("code", "print(6 * 7)", ToolResult("42", True), (0, 4), (4, 6))
    return Trajectory("p", (1,), tuple(range(10)), (1, 1, 1, 1, 0, 0, 1, 1, 1, 1), (-0.1,) * 10, (call,), "answer",
                      "text", 2, entropies)


REDUCING = (2.0,) * 4 + (None,) * 2 + (0.5,) * 4  # falls after the tool output (dH < 0); none recorded there
RAISING = (0.5,) * 4 + (None,) * 2 + (2.0,) * 4


def group_of(problem: Problem, accuracies, lengths=None, entropies=None, tepo_terms=None) -> ScoredGroup:
    n = len(accuracies)
    lengths = lengths or [0.0] * n
    tepo_terms = tepo_terms or [0.0] * n
    trajs = tuple(calling(e) for e in (entropies or [REDUCING] * n))
    rewards = tuple(RewardBreakdown(True, a, 0.0, x, entropy=e, total=a + x + e)
                    for a, x, e in zip(accuracies, lengths, tepo_terms, strict=True))
    return ScoredGroup(Group(problem, trajs), rewards)


def test_four_wrong_answers_of_different_lengths_are_dropped_by_default() -> None:
    """The issue's case: totals [0, 0, 0, -0.0625] (one ran 4 tokens into the overlong buffer)."""
    group = group_of(CALC, [0.0] * 4, lengths=[0.0, 0.0, 0.0, -0.0625])
    assert not is_informative(group)  # DAPO: 0 < #correct < G fails
    assert not group_filter(DAPOLoss(), variant(TepoOff()))(group)
    assert group_filter(DAPOLoss(filter_metric="total"), variant(TepoOff()))(group)  # the opt-in: totals differ
    mixed = group_of(CALC, [1.0, 0.0, 0.0, 0.0], lengths=[0.0, 0.0, 0.0, -0.0625])
    assert is_informative(mixed) and group_filter(DAPOLoss(filter_metric="total"), variant(TepoOff()))(mixed)


def test_a_fact_group_counts_by_correctness_not_by_partial_credit() -> None:
    """Levenshtein partial credit 1 - r counts as correct above 0.9; near misses alone are all wrong."""
    assert not is_informative(group_of(FACT, [0.6, 0.7, 0.8, 0.0]))
    assert not is_informative(group_of(FACT, [1.0, 0.95, 0.92, 1.0]))  # all correct
    assert is_informative(group_of(FACT, [0.95, 0.6, 0.0, 0.0]))
    assert is_informative(group_of(FACT, [0.6, 0.7, 0.8, 0.0]), metric="total")


def test_tepo_dense_keeps_an_all_correct_group_whose_calls_differ() -> None:
    """All correct: the outcome advantage is 0, but the tool-level advantages are +-1; one way and the other."""
    dense = variant(TepoDense(alpha=0.5))
    differ = group_of(CALC, [1.0] * 4, entropies=[REDUCING, RAISING, REDUCING, RAISING])
    alike = group_of(CALC, [1.0] * 4, entropies=[REDUCING] * 4)
    for metric in ("accuracy", "total"):
        keep = group_filter(DAPOLoss(filter_metric=metric), dense)
        assert keep(differ) and not keep(alike)
        advantages = token_advantages([differ, alike], DAPOLoss(), dense, keep)
        assert np.abs(np.concatenate(advantages[:4])).max() > 0.5  # the signal that is trained
        assert all(np.all(a == 0.0) for a in advantages[4:])
    assert not group_filter(DAPOLoss(), variant(TepoOff()))(differ)  # without TEPO there is no signal in it


def test_tepo_sparse_keeps_correct_answers_whose_entropy_terms_differ() -> None:
    group = group_of(CALC, [1.0] * 4, tepo_terms=[0.0, -0.5, 0.0, -1.0])
    assert group_filter(DAPOLoss(), variant(TepoSparse()))(group)
    assert not group_filter(DAPOLoss(), variant(TepoOff()))(group)


@st.composite
def random_groups(draw) -> ScoredGroup:
    n = draw(st.integers(2, 5))
    acc = draw(st.lists(st.sampled_from([0.0, 0.5, 0.95, 1.0]), min_size=n, max_size=n))
    lengths = draw(st.lists(st.sampled_from([0.0, -0.0625, -0.5]), min_size=n, max_size=n))
    ent = draw(st.lists(st.sampled_from([REDUCING, RAISING]), min_size=n, max_size=n))
    return group_of(CALC, acc, lengths=lengths, entropies=ent)


@settings(max_examples=150, deadline=None)
@given(random_groups(), st.sampled_from([variant(TepoOff()), variant(TepoDense(alpha=0.5))]),
       st.sampled_from([DAPOLoss(filter_metric="total"), GRPOLoss(dynamic_sampling=True, filter_metric="total"),
                        DrGRPOLoss(dynamic_sampling=True, filter_metric="total")]))
def test_under_the_total_metric_a_group_is_kept_iff_some_token_advantage_is_not_zero(group, tepo, algo) -> None:
    advantages = token_advantages([group], algo, tepo, keep_every_group)
    assert group_filter(algo, tepo)(group) == bool(np.abs(np.concatenate(advantages)).max() > 1e-9)


@settings(max_examples=150, deadline=None)
@given(random_groups(), st.sampled_from([variant(TepoOff()), variant(TepoSparse()), variant(TepoDense(alpha=0.5))]))
def test_under_the_accuracy_metric_a_kept_group_has_some_token_advantage(group, tepo) -> None:
    """A kept group is never one whose every token advantage is zero (it would only dilute the denominator)."""
    keep = group_filter(DAPOLoss(), tepo)
    advantages = token_advantages([group], DAPOLoss(), tepo, keep_every_group)
    assert not keep(group) or np.abs(np.concatenate(advantages)).max() > 1e-9


def test_tepo_sparse_under_torl_rewards_drops_a_group_whose_totals_agree() -> None:
    """ToRL's -1 for a wrong answer: a correct answer without an entropy-reducing call scores -1 as well."""
    group = group_of(CALC, [1.0, 0.0], tepo_terms=[-2.0, 0.0])
    group = ScoredGroup(group.group, tuple(dataclasses.replace(r, total=-1.0) for r in group.rewards))
    assert not group_filter(DAPOLoss(), variant(TepoSparse()))(group)


@settings(max_examples=150, deadline=None)
@given(random_groups(), st.sampled_from([variant(TepoOff()), variant(TepoDense(alpha=0.5))]), st.sampled_from(["accuracy", "total"]))
def test_a_dropped_group_has_zero_advantage_everywhere(group, tepo, metric) -> None:
    keep = group_filter(DAPOLoss(filter_metric=metric), tepo)
    advantages = token_advantages([group], DAPOLoss(), tepo, keep)
    assert keep(group) or all(np.all(a == 0.0) for a in advantages)


def test_without_dynamic_sampling_every_group_is_kept() -> None:
    assert group_filter(GRPOLoss(), variant(TepoOff())) is keep_every_group
    assert group_filter(DAPOLoss(dynamic_sampling=False), variant(TepoDense())) is keep_every_group
    assert group_filter(DrGRPOLoss(dynamic_sampling=True), variant(TepoOff())) == InformativeFilter("accuracy", variant(TepoOff()))


def test_the_refill_rule_applies_the_filter_it_is_given() -> None:
    wrong_lengths = group_of(CALC, [0.0] * 2, lengths=[0.0, -0.0625])
    for metric, refills in (("accuracy", 1), ("total", 0)):
        drawn: list[Problem] = []
        rule = RefillRule(1, 2, lambda: drawn.append(CALC) or [CALC], lambda g: wrong_lengths,
                          group_filter(DAPOLoss(filter_metric=metric), variant(TepoOff())))
        rule(wrong_lengths.group)
        assert len(drawn) == refills and rule.dropped == refills


def test_every_sampling_path_applies_the_trainer_filter(tmp_path: Path) -> None:
    """Rounds, refill and the sharded refill (one gloo rank) keep exactly what the set-up's filter keeps."""
    model_dir = build_direct_model(tmp_path / "model")
    consulted: list[ScoredGroup] = []

    def drop_all(group: ScoredGroup) -> bool:
        consulted.append(group)
        return False

    for refill, sampler in ((False, InRounds), (True, Refilling)):
        cfg = toy_config(tmp_path / str(refill), model_dir, group_size=2, prompts_per_step=2, max_gen_rounds=2,
                         refill_dropped_groups=refill, algorithm={"kind": "dapo", "filter_metric": "total"})
        tr = set_up(cfg, {})
        assert tr.keep == InformativeFilter("total", variant(TepoOff()))  # resolved once from the config
        assert type(tr.sampler) is sampler
        consulted.clear()
        collected = tr.sampler.collect(tr.rollouts, tr.stream, tr.reward, drop_all)
        assert collected.kept == [] and len(collected.dropped) == len(collected.seen) == 4
        assert len(consulted) >= len(collected.seen)
        if not refill:
            tr.engine.close()
    sharded = ShardedRollouts(tr.engine)  # the refill run's engine
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        consulted.clear()
        collected = ShardedRefilling(2, 2, 2).collect(sharded, tr.stream, tr.reward, drop_all)
        assert collected.kept == [] and len(collected.seen) == 4 and len(consulted) >= 4
    finally:
        dist.destroy_process_group()
        tr.engine.close()


@pytest.mark.parametrize("kind", ["dapo", "grpo", "dr_grpo"])
def test_the_filter_metric_is_a_typed_choice(kind: str) -> None:
    from pipeline.config import ConfigError, config_from_dict
    with pytest.raises(ConfigError, match="train.algorithm.*filter_metric"):
        config_from_dict({"train": {"algorithm": {"kind": kind, "filter_metric": "reward"}}})
