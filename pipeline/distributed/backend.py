"""`DeepSpeedBackend`: the data-parallel `GradientBackend` of `pipeline.trainer.update`.

DeepSpeed *averages* gradients over ranks; our loss is already divided by the global
denominator (policy tokens summed over all ranks), so the true gradient is the *sum* of the
ranks' gradients. `backward` therefore multiplies the loss by the world size before handing
it to DeepSpeed (exact in binary floating point for power-of-two worlds).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.config.distributed import DistributedConfig
from pipeline.distributed.ds_config import deepspeed_config


def resolve_dist_backend(name: str) -> str:
    if name != "auto":
        return name
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(cfg: DistributedConfig) -> None:
    """Join the process group described by the launcher's environment (RANK, WORLD_SIZE, ...)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"distributed.enabled is true but {', '.join(missing)} is not set: start the run with "
                           "`python -m pipeline.distributed.launch`, `deepspeed` or `torchrun`")
    # DeepSpeed builds a C++ op on first use; keep the build where later runs find it.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(cfg.torch_extensions_dir).resolve()))
    import deepspeed

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend=resolve_dist_backend(cfg.dist_backend))


def _device() -> torch.device:
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


@dataclass
class DeepSpeedBackend:
    """A DeepSpeed engine seen through the trainer's gradient interface."""

    engine: torch.nn.Module  # deepspeed.DeepSpeedEngine

    def __post_init__(self) -> None:
        if self.zero_stage == 0 and not hasattr(self.engine, "_tapo_grad_norm"):
            record_stage0_grad_norm(self.engine)

    @property
    def model(self) -> torch.nn.Module:
        return self.engine

    @property
    def module(self) -> torch.nn.Module:
        """The wrapped Hugging Face model (under ZeRO-3 its parameters are shards)."""
        return self.engine.module

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world(self) -> int:
        return dist.get_world_size()

    @property
    def zero_stage(self) -> int:
        return self.engine.zero_optimization_stage()

    def zero_grad(self) -> None:
        self.engine.zero_grad()
        if self.zero_stage > 0:
            self.engine.optimizer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss * self.world, scale_wrt_gas=False)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine._tapo_grad_norm if self.zero_stage == 0 else self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.cpu().tolist()

    def all_reduce_max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def barrier(self) -> None:
        dist.barrier()


def record_stage0_grad_norm(engine) -> None:
    """Without ZeRO, DeepSpeed clips the all-reduced fp32 gradients but drops their norm; keep it.

    (ZeRO-2/3 report it through `get_global_grad_norm`.) Only the fp32 path clips here; bf16
    and fp16 go through DeepSpeed's own optimisers, which record the norm themselves.
    """
    from deepspeed.runtime.utils import clip_grad_norm_

    engine._tapo_grad_norm = None

    def clip_and_record() -> None:
        engine._tapo_grad_norm = clip_grad_norm_(parameters=engine.module.parameters(),
                                                 max_norm=engine.gradient_clipping(), mpu=engine.mpu)

    engine.clip_fp32_gradients = clip_and_record


def make_deepspeed_backend(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: DistributedConfig,
                           micro_batch_size: int, grad_clip: float, dtype: str) -> DeepSpeedBackend:
    """Wrap `model` and the trainer's optimiser in a DeepSpeed engine (joins the process group first)."""
    init_process_group(cfg)
    import deepspeed

    config = deepspeed_config(cfg, micro_batch_size, grad_clip, dtype)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return DeepSpeedBackend(engine)
