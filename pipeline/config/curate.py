"""Dataset curation: sources, the Calculator generator, filters and splits."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class CalculatorConfig(StageConfig):
    n_train: int = Field(240, ge=0, description="Generated calculator problems for training.")
    n_test: int = Field(60, ge=0, description="Generated calculator problems for testing.")


class CurateConfig(StageConfig):
    seed: int = Field(0, ge=0, description="Seed of generation and splitting.")
    calculator: CalculatorConfig = Field(default_factory=CalculatorConfig, description="TAPO Calculator-6K generator.")
    output_dir: str = Field("data/curated", min_length=1, description="One JSONL file per split.")
