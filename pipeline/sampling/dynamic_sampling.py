"""A step's groups: sampled with tools, scored by the rule-based rewards, and filtered by DAPO's
dynamic sampling, in generation rounds or by refilling the running rollout.

DAPO's dynamic sampling over-samples and drops the groups that carry no signal, in rounds: by default
a group whose trajectories are all correct or all wrong (`0 < #correct < G` keeps it, DAPO's and verl's
`filter_groups.metric: acc`), not one whose totals merely differ; the test (`train.algorithm.filter_metric`,
TEPO's tool-level signal included: `pipeline.rl.advantage`) is resolved once at set-up as `Trainer.informative`
and the rounds, the refill and the sharded refill all apply that one function. Each
round samples the problems still missing and ends with its slowest row. Where a decoding
step costs about as much for a few rows as for a full batch (a small model on CPU, or any
latency-bound decoder: benchmarks/RESULTS.md, rollout), a second round pays that tail again.
`collect_with_refill` departs from it: the moment a group is dropped, the next problem of the
stream joins the *running* rollout, so its rows decode beside the first round's longest rows.
Both draw problems in stream order and stop drawing as soon as the kept groups plus the groups
still running reach `prompts_per_step`; the rounds cap rounds (`max_gen_rounds`), the refill
caps the problems drawn (`prompts_per_step x max_gen_rounds`). A refill needs the continuous schedule.

Under data parallelism (`collect_with_sharded_refill`) ranks cannot share one lazily read stream
without a collective per dropped group, so every rank takes the step's whole window of
`prompts_per_step x max_gen_rounds` problems, samples its round-robin share of the first
`prompts_per_step`, and refills from its own share of the rest; the window's unused problems are
skipped, as verl skips the surplus of an oversampled generation batch.

A group that read a tool-service outage (`pipeline.tools.outages`) is never kept: it is dropped as an
uninformative group is (and replaced the same way), but not anchored, and every collector checks
the step's outages (`OutageGuard`) before it hands the batch on, raising `ToolOutage` past the limits.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from pipeline.rl.advantage import GroupFilter
from pipeline.config import RunConfig
from pipeline.tools.outages import OutageGuard, has_outage
from pipeline.reward import score_trajectory
from pipeline.rollout.metrics import RolloutStats
from pipeline.rl.tepo import Tepo
from pipeline.types import Collected, Group, Problem, ScoredGroup

if TYPE_CHECKING:
    from pipeline.session import Trainer


def score_group(group: Group, cfg: RunConfig, tepo: Tepo) -> ScoredGroup:
    """Rule-based rewards, then the configured TEPO variant's (sparse reshapes them; off and dense keep them)."""
    rewards = tuple(
        tepo.shape(score_trajectory(group.problem, t, cfg.reward, protocol=cfg.rollout.protocol,
                                       max_policy_tokens=cfg.rollout.max_policy_tokens), t)
        for t in group.trajectories
    )
    return ScoredGroup(group, rewards)


def collect_in_rounds(tr: Trainer) -> Collected:
    """Sample, score and (DAPO) keep informative groups until the batch is full or rounds run out."""
    tc = tr.cfg.train
    kept: list[ScoredGroup] = []
    seen: list[ScoredGroup] = []
    dropped: list[ScoredGroup] = []
    rounds: list[RolloutStats] = []
    for _ in range(tc.max_gen_rounds):
        result = tr.engine.rollout(tr.stream.take(tc.prompts_per_step - len(kept)), tr.cfg.rollout.group_size)
        scored = [score_group(g, tr.cfg, tr.tepo) for g in result.groups]
        seen += scored
        for g in scored:
            if not has_outage(g):  # an outage group is neither trained on nor anchored
                (kept if tr.informative(g) else dropped).append(g)  # keeps all without dynamic sampling
        rounds.append(result.stats)
        if len(kept) >= tc.prompts_per_step:
            break
    metrics = step_metrics(seen, kept, rounds) | {"train/generation_rounds": len(rounds)}
    return checked_for_outages(tr, Collected(kept, seen, metrics, dropped))


