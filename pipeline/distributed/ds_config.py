"""The DeepSpeed config, generated from the `distributed`, `train` and `model` sections.

Gradient accumulation is *unmanaged* (`managed_gradient_accumulation: false`): a DAPO step
has a variable number of micro-batches (dynamic sampling), so the trainer, not DeepSpeed,
decides when a step ends; `gradient_accumulation_steps` is 1 and only feeds DeepSpeed's
sample counters. The optimiser is the trainer's own torch AdamW (a client optimiser), so
single-process and data-parallel runs step the same algorithm.
"""

from __future__ import annotations

from typing import Any

from pipeline.config.distributed import DistributedConfig

NEVER = 10**12  # DeepSpeed prints progress every N steps; our trainer logs its own metrics


def zero_section(dist: DistributedConfig) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": dist.zero_stage}
    if dist.zero_stage == 0:
        return zero
    zero |= {"contiguous_gradients": True, "overlap_comm": dist.overlap_comm,
             "reduce_bucket_size": dist.reduce_bucket_size}
    if dist.zero_stage == 2:
        zero["allgather_bucket_size"] = dist.reduce_bucket_size
    if dist.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if dist.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def deepspeed_config(dist: DistributedConfig, micro_batch_size: int, grad_clip: float, dtype: str) -> dict[str, Any]:
    """The complete DeepSpeed config dict for `deepspeed.initialize(config=...)`."""
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"model.dtype: {dtype!r} is not one of float32, bfloat16, float16")
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero_section(dist),
        # Our AdamW is a torch optimiser; DeepSpeed only vouches for its own ones.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": dtype == "float16", "loss_scale": 0, "initial_scale_power": 16},
        "steps_per_print": NEVER,
        "wall_clock_breakdown": False,
    }
