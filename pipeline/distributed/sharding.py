"""Rollouts and training rows spread over ranks, groups kept whole.

A group's advantages are relative to its own members, so a group never straddles ranks.
`assign_groups` balances the ranks' policy tokens greedily (largest group first, to the
least-loaded rank); every rank computes the same assignment from the same inputs.

`ShardedRollouts` (wrapping this rank's `RolloutEngine`, not extending it) samples only this rank's
problems, then all-gathers the groups, so every rank sees the whole batch in the original order:
scoring, dynamic sampling and the stream cursor stay in lock-step across ranks without any change
to the training step. Each rank's engine has the run's seed and counts every rollout, and it is given its
problems' places in the batch (`keys`), so a problem's trajectories are the ones one process would sample.
A
refilled rollout (`refilled_rollout`) is given a window of problems: each rank starts its share
of the window's head and refills from its share of the rest, with no collective until the end.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections import Counter
from collections.abc import Callable

import torch.distributed as dist

from pipeline.rollout.engine import Refill, RolloutEngine, RolloutResult
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


def window_shares(target: int, size: int, rank: int, world: int) -> tuple[list[int], list[int]]:
    """A refilled step's window of `size` problems: the ones this rank starts (its round-robin share of
    the first `target`) and its reserve (its round-robin share of the rest, in order, among the ranks
    that start any: a rank with nothing running has no group to replace)."""
    active = min(target, world)
    reserve = problem_shard(size - target, rank, active) if rank < active else []
    return problem_shard(target, rank, world), [target + i for i in reserve]


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


@dataclass(frozen=True)
class ShardedRollouts:
    """Rollouts on `engine` of this rank's share of the problems, returned with every rank's."""

    engine: RolloutEngine

    def rollout(self, problems: list[Problem], group_size: int, *, temperature: float | None = None,
                refill: Refill | None = None) -> RolloutResult:
        if refill is not None:
            raise ValueError("a sharded rollout refills through refilled_rollout (each rank from its own reserve)")
        mine = problem_shard(len(problems), dist.get_rank(), dist.get_world_size())
        local = self.engine.rollout([problems[i] for i in mine], group_size, temperature=temperature, keys=mine) \
            if mine else self._nothing_to_sample()
        return gathered_in_order(mine, local, len(problems))

    def refilled_rollout(self, window: list[Problem], target: int, group_size: int,
                         rank_refill: Callable[[int, list[Problem]], Refill]) -> RolloutResult:
        """Sample this rank's share of `window[:target]`, refilled (`rank_refill(its share, its reserve)`)
        from its round-robin share of `window[target:]`; every rank's groups, in window order."""
        mine, reserve = window_shares(target, len(window), dist.get_rank(), dist.get_world_size())
        refill = rank_refill(len(mine), [window[i] for i in reserve])
        # a refill draws its reserve in order: the k-th problem drawn is window[(mine + reserve)[k]]
        local = self.engine.rollout([window[i] for i in mine], group_size, refill=refill, keys=mine + reserve) \
            if mine else self._nothing_to_sample()
        drawn = (mine + reserve)[: len(local.groups)]
        return gathered_in_order(drawn, local, len(window))

    def _nothing_to_sample(self) -> RolloutResult:
        """Fewer problems than ranks: nothing sampled here, but the rollout counts, as on the ranks that sample
        (the count seeds the next rollout, which must seed alike everywhere)."""
        self.engine.rollouts_started += 1
        return EMPTY


EMPTY = RolloutResult([], RolloutStats(trajectories=0, wall_s=0.0, generator_busy_s=0.0, generator_idle_s=0.0,
                                       policy_tokens=0))  # fewer problems than ranks: nothing sampled here


def gathered_in_order(indices: list[int], local: RolloutResult, size: int) -> RolloutResult:
    """Collective: every rank's groups (group j of a rank is problem `indices[j]` of `size`), in problem
    order, with the merged statistics."""
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (indices, local.groups, local.stats))
    groups: list = [None] * size
    for rank_indices, part, _ in everyone:
        for i, g in zip(rank_indices, part, strict=True):
            groups[i] = g
    return RolloutResult([g for g in groups if g is not None], merge_stats([stats for _, _, stats in everyone]))


def rank_rows(batch: TrainBatch, rows: list[int]) -> TrainBatch:
    """Rows of a batch for one rank, with *this rank's* policy-token count (the ranks' counts sum to the global one)."""
    part = batch.select(rows)
    return dataclasses.replace(part, n_policy_tokens=int(part.loss_mask_BT.sum()))
