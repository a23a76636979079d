"""Settings shared by every stage: seed, tracking, threads."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class RunSection(StageConfig):
    seed: int = Field(0, ge=0, description="Global seed; every stage derives its own generators from it.")
    experiment: str = Field("tapo", min_length=1, description="MLflow experiment name.")
    tracking_uri: str = Field("sqlite:///mlruns.db", min_length=1, description="MLflow tracking URI (local SQLite by default).")
    deterministic: bool = Field(True, description="torch's deterministic kernels in SFT and training: the same "
                                "inputs give the same weights (pipeline.repeatable); false: faster kernels whose sums "
                                "depend on thread timing.")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = leave torch's default.")
