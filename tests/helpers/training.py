"""One step's sampling as `pipeline.train.run` makes it, for tests that drive the step by hand."""

from __future__ import annotations

from pipeline.train import Training
from pipeline.types import Collected, ScoredGroup


def collect(t: Training) -> Collected:
    """Sample groups with tools, score them and keep the informative ones (the loop's first line)."""
    return t.sampler.collect(t.rollouts, t.stream, t.reward, t.keep)


def collect_batch(t: Training) -> tuple[list[ScoredGroup], dict[str, float]]:
    """The groups to train on and the rollout metrics."""
    collected = collect(t)
    return collected.kept, collected.metrics
