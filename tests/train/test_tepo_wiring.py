"""TEPO in the trainer: entropies come from the rollout, sparse shapes the reward, dense the advantages."""

from __future__ import annotations

import numpy as np

from pipeline.rl.advantage import group_filter, token_advantages
from pipeline.config import RunConfig
from pipeline.config.reward import TepoDense, TepoOff, TepoSparse
from tests.helpers.tepo import variant
from pipeline.config.train import DAPOLoss
from pipeline.rl.tepo import tepo_variant
from pipeline.sampling.dynamic_sampling import group_reward
from pipeline.types import Group, Problem, RewardBreakdown, ScoredGroup, ToolCall, ToolResult, Trajectory

PROBLEM = Problem("p", "What is 6 * 7?", ("42",), "calculator", "calculator", "train")


def trajectory(entropies: list[float], answer: str) -> Trajectory:
    """Segment 0: tokens 0-3 (call), tool output 4-5, segment 1: tokens 6-9 (answer)."""
    text = f"<think>x</think><code>print(6 * 7)</code>\n<response>\n42\n</response>\n<answer>{answer}</answer>"
    call = ToolCall("code", "print(6 * 7)", ToolResult("42", True), (0, 4), (4, 6))
    mask = (1, 1, 1, 1, 0, 0, 1, 1, 1, 1)
    return Trajectory("p", (1,), tuple(range(10)), mask, (-0.1,) * 10, (call,), "answer", text, 2,
                      tuple(entropies))


LOW_AFTER = [2.0] * 4 + [0.0] * 2 + [0.5] * 4  # entropy drops after the tool output
HIGH_AFTER = [0.5] * 4 + [0.0] * 2 + [2.0] * 4


def cfg_with(tepo) -> RunConfig:
    base = RunConfig()
    return base.model_copy(update={"reward": base.reward.model_copy(update={"tepo": tepo})})


def scored_totals(group: Group, tepo) -> tuple[float, ...]:
    cfg = cfg_with(tepo)
    return group_reward(cfg.reward, cfg.rollout, tepo_variant(cfg.reward))(group).totals  # the variant set_up resolves


def test_sparse_tepo_keeps_reward_only_for_entropy_reducing_calls() -> None:
    group = Group(PROBLEM, (trajectory(LOW_AFTER, "42"), trajectory(HIGH_AFTER, "42")))
    off = scored_totals(group, TepoOff())
    sparse = scored_totals(group, TepoSparse())
    assert off[0] == off[1]
    assert sparse[0] == off[0]  # m/n = 1
    assert sparse[1] < off[1]  # m/n = 0: the outcome bonus is removed


def test_dense_tepo_leaves_the_reward_alone() -> None:
    """Dense TEPO shapes advantages only: scored rewards equal those with TEPO off."""
    group = Group(PROBLEM, (trajectory(LOW_AFTER, "42"), trajectory(HIGH_AFTER, "42"), trajectory(LOW_AFTER, "7")))
    assert scored_totals(group, TepoDense(alpha=0.5)) == scored_totals(group, TepoOff())


def test_dense_tepo_gives_the_call_segment_its_own_advantage() -> None:
    trajs = (trajectory(LOW_AFTER, "42"), trajectory(HIGH_AFTER, "42"), trajectory(LOW_AFTER, "7"))
    rewards = tuple(RewardBreakdown(True, acc, 0.0, 0.0, total=acc) for acc in (1.0, 1.0, 0.0))
    scored = [ScoredGroup(Group(PROBLEM, trajs), rewards)]
    plain = token_advantages(scored, DAPOLoss(), variant(TepoOff()), group_filter(DAPOLoss(), variant(TepoOff())))
    dense = token_advantages(scored, DAPOLoss(), variant(TepoDense(alpha=0.5)), group_filter(DAPOLoss(), variant(TepoDense(alpha=0.5))))
    for adv in plain:
        assert np.all(adv == adv[0])  # outcome broadcast
    # the final (answer) segment keeps the outcome advantage; the call segment differs
    np.testing.assert_allclose(dense[0][6:], plain[0][6:])
    assert dense[0][0] > dense[1][0]  # entropy-reducing call of a correct rollout beats a non-reducing one
    assert dense[0][0] > dense[2][0]  # ... and a wrong rollout's call


def test_tepo_lives_in_one_module() -> None:
    """Only the config defines TEPO's kinds and only `pipeline.rl.tepo` asks which one is configured."""
    from pipeline.paths import REPO_ROOT

    allowed = {"pipeline/config/reward.py", "pipeline/rl/tepo.py"}
    naming = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "pipeline").rglob("*.py")
                    if any(k in p.read_text() for k in ("TepoDense", "TepoSparse", "TepoOff")))
    assert set(naming) <= allowed, naming
