"""A step's groups: sampled with tools, scored by the rule-based rewards, and filtered by DAPO's
dynamic sampling, in generation rounds or by refilling the running rollout.

DAPO's dynamic sampling over-samples and drops the groups that carry no signal, in rounds: by default
a group whose trajectories are all correct or all wrong (`0 < #correct < G` keeps it, DAPO's and verl's
`filter_groups.metric: acc`), not one whose totals merely differ; the test (`train.algorithm.filter_metric`,
TEPO's tool-level signal included: `pipeline.rl.advantage.group_filter`) is resolved once at set-up and
every sampler applies that one function (`keep`). Each
round samples the problems still missing and ends with its slowest row. Where a decoding
step costs about as much for a few rows as for a full batch (a small model on CPU, or any
latency-bound decoder: benchmarks/RESULTS.md, rollout), a second round pays that tail again.
`Refilling` departs from it: the moment a group is dropped, the next problem of the
stream joins the *running* rollout, so its rows decode beside the first round's longest rows.
Both draw problems in stream order and stop drawing as soon as the kept groups plus the groups
still running reach `prompts_per_step`; the rounds cap rounds (`max_gen_rounds`), the refill
caps the problems drawn (`prompts_per_step x max_gen_rounds`). A refill needs the continuous schedule.

Under data parallelism (`ShardedRefilling`) ranks cannot share one lazily read stream
without a collective per dropped group, so every rank takes the step's whole window of
`prompts_per_step x max_gen_rounds` problems, samples its round-robin share of the first
`prompts_per_step`, and refills from its own share of the rest; the window's unused problems are
skipped, as verl skips the surplus of an oversampled generation batch.

A group that read a tool-service outage (`pipeline.tools.outages`) is never kept: it is dropped as an
uninformative group is (and replaced the same way), but not anchored; the training loop then checks
the step's outages (`outage_metrics`) before it trains, raising `ToolOutage` past the limits.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.train import SamplingSection
from pipeline.protocols import ToolProtocol, protocol_of
from pipeline.reward import RewardScorer
from pipeline.rl.advantage import GroupFilter
from pipeline.rl.tepo import Tepo, entropy_reducing_share
from pipeline.rollout.engine import Refill, RolloutResult
from pipeline.rollout.metrics import RolloutStats
from pipeline.sampling.problem_stream import ProblemStream
from pipeline.tools.outages import OutageGuard, has_outage
from pipeline.types import Collected, Group, Problem, ScoredGroup


@dataclass(frozen=True)
class GroupReward:
    """The training reward of a group: the rule-based rewards (`pipeline.reward`, one scorer built at set-up,
    its slow symbolic checks run concurrently), then TEPO's (sparse reshapes them; off and dense keep them)."""

    scorer: RewardScorer
    protocol: ToolProtocol
    max_policy_tokens: int
    tepo: Tepo

    def __call__(self, group: Group) -> ScoredGroup:
        rule = self.scorer.score_group(group, protocol=self.protocol, max_policy_tokens=self.max_policy_tokens)
        return ScoredGroup(group, tuple(self.tepo.shape(r, t) for r, t in zip(rule.rewards, group.trajectories,
                                                                             strict=True)))


def group_reward(reward: RewardConfig, rollout: RolloutConfig, tepo: Tepo) -> GroupReward:
    """The rules of `reward` over trajectories written in `rollout`'s protocol and budget, then `tepo`."""
    return GroupReward(RewardScorer(reward), protocol_of(rollout), rollout.max_policy_tokens, tepo)


class Rollouts(Protocol):
    """A `RolloutEngine`, or `pipeline.distributed.sharding.ShardedRollouts` over one."""

    def rollout(self, problems: list[Problem], group_size: int, *, temperature: float | None = None,
                refill: Refill | None = None) -> RolloutResult: ...


@runtime_checkable
class ShardRollouts(Protocol):
    """`pipeline.distributed.sharding.ShardedRollouts`: rollouts of a window shared out among the ranks."""

    def refilled_rollout(self, window: list[Problem], target: int, group_size: int,
                         rank_refill: Callable[[int, list[Problem]], Refill]) -> RolloutResult: ...


class Sampler(Protocol):
    def collect(self, rollouts: Rollouts, stream: ProblemStream, reward: GroupReward,
                keep: GroupFilter) -> Collected: ...


@dataclass(frozen=True)
class InRounds:
    """Sample, score and (DAPO) keep informative groups until the batch is full or rounds run out."""

    prompts_per_step: int
    max_gen_rounds: int
    group_size: int

    def collect(self, rollouts: Rollouts, stream: ProblemStream, reward: GroupReward, keep: GroupFilter) -> Collected:
        kept: list[ScoredGroup] = []
        seen: list[ScoredGroup] = []
        dropped: list[ScoredGroup] = []
        rounds: list[RolloutStats] = []
        for _ in range(self.max_gen_rounds):
            result = rollouts.rollout(stream.take(self.prompts_per_step - len(kept)), self.group_size)
            scored = [reward(g) for g in result.groups]
            seen += scored
            for g in scored:
                if not has_outage(g):  # an outage group is neither trained on nor anchored
                    (kept if keep(g) else dropped).append(g)  # keeps all without dynamic sampling
            rounds.append(result.stats)
            if len(kept) >= self.prompts_per_step:
                break
        return Collected(kept, seen, step_metrics(seen, kept, rounds) | {"train/generation_rounds": len(rounds)},
                         dropped)


