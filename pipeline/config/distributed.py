"""Scale-out: DeepSpeed ZeRO data parallelism (single process when disabled).

The DeepSpeed JSON is generated from these fields (`pipeline.distributed.ds_config`), never
hand-written. The micro-batch size is `train.update.micro_batch_size` and the gradient clip is
`train.optimizer.grad_clip`: one source of truth for the single-process and the data-parallel run.
The placement (ranks per node, nodes, launcher) is here too: the train stage starts the ranks
itself (`pipeline.distributed.launch`), so one params file runs on a laptop and on 8 GPUs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import StageConfig


class DistributedConfig(StageConfig):
    enabled: bool = Field(False, description="Train with DeepSpeed across processes, which the train stage launches.")
    nproc_per_node: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto", description="Ranks on each node: auto = the visible CUDA GPUs (1 on a machine without one); "
                            "an integer, e.g. 2 gloo ranks on a CPU.")
    nnodes: int = Field(1, ge=1, le=4096, description="Nodes; more than 1 needs a hostfile and launcher deepspeed.")
    hostfile: str = Field("", description="Several nodes: a DeepSpeed hostfile ('<host> slots=<GPUs>' a line); the "
                                          "deepspeed launcher starts the other nodes' ranks over ssh.")
    launcher: Literal["torchrun", "deepspeed"] = Field(
        "torchrun", description="What starts the ranks: torchrun (one node) or DeepSpeed's launcher (a hostfile).")
    master_addr: str = Field("", description="Rendezvous host: empty = 127.0.0.1 on one node, the hostfile's first "
                                             "host on several (the node the stage runs on).")
    zero_stage: Literal[0, 2, 3] = Field(
        2, description="ZeRO stage: 0 = replicated data parallel, 2 = shard optimiser state and gradients, 3 = also parameters.")
    offload_optimizer: bool = Field(False, description="ZeRO-2/3: keep optimiser state in CPU memory (and step there).")
    offload_params: bool = Field(False, description="ZeRO-3 only: keep parameters in CPU memory between uses.")
    collectives: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="The library ranks exchange tensors with (torch.distributed's process-group backend): "
                 "auto = nccl when CUDA is present, else gloo.")
    overlap_comm: bool = Field(False, description="Overlap gradient reduction with backward (worth it on GPUs).")
    reduce_bucket_size: int = Field(50_000_000, ge=1_000, description="Elements per gradient-reduction bucket.")
    python: str = Field(
        "", description="The Python interpreter the ranks run: empty = the stage's own. Another environment's, for a "
                        "rollout backend the stage's environment lacks: on CPU, .venv-vllm/bin/python "
                        "(scripts/setup_vllm.sh) for rollout.backend vllm. A relative path is taken from the stage's "
                        "working directory; on several nodes the same path must hold it on each.")
    torch_extensions_dir: str = Field(
        ".cache/torch_extensions", min_length=1,
        description="Where DeepSpeed builds its C++ ops once (the first CPU start compiles one, ~1-5 min).")

    def ranks_per_node(self, visible_gpus: int) -> int | None:
        """`nproc_per_node` on a machine with `visible_gpus` CUDA GPUs: auto = those GPUs, 1 without any; None for
        auto with a hostfile (each node's slots decide)."""
        if self.nproc_per_node != "auto":
            return self.nproc_per_node
        return None if self.hostfile else max(visible_gpus, 1)

    @field_validator("nproc_per_node", mode="before")
    @classmethod
    def _auto_or_integer(cls, value: object) -> object:
        if isinstance(value, str) and value != "auto":  # lax Python callers: '2' is not silently a number
            raise ValueError(f"must be an integer or 'auto', got {value!r}")
        return value

    @model_validator(mode="after")
    def _launcher_reaches_the_nodes(self) -> DistributedConfig:
        if self.nnodes > 1 and not self.hostfile:
            raise ValueError("distributed.nnodes > 1 needs distributed.hostfile (the nodes to start ranks on)")
        if self.hostfile and self.launcher != "deepspeed":
            raise ValueError("distributed.hostfile needs distributed.launcher deepspeed (torchrun starts the ranks "
                             "of its own node only)")
        return self

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> DistributedConfig:
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("distributed.offload_params needs zero_stage 3")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("distributed.offload_optimizer needs zero_stage 2 or 3")
        return self
