"""Settings shared by every stage: seed, tracking, threads."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from pipeline.config.base import StageConfig


class TracesSection(StageConfig):
    """Which rollouts are logged as MLflow traces (`pipeline.tracking.traces`): a span per turn and per tool call.
    What they cost is measured by `benchmarks/trace_cost.py`."""

    train_groups_per_step: int = Field(2, ge=0, description="Groups of each training step logged as traces, kept "
                                       "and dropped ones alternately (each trace a group: every trajectory, its "
                                       "turns and tool calls); 0: none.")
    evaluate: Literal["all", "none"] | Annotated[int, Field(ge=1)] = Field(
        "all", description="Problems of an evaluation logged as traces: all, none, or the first N of each benchmark.")


class RunSection(StageConfig):
    seed: int = Field(0, ge=0, description="Global seed; every stage derives its own generators from it.")
    experiment: str = Field("tapo", min_length=1, description="MLflow experiment name.")
    tracking_uri: str = Field("sqlite:///mlruns.db", min_length=1, description="MLflow tracking URI (local SQLite by default).")
    deterministic: bool = Field(True, description="torch's deterministic kernels in SFT and training: the same "
                                "inputs give the same weights (pipeline.repeatable); false: faster kernels whose sums "
                                "depend on thread timing.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = leave torch's default.")
    traces: TracesSection = Field(default_factory=TracesSection, description="Rollouts logged as MLflow traces.")