@dataclass(frozen=True)
class Refilling:
    """One rollout that replaces each dropped group with the stream's next problem while it runs."""

    prompts_per_step: int
    max_gen_rounds: int
    group_size: int

    def collect(self, rollouts: Rollouts, stream: ProblemStream, reward: GroupReward, keep: GroupFilter) -> Collected:
        rule = RefillRule(self.prompts_per_step, self.prompts_per_step * self.max_gen_rounds, lambda: stream.take(1),
                          reward, keep)
        result = rollouts.rollout(stream.take(rule.target), self.group_size, refill=rule)
        return kept_and_dropped(rule.scored(result.groups), result.stats, keep)


@dataclass(frozen=True)
class ShardedRefilling:
    """`Refilling` across data-parallel ranks: the step's window of problems is taken whole (the same on
    every rank), each rank refills from its own share of the window's reserve, and the groups come back
    from every rank in window order (`ShardedRollouts.refilled_rollout`)."""

    prompts_per_step: int
    max_gen_rounds: int
    group_size: int

    def collect(self, rollouts: Rollouts, stream: ProblemStream, reward: GroupReward, keep: GroupFilter) -> Collected:
        window = stream.take(self.prompts_per_step * self.max_gen_rounds)  # the unused part is skipped

        def rank_rule(target: int, reserve: list[Problem]) -> RefillRule:
            spare = list(reversed(reserve))
            return RefillRule(target, target + len(reserve), lambda: [spare.pop()], reward, keep)

        if not isinstance(rollouts, ShardRollouts):
            raise TypeError("refilling per rank needs the rollouts shared out among the ranks, not "
                            f"{type(rollouts).__name__}")
        result = rollouts.refilled_rollout(window, self.prompts_per_step, self.group_size, rank_rule)
        # scored again here: every group, this rank's too, comes back from the all-gather as a new object, so the
        # rules' scores (keyed by object) do not carry over; scoring is cheap next to sampling
        collected = kept_and_dropped([reward(g) for g in result.groups], result.stats, keep)
        collected.metrics["train/problems_skipped"] = float(len(window) - len(result.groups))
        return collected


def sampler_for(sampling: SamplingSection, rollout: RolloutConfig, sharded: bool) -> Sampler:
    """The step's sampling, chosen once at set-up (`train.sampling.refill_dropped_groups`; `sharded`: under data
    parallelism, `distributed.enabled`)."""
    sizes = (sampling.prompts_per_step, sampling.max_gen_rounds, rollout.group_size)
    if not sampling.refill_dropped_groups:
        return InRounds(*sizes)
    if rollout.schedule != "continuous":
        raise ValueError("train.sampling.refill_dropped_groups needs rollout.schedule: continuous")
    return ShardedRefilling(*sizes) if sharded else Refilling(*sizes)


def outage_metrics(guard: OutageGuard, collected: Collected, step: int) -> dict[str, float]:
    """The step's outage metrics, with a warning when a group read one; raises `ToolOutage` (before any
    training) past the configured shares."""
    metrics = guard.check(collected.seen, f"step {step}")
    if metrics["train/outage_dropped_groups"]:
        failing = {k.split("/", 1)[1]: int(v) for k, v in metrics.items() if k.startswith("tool_outages/") and v}
        print(f"warning: step {step}: {int(metrics['train/outage_dropped_groups'])} group(s) read a "
              f"tool-service outage and are not trained on (failed calls: {failing})", file=sys.stderr, flush=True)
    return metrics


@dataclasses.dataclass
class RefillRule:
    """The refill callback: each finished group is scored once; when one is dropped and the groups kept
    or still running cannot fill `target`, the next problem `draw` gives starts (none once `cap` problems
    have started). `keep` is the step's filter, the same as the rounds apply."""

    target: int
    cap: int
    draw: Callable[[], list[Problem]]
    score: Callable[[Group], ScoredGroup]
    keep: GroupFilter
    started: int = dataclasses.field(init=False)  # problems started so far: the first `target`, then refills
    dropped: int = dataclasses.field(init=False, default=0)
    scores: dict[int, ScoredGroup] = dataclasses.field(init=False, default_factory=dict)  # id(group) -> score

    def __post_init__(self) -> None:
        self.started = self.target

    def __call__(self, group: Group) -> list[Problem]:
        self.scores[id(group)] = scored = self.score(group)
        if self.keep(scored) and not has_outage(scored):
            return []
        self.dropped += 1
        if self.started - self.dropped >= self.target or self.started >= self.cap:
            return []
        new = self.draw()
        self.started += len(new)
        return new

    def scored(self, groups: list[Group]) -> list[ScoredGroup]:
        return [self.scores.get(id(g)) or self.score(g) for g in groups]


def kept_and_dropped(seen: list[ScoredGroup], stats: RolloutStats, keep: GroupFilter) -> Collected:
    clean = [g for g in seen if not has_outage(g)]  # an outage group is neither trained on nor anchored
    verdicts = [keep(g) for g in clean]
    kept = [g for g, k in zip(clean, verdicts, strict=True) if k]
    dropped = [g for g, k in zip(clean, verdicts, strict=True) if not k]
    return Collected(kept, seen, step_metrics(seen, kept, [stats]), dropped)


def step_metrics(seen: list[ScoredGroup], kept: list[ScoredGroup], rollouts: list[RolloutStats]) -> dict[str, float]:
    share = entropy_reducing_share(t for g in seen for t in g.group.trajectories)
    return (RolloutStats.merge(rollouts).as_metrics() | reward_metrics(seen) | tool_choice_metrics(seen)
            | {"train/kept_group_fraction": len(kept) / len(seen), "train/problems_drawn": float(len(seen))}
            | ({} if share is None else {"rollout/entropy_reducing_call_share": share}))


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
