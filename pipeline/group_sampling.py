"""A step's groups: sampled with tools, scored by the rule-based rewards, and filtered by DAPO's
dynamic sampling, in generation rounds or by refilling the running rollout.

DAPO's dynamic sampling over-samples and drops the groups whose rewards all agree, in rounds:
each round samples the problems still missing and ends with its slowest row. Where a decoding
step costs about as much for a few rows as for a full batch (a small model on CPU, or any
latency-bound decoder: benchmarks/RESULTS.md, rollout), a second round pays that tail again.
`collect_with_refill` departs from it: the moment a group is dropped, the next problem of the
stream joins the *running* rollout, so its rows decode beside the first round's longest rows.
Both draw problems in stream order and stop drawing as soon as the kept groups plus the groups
still running reach `prompts_per_step`; the rounds cap rounds (`max_gen_rounds`), the refill
caps the problems drawn (`prompts_per_step x max_gen_rounds`). A refill is single-process and
needs the continuous schedule (each data-parallel rank samples its own share of a step).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pipeline.advantage import is_informative
from pipeline.config import RunConfig
from pipeline.reward import score_trajectory
from pipeline.rollout.metrics import RolloutStats
from pipeline.shaping import RewardShaping
from pipeline.types import Group, Problem, ScoredGroup

if TYPE_CHECKING:
    from pipeline.session import Trainer


@dataclasses.dataclass(frozen=True)
class Collected:
    """One step's rollout: the groups to train on, every group scored, and the rollout metrics."""

    kept: list[ScoredGroup]
    seen: list[ScoredGroup]  # kept or dropped by dynamic sampling (the sample tables draw from these)
    metrics: dict[str, float]
    dropped: list[ScoredGroup] = dataclasses.field(default_factory=list)  # seen, not kept (all rewards agree)


def score_group(group: Group, cfg: RunConfig, shaping: RewardShaping) -> ScoredGroup:
    """Rule-based rewards, then the configured shaping (TEPO sparse, or none)."""
    rewards = tuple(
        shaping.shape(score_trajectory(group.problem, t, cfg.reward, protocol=cfg.rollout.protocol,
                                       max_policy_tokens=cfg.rollout.max_policy_tokens), t)
        for t in group.trajectories
    )
    return ScoredGroup(group, rewards)


def collect_in_rounds(tr: Trainer) -> Collected:
    """Sample, score and (DAPO) keep informative groups until the batch is full or rounds run out."""
    tc, algo = tr.cfg.train, tr.cfg.train.algorithm
    kept: list[ScoredGroup] = []
    seen: list[ScoredGroup] = []
    dropped: list[ScoredGroup] = []
    rounds: list[RolloutStats] = []
    for _ in range(tc.max_gen_rounds):
        result = tr.engine.rollout(tr.stream.take(tc.prompts_per_step - len(kept)), tr.cfg.rollout.group_size)
        scored = [score_group(g, tr.cfg, tr.shaping) for g in result.groups]
        seen += scored
        for g in scored:
            (kept if is_informative(g) or not algo.dynamic_sampling else dropped).append(g)
        rounds.append(result.stats)
        if len(kept) >= tc.prompts_per_step:
            break
    return Collected(kept, seen, step_metrics(seen, kept, rounds) | {"train/generation_rounds": len(rounds)}, dropped)


def collect_with_refill(tr: Trainer) -> Collected:
    """One rollout that replaces each dropped group with the stream's next problem while it runs."""
    tc = tr.cfg.train
    target, cap = tc.prompts_per_step, tc.prompts_per_step * tc.max_gen_rounds
    scores: dict[int, ScoredGroup] = {}  # id(group) -> its score: each finished group is scored once
    drawn, n_dropped = target, 0

    def replace_if_dropped(group: Group) -> list[Problem]:
        nonlocal drawn, n_dropped
        scores[id(group)] = scored = score_group(group, tr.cfg, tr.shaping)
        if is_informative(scored):
            return []
        n_dropped += 1
        if drawn - n_dropped >= target or drawn >= cap:  # kept + still running can fill the batch, or the cap
            return []
        drawn += 1
        return tr.stream.take(1)

    result = tr.engine.rollout(tr.stream.take(target), tr.cfg.rollout.group_size, refill=replace_if_dropped)
    seen = [scores.get(id(g)) or score_group(g, tr.cfg, tr.shaping) for g in result.groups]
    kept = [g for g in seen if is_informative(g)]
    dropped = [g for g in seen if not is_informative(g)]
    return Collected(kept, seen, step_metrics(seen, kept, [result.stats]), dropped)


def group_collector(cfg: RunConfig) -> Callable[[Trainer], Collected]:
    """The step's sampling, chosen once at set-up (`train.refill_dropped_groups`)."""
    if not cfg.train.refill_dropped_groups:
        return collect_in_rounds
    if cfg.distributed.enabled:
        raise ValueError("train.refill_dropped_groups is single-process: with distributed.enabled each rank "
                         "samples its own share of a step's problems (set it false: generation rounds)")
    if cfg.rollout.schedule != "continuous":
        raise ValueError("train.refill_dropped_groups needs rollout.schedule: continuous")
    return collect_with_refill


def step_metrics(seen: list[ScoredGroup], kept: list[ScoredGroup], rollouts: list[RolloutStats]) -> dict[str, float]:
    return (RolloutStats.merge(rollouts).as_metrics() | reward_metrics(seen) | tool_choice_metrics(seen)
            | {"train/kept_group_fraction": len(kept) / len(seen), "train/problems_drawn": float(len(seen))})


def reward_metrics(groups: list[ScoredGroup]) -> dict[str, float]:
    rewards = [r for g in groups for r in g.rewards]
    out = {
        "reward/mean": float(np.mean([r.total for r in rewards])),
        "reward/std": float(np.std([r.total for r in rewards])),
        "reward/accuracy": float(np.mean([r.correct for r in rewards])),
        "reward/format_error_rate": float(np.mean([not r.format_ok for r in rewards])),
    }
    by_source: dict[str, list[bool]] = defaultdict(list)
    for g in groups:
        by_source[g.group.problem.source] += [r.correct for r in g.rewards]
    return out | {f"reward/accuracy/{s}": float(np.mean(v)) for s, v in by_source.items()}


def tool_choice_metrics(groups: list[ScoredGroup]) -> dict[str, float]:
    """`tool_choice/<source>/<tool>`: calls per trajectory of each tool on each problem source.

    The overall calls per trajectory hide the failure that matters in a tool mix: a policy that
    starts answering fact questions with code while keeping the total number of calls. Per source,
    that collapse shows on the step it begins."""
    calls: dict[tuple[str, str], list[int]] = defaultdict(list)
    tools = sorted({c.tool for g in groups for t in g.group.trajectories for c in t.tool_calls})
    for g in groups:
        for tool in tools:
            calls[g.group.problem.source, tool] += [t.calls_of(tool) for t in g.group.trajectories]
    return {f"tool_choice/{source}/{tool}": float(np.mean(v)) for (source, tool), v in calls.items()}
