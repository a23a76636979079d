"""Which base model the policy starts from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.config.base import StageConfig


class ModelConfig(StageConfig):
    path: str = Field(
        "smollm2-135m-instruct",
        min_length=1,
        description="A local Hugging Face directory, a hub id, or 'smollm2-135m-instruct' (the embedded GGUF default).",
    )
    base_dir: str = Field("models/base", min_length=1, description="Where prepare-model writes the safetensors copy of the base model.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description=(
        "The precision the model computes in (training forward, rollouts, evaluation). The weights an optimiser steps "
        "and its state stay float32: one process keeps float32 master weights and runs the training forward under "
        "autocast to this dtype; DeepSpeed's bf16/fp16 modes keep their own float32 masters; LoRA trains a float32 "
        "adapter over a base held in this dtype (pipeline.model). float16 needs loss scaling: distributed.enabled only."))
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?|mps)$",
        description="Where SFT, single-process training and evaluation run: auto (cuda when present, else cpu), cpu, "
                    "cuda, cuda:N or mps. DeepSpeed places data-parallel ranks itself.")
