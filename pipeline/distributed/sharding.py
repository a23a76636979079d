"""Rollouts and training rows spread over ranks, groups kept whole.

A group's advantages are relative to its own members, so a group never straddles ranks.
`assign_groups` balances the ranks' policy tokens greedily (largest group first, to the
least-loaded rank); every rank computes the same assignment from the same inputs.

`ShardedRolloutEngine` samples only this rank's problems, then all-gathers the groups, so
every rank sees the whole batch in the original order: scoring, dynamic sampling and the
stream cursor stay in lock-step across ranks without any change to the training loop.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch.distributed as dist

from pipeline.rollout.engine import RolloutEngine, RolloutResult
from pipeline.rollout.metrics import RolloutStats
from pipeline.types import Problem, TrainBatch


def assign_groups(costs: list[float], world: int) -> list[list[int]]:
    """Group indices per rank; each group on exactly one rank; ranks' cost sums balanced."""
    load = [0.0] * world
    shards: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        shards[r].append(i)
        load[r] += costs[i]
    return [sorted(s) for s in shards]


def problem_shard(n_problems: int, rank: int, world: int) -> list[int]:
    """Problems this rank samples: round-robin (each problem's whole group on one rank)."""
    return list(range(rank, n_problems, world))


def merge_stats(parts: list[RolloutStats]) -> RolloutStats:
    """Totals add up; wall time is the slowest rank's; latency percentiles are the worst rank's."""
    n = sum(p.trajectories for p in parts)
    tools = sorted({k for p in parts for k in p.calls_per_trajectory})

    def weighted_calls(tool: str) -> float:
        return sum(p.calls_per_trajectory.get(tool, 0.0) * p.trajectories for p in parts) / max(n, 1)

    def worst(attr: str) -> dict[str, float]:
        keys = {k for p in parts for k in getattr(p, attr)}
        return {k: max(getattr(p, attr)[k] for p in parts if k in getattr(p, attr)) for k in sorted(keys)}

    def added(attr: str) -> dict:
        total: Counter = Counter()
        for p in parts:
            total.update(getattr(p, attr))
        return dict(sorted(total.items()))

    return RolloutStats(
        trajectories=n, wall_s=max(p.wall_s for p in parts),
        generator_busy_s=sum(p.generator_busy_s for p in parts), generator_idle_s=sum(p.generator_idle_s for p in parts),
        policy_tokens=sum(p.policy_tokens for p in parts),
        calls_per_trajectory={t: weighted_calls(t) for t in tools}, tool_errors=added("tool_errors"),
        tool_latency_p50_s=worst("tool_latency_p50_s"), tool_latency_p95_s=worst("tool_latency_p95_s"),
        turns_histogram=added("turns_histogram"), finish_reasons=added("finish_reasons"),
        decode_steps=sum(p.decode_steps for p in parts), decode_rows=sum(p.decode_rows for p in parts),
    )


class ShardedRolloutEngine(RolloutEngine):
    """A `RolloutEngine` whose `rollout` samples this rank's share and returns everyone's."""

    def rollout(self, problems: list[Problem], n: int, *, temperature: float | None = None) -> RolloutResult:
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = problem_shard(len(problems), rank, world)
        if mine:
            local = super().rollout([problems[i] for i in mine], n, temperature=temperature)
        else:  # fewer problems than ranks: nothing to sample here this round
            local = RolloutResult([], RolloutStats(trajectories=0, wall_s=0.0, generator_busy_s=0.0,
                                                   generator_idle_s=0.0, policy_tokens=0))
        gathered: list = [None] * world
        dist.all_gather_object(gathered, (mine, local.groups, local.stats))
        groups: list = [None] * len(problems)
        for indices, part, _ in gathered:
            for i, g in zip(indices, part, strict=True):
                groups[i] = g
        return RolloutResult(groups, merge_stats([stats for _, _, stats in gathered]))



def rank_rows(batch: TrainBatch, rows: list[int]) -> TrainBatch:
    """Rows of a batch for one rank, with *this rank's* policy-token count (the ranks' counts sum to the global one)."""
    part = batch.select(rows)
    return dataclasses.replace(part, n_policy_tokens=int(part.loss_mask_BT.sum()))
