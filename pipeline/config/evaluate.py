"""Benchmark evaluation."""

from __future__ import annotations

from pydantic import Field

from pipeline.config.base import StageConfig


class EvaluateConfig(StageConfig):
    model: str = Field("models/policy", min_length=1, description="Model to evaluate: a directory or an MLflow model URI.")
    split_file: str = Field("data/curated/test.jsonl", min_length=1, description="Problems to evaluate on.")
    limit: int = Field(24, ge=0, description="Evaluate at most this many problems (0 = all).")
    samples: int = Field(1, ge=1, description="Samples per problem (1 with temperature 0 = greedy pass@1).")
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 = greedy decoding.")
    output_dir: str = Field("metrics", min_length=1, description="Where eval.json and per-sample records go.")
