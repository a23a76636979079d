"""Cold-start supervised fine-tuning on tool-use traces."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.config.base import StageConfig


class SFTConfig(StageConfig):
    enabled: bool = Field(True, description="Run SFT before RL; when False the stage saves the base model unchanged.")
    teacher: Literal["scripted"] = Field(
        "scripted", description="Trace source: 'scripted' writes the problem's own program as a <code> call (calculator)."
    )
    init_model: str = Field("models/base", min_length=1, description="Model to fine-tune.")
    train_file: str = Field("data/curated/train.jsonl", min_length=1, description="Problems to build traces from.")
    max_traces: int = Field(64, ge=0, description="Most traces to train on (0 = all that pass the verifier).")
    epochs: int = Field(1, ge=1, description="Passes over the traces.")
    batch_size: int = Field(8, ge=1, description="Traces per optimiser step.")
    lr: float = Field(5e-5, gt=0.0, lt=1.0, description="AdamW learning rate.")
    gradient_checkpointing: bool = Field(True, description="Trade compute for memory.")
    output_dir: str = Field("models/sft", min_length=1, description="Where the fine-tuned model is saved.")
