"""A rollout's numerics do not depend on when tool results arrive: under artificial random tool latency
(different in every run) the same seed gives bit-identical trajectories (tokens, log-probs, entropies).
Resume exactness with tools rests on this (tests/train/test_resume.py)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest
import torch

from pipeline.model import load_policy
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import ToolResult
from tests.train.toy_task import toy_config, toy_problems


class RandomLatencyCode:
    """The toy task's code tool (`print(6 * 7)` -> 42), answering after a random delay of up to `max_s`."""

    name = "code"

    def __init__(self, seed: int, max_s: float) -> None:
        self.rng, self.max_s = random.Random(seed), max_s

    async def __call__(self, code: str) -> ToolResult:
        await asyncio.sleep(self.rng.uniform(0.0, self.max_s))
        expr = code.strip().removeprefix("print(").removesuffix(")")
        if not set(expr) <= set("0123456789*+ "):
            return ToolResult.failure("NameError: name is not defined")
        return ToolResult(f"{eval(expr)}\n", ok=True, latency_s=0.0)  # noqa: S307 - digits and * + only

    async def aclose(self) -> None:
        pass


def sample(model_dir: Path, root: Path, latency_seed: int, schedule: str = "continuous", refill: bool = False,
           **rollout) -> list[tuple]:
    cfg = toy_config(root, model_dir, steps=1).rollout.model_copy(update={"schedule": schedule, **rollout})
    model, tokenizer = load_policy(model_dir)
    tool = RandomLatencyCode(latency_seed, max_s=0.03)
    extra = iter([toy_problems(4)[2:3], toy_problems(4)[3:4]])  # the first two groups to close each add one

    def add_problems(group) -> list:
        time.sleep(random.Random(latency_seed * 7 + len(group.trajectories)).uniform(0.0, 0.02))  # a slow scorer
        return next(extra, [])

    with RolloutEngine(model, tokenizer, {"code": tool}, cfg, seed=0) as engine:
        groups = engine.rollout(toy_problems(2), cfg.group_size, refill=add_problems if refill else None).groups
    if refill:
        assert len(groups) == 4
    return [(t.response_ids, t.logprobs, t.entropies, len(t.tool_calls)) for g in groups for t in g.trajectories]


@pytest.mark.parametrize("schedule", ["continuous", "turn-synchronous"])
def test_tool_latency_does_not_change_a_single_bit(toy_model: Path, tmp_path: Path, schedule: str) -> None:
    torch.set_num_threads(1)
    runs = [sample(toy_model, tmp_path / str(seed), seed, schedule, max_batch_sequences=6) for seed in range(3)]
    assert sum(calls for *_, calls in runs[0]) >= 8  # the tool path really runs, for most rows
    for other in runs[1:]:
        assert [r[0] for r in other] == [r[0] for r in runs[0]]
        assert [r[1] for r in other] == [r[1] for r in runs[0]]  # exactly: no tolerance
        assert [r[2] for r in other] == [r[2] for r in runs[0]]


def test_refilled_groups_join_at_steps_fixed_by_the_tokens(toy_model: Path, tmp_path: Path) -> None:
    """A refill's problems join the batch at a decoding step fixed when their group closed, however long the
    tools and the refill callback take."""
    torch.set_num_threads(1)
    runs = [sample(toy_model, tmp_path / str(seed), seed, refill=True, group_size=3, max_batch_sequences=4)
            for seed in range(3)]
    for other in runs[1:]:
        assert other == runs[0]


def test_rows_rejoining_on_arrival_are_the_latency_dependent_mode(toy_model: Path, tmp_path: Path) -> None:
    """readmit_after_steps 0 keeps the old behaviour: same tokens, log-probs equal only to rounding."""
    torch.set_num_threads(1)
    runs = [sample(toy_model, tmp_path / str(seed), seed, readmit_after_steps=0, max_batch_sequences=6)
            for seed in range(2)]
    assert [r[0] for r in runs[1]] == [r[0] for r in runs[0]]
    for (_, a, *_), (_, b, *_) in zip(runs[0], runs[1], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
