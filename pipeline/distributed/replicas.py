"""`DeepSpeedReplicas`: one rank of a data-parallel job, as the training step's `Replicas`
(`pipeline.trainer.replicas`).

Every rank runs the same step on the same inputs: rollouts are sampled per rank and all-gathered
(`pipeline.distributed.sharding`), so scoring and dynamic sampling agree everywhere; then each rank
trains on its own whole groups of each mini-batch (`share`) and DeepSpeed reduces the gradients.

DeepSpeed *averages* gradients over ranks; our loss is already divided by the global
denominator (policy tokens summed over all ranks), so the true gradient is the *sum* of the
ranks' gradients. `backward` therefore multiplies the loss by the world size before handing
it to DeepSpeed (exact in binary floating point for power-of-two worlds).

Rows run padded, not as a prefix tree: the packed tree's dense [P, P] mask is measured on CPU only, and
this path is for GPUs, where an arbitrary mask rules out the flash-attention kernel (not measured there).

The rollout engine's weights (`sync`, after every step and after a resume): under ZeRO-3 the trained
parameters are shards, and generation with them would need a collective per decoded token in lock-step
across ranks (ranks decode different lengths), so the `hf` backend samples from a full copy, refreshed
one gathered parameter at a time; under ZeRO-0/2 the parameters are whole on every rank and the `hf`
backend samples from them directly. A `vllm` engine holds its own copy, into which the trained weights
are pushed (`weight_sync.push_weights`: gathered from ZeRO-3 shards chunk by chunk, or whole).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from pipeline.config.rollout import RolloutConfig
from pipeline.config.distributed import DistributedConfig
from pipeline.distributed import checkpointing, weight_sync
from pipeline.distributed.build_locks import build_locks_cleared
from pipeline.distributed.ds_config import deepspeed_config
from pipeline.distributed.sharding import assign_groups
from pipeline.rollout.engine import RolloutEngine
from pipeline.training_run.checkpoint import TrainerState
from pipeline.types import ScoredGroup

if TYPE_CHECKING:  # DeepSpeed is imported only when used
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel


def resolve_collectives(name: str) -> str:
    if name != "auto":
        return name
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(cfg: DistributedConfig) -> None:
    """Join the process group described by the launcher's environment (RANK, WORLD_SIZE, ...)."""
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"distributed.enabled is true but {', '.join(missing)} is not set: run the train stage "
                           "(`python -m flows.train` or `dvc repro`), which launches the ranks")
    # DeepSpeed builds a C++ op on first use; keep the build where later runs find it, and clear the build lock
    # of a rank that died building it (it would hang this start for ever).
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(cfg.torch_extensions_dir).resolve()))
    import deepspeed

    if not dist.is_initialized():
        with build_locks_cleared(Path(os.environ["TORCH_EXTENSIONS_DIR"]), shared=_spans_nodes()):
            deepspeed.init_distributed(dist_backend=resolve_collectives(cfg.collectives))


def _spans_nodes() -> bool:
    """Whether this rank's job has ranks on other machines (torchrun's and DeepSpeed's launchers say so)."""
    local = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE")
    return local is None or int(local) != int(os.environ["WORLD_SIZE"])


def _device() -> torch.device:
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


@dataclass
class DeepSpeedReplicas:
    """One rank's DeepSpeed engine seen through the training step's `Replicas` interface."""

    model: DeepSpeedEngine
    push_to_rollout_engine: bool = False  # a vLLM engine: it holds its own copy of the weights
    push_chunk_bytes: int = weight_sync.DEFAULT_CHUNK_BYTES
    share_prefixes: bool = False  # rows run padded (see the module docstring)

    def __post_init__(self) -> None:
        if self.zero_stage == 0 and not hasattr(self.model, "_tapo_grad_norm"):
            record_stage0_grad_norm(self.model)

    @property
    def module(self) -> PreTrainedModel:
        """The wrapped Hugging Face model (under ZeRO-3 its parameters are shards)."""
        return self.model.module

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world(self) -> int:
        return dist.get_world_size()

    @property
    def zero_stage(self) -> int:
        return self.model.zero_optimization_stage()

    def zero_grad(self) -> None:
        self.model.zero_grad()
        if self.zero_stage > 0:
            self.model.optimizer.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss * self.world, scale_wrt_gas=False)

    def step(self) -> float:
        self.model.step()
        norm = self.model._tapo_grad_norm if self.zero_stage == 0 else self.model.get_global_grad_norm()
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

    def share(self, groups: list[ScoredGroup]) -> tuple[list[ScoredGroup], float]:
        """This rank's whole groups, balanced by policy tokens, and its weight (0: no data, it runs idle passes)."""
        costs = [float(max(sum(t.policy_token_count for t in g.group.trajectories), 1)) for g in groups]
        mine = assign_groups(costs, self.world)[self.rank]
        return ([groups[i] for i in mine], 1.0) if mine else (groups[:1], 0.0)

    def sync(self, engine: RolloutEngine) -> None:
        """Collective under ZeRO-3: the trained weights into this rank's vLLM engine, or into the full copy
        the `hf` backend samples from (nothing to do when it samples from the trained module itself)."""
        if self.push_to_rollout_engine:
            weight_sync.push_weights(self.module, engine.backend, chunk_bytes=self.push_chunk_bytes)
        elif engine.model is not self.module:
            checkpointing.copy_weights_into(self, engine.model)

    def save_checkpoint(self, root: Path, state: TrainerState, scheduler: torch.optim.lr_scheduler.LRScheduler,
                        tokenizer) -> Path:
        """Collective: a DeepSpeed checkpoint (every rank's shards and RNG, the config and tokenizer)."""
        return checkpointing.save(self, root, state, scheduler, tokenizer)

    def load_checkpoint(self, path: Path, scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
        return checkpointing.load(self, path, scheduler)

    def save_model(self, tokenizer, path: Path) -> None:
        """Collective: rank 0 writes the Hugging Face directory, gathered from ZeRO shards when needed."""
        checkpointing.export_hf(self, tokenizer, path)


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


def deepspeed_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: DistributedConfig,
                     micro_batch_size: int, grad_clip: float, dtype: str) -> torch.nn.Module:
    """`model` and the trainer's optimiser wrapped in a DeepSpeed engine (joins the process group first)."""
    init_process_group(cfg)
    import deepspeed

    config = deepspeed_config(cfg, micro_batch_size, grad_clip, dtype)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def deepspeed_replicas(model: PreTrainedModel, optimizer: torch.optim.Optimizer, distributed: DistributedConfig,
                       micro_batch_size: int, grad_clip: float, dtype: str,
                       rollout: RolloutConfig) -> DeepSpeedReplicas:
    """This rank of the data-parallel job `distributed` describes, for the training step; weights are pushed to the
    rollout engine when it does not sample from the trained module (`rollout.generation`)."""
    engine = deepspeed_engine(model, optimizer, distributed, micro_batch_size, grad_clip, dtype)
    return DeepSpeedReplicas(engine, push_to_rollout_engine=not rollout.generation.in_process,
                             push_chunk_bytes=rollout.vllm.push_chunk_mib * 2**20)
