"""Scale-out: DeepSpeed ZeRO data parallelism (single process when disabled).

The DeepSpeed JSON is generated from these fields (`pipeline.distributed.ds_config`), never
hand-written. The micro-batch size is `train.micro_batch_size` and the gradient clip is
`train.grad_clip`: one source of truth for the single-process and the data-parallel run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import StageConfig


class DistributedConfig(StageConfig):
    enabled: bool = Field(False, description="Train with DeepSpeed across processes (launch with deepspeed or torchrun).")
    zero_stage: Literal[0, 2, 3] = Field(
        2, description="ZeRO stage: 0 = replicated data parallel, 2 = shard optimiser state and gradients, 3 = also parameters.")
    offload_optimizer: bool = Field(False, description="ZeRO-2/3: keep optimiser state in CPU memory (and step there).")
    offload_params: bool = Field(False, description="ZeRO-3 only: keep parameters in CPU memory between uses.")
    collectives: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="The library ranks exchange tensors with (torch.distributed's process-group backend): "
                 "auto = nccl when CUDA is present, else gloo.")
    overlap_comm: bool = Field(False, description="Overlap gradient reduction with backward (worth it on GPUs).")
    reduce_bucket_size: int = Field(50_000_000, ge=1_000, description="Elements per gradient-reduction bucket.")
    rollout_seed_stride: int = Field(
        1000, ge=1, description="Rank r samples its rollout shard with seed run.seed + r * stride (distinct streams).")
    torch_extensions_dir: str = Field(
        ".cache/torch_extensions", min_length=1,
        description="Where DeepSpeed builds its C++ ops once (the first CPU start compiles one, ~1-5 min).")

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> DistributedConfig:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("distributed.offload_params needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("distributed.offload_optimizer needs zero_stage 2 or 3")
        return self