def checked_for_outages(tr: Trainer, collected: Collected) -> Collected:
    """The step's outage metrics added; raises `ToolOutage` (before any training) past the configured shares."""
    if tr.outages is None:
        tr.outages = OutageGuard(tr.cfg.train.max_step_outage_share, tr.cfg.train.max_run_outage_share)
    outage_metrics = tr.outages.check(collected.seen, f"step {tr.state.step}")
    collected.metrics.update(outage_metrics)
    if outage_metrics["train/outage_dropped_groups"]:
        failing = {k.split("/", 1)[1]: int(v) for k, v in outage_metrics.items() if k.startswith("tool_outages/") and v}
        print(f"warning: step {tr.state.step}: {int(outage_metrics['train/outage_dropped_groups'])} group(s) read a "
              f"tool-service outage and are not trained on (failed calls: {failing})", file=sys.stderr, flush=True)
    return collected


@dataclasses.dataclass
class RefillRule:
    """The refill callback: each finished group is scored once; when one is dropped and the groups kept
    or still running cannot fill `target`, the next problem `draw` gives starts (none once `cap` problems
    have started). `keep` is the step's filter (`Trainer.informative`), the same as the rounds apply."""

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


def collect_with_refill(tr: Trainer) -> Collected:
    """One rollout that replaces each dropped group with the stream's next problem while it runs."""
    tc = tr.cfg.train
    rule = RefillRule(tc.prompts_per_step, tc.prompts_per_step * tc.max_gen_rounds, lambda: tr.stream.take(1),
                      lambda g: score_group(g, tr.cfg, tr.tepo), tr.informative)
    result = tr.engine.rollout(tr.stream.take(rule.target), tr.cfg.rollout.group_size, refill=rule)
    return checked_for_outages(tr, kept_and_dropped(rule.scored(result.groups), result.stats, tr.informative))


def collect_with_sharded_refill(tr: Trainer) -> Collected:
    """`collect_with_refill` across data-parallel ranks: the step's window of problems is taken whole
    (the same on every rank), each rank refills from its own share of the window's reserve, and the
    groups come back from every rank in window order."""
    tc = tr.cfg.train
    window = tr.stream.take(tc.prompts_per_step * tc.max_gen_rounds)  # the unused part is skipped

    def rank_rule(target: int, reserve: list[Problem]) -> RefillRule:
        spare = list(reversed(reserve))
        return RefillRule(target, target + len(reserve), lambda: [spare.pop()],
                          lambda g: score_group(g, tr.cfg, tr.tepo), tr.informative)

    result = tr.engine.refilled_rollout(window, tc.prompts_per_step, tr.cfg.rollout.group_size, rank_rule)
    # scored again here: every group, this rank's too, comes back from the all-gather as a new object, so the
    # rules' scores (keyed by object) do not carry over; scoring is cheap next to sampling
    collected = kept_and_dropped([score_group(g, tr.cfg, tr.tepo) for g in result.groups], result.stats,
                                 tr.informative)
    collected.metrics["train/problems_skipped"] = float(len(window) - len(result.groups))
    return checked_for_outages(tr, collected)


def kept_and_dropped(seen: list[ScoredGroup], stats: RolloutStats, keep: GroupFilter) -> Collected:
    clean = [g for g in seen if not has_outage(g)]  # an outage group is neither trained on nor anchored
    verdicts = [keep(g) for g in clean]
    kept = [g for g, k in zip(clean, verdicts, strict=True) if k]
    dropped = [g for g, k in zip(clean, verdicts, strict=True) if not k]
    return Collected(kept, seen, step_metrics(seen, kept, [stats]), dropped)


def group_collector(cfg: RunConfig) -> Callable[[Trainer], Collected]:
    """The step's sampling, chosen once at set-up (`train.refill_dropped_groups`)."""
    if not cfg.train.refill_dropped_groups:
        return collect_in_rounds
    if cfg.rollout.schedule != "continuous":
        raise ValueError("train.refill_dropped_groups needs rollout.schedule: continuous")
    return collect_with_sharded_refill if cfg.distributed.enabled else collect_with_refill


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
