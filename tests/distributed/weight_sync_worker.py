"""One rank of the weight-sync test (started by `pipeline.distributed.launch`, 2 gloo ranks).

What the vLLM backend would receive from `weight_sync`, recorded per case and compared (by the
test) with the single-process model: ZeRO-3 gathered on rank 0 only and on every rank, in chunks
of one parameter, of ~3 parameters and of the whole model; ZeRO-2 (no gather); a consumer that
stops early (the gather must still complete on every rank); the data-parallel train step's own
push (`trainer.push_rollout_weights`); and ZeRO-3 after an AdamW step.
Rank 0 writes OUT/weight_sync.pt; rank 1 writes what it received to OUT/weight_sync_rank1.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from pipeline.config import load_config
from pipeline.config.distributed import DistributedConfig
from pipeline.distributed import checkpointing, weight_sync
from pipeline.distributed.replicas import DeepSpeedReplicas, init_process_group
from pipeline.distributed.ds_config import deepspeed_config
from pipeline.distributed.launch import leave_process_group
from tests.distributed.worker import SETTINGS, VOCAB, train_on
from tests.helpers.tiny import tiny_llama

SEED = 5


class Recorder:
    """A rollout backend's weight hook as the vLLM backend uses it: copies each tensor as it arrives
    (the gathered storage is released when the iterator moves on), and how many were materialised."""

    def __init__(self, module: torch.nn.Module, limit: int | None = None) -> None:
        self.module, self.limit = module, limit
        self.received: dict[str, torch.Tensor] = {}
        self.most_gathered = 0

    def update_weights(self, named) -> None:
        for i, (name, tensor) in enumerate(named):
            if self.limit is not None and i == self.limit:
                return  # stops early, as a backend may
            self.received[name] = tensor.detach().clone()
            self.most_gathered = max(self.most_gathered, gathered_count(self.module))


def gathered_count(module: torch.nn.Module) -> int:
    """Parameters whose full data is present on this rank right now (ZeRO-3 keeps 1/W otherwise)."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return sum(getattr(p, "ds_status", None) == ZeroParamStatus.AVAILABLE for p in module.parameters())


def engine(stage: int, partition_everything: bool = True):
    """A DeepSpeed engine over the tiny model. DeepSpeed keeps parameters under 1e5 elements whole
    (`stage3_param_persistence_threshold`), i.e. all of the tiny model's: threshold 0 shards them."""
    import deepspeed

    model = tiny_llama(VOCAB, seed=SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    cfg = DistributedConfig(enabled=True, zero_stage=stage, collectives="gloo")
    init_process_group(cfg)
    config = deepspeed_config(cfg, SETTINGS.micro_batch_size, 1.0, "float32")
    if stage == 3 and partition_everything:
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    ds_engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return DeepSpeedReplicas(ds_engine), sched


def push(module: torch.nn.Module, chunk_bytes: int, to_rank: int | None, limit: int | None = None) -> dict:
    recorder = Recorder(module, limit)
    weight_sync.push_weights(module, recorder, chunk_bytes=chunk_bytes, to_rank=to_rank)
    chunks = weight_sync.parameter_chunks(list(module.named_parameters()), chunk_bytes)
    return {"received": recorder.received, "most_gathered": recorder.most_gathered,
            "chunks": len(chunks), "largest_chunk": max(len(c) for c in chunks)}


def trainer_push(replicas: DeepSpeedReplicas) -> dict:
    """What the data-parallel train step pushes into a rank's rollout engine (`rollout.backend: vllm`)."""
    cfg = load_config(Path(__file__).resolve().parents[2] / "params.yaml")
    recorder = Recorder(replicas.module)
    pushing = DeepSpeedReplicas(replicas.model, push_to_rollout_engine=True,
                                push_chunk_bytes=cfg.rollout.vllm.push_chunk_mib * 2**20)
    pushing.sync(SimpleNamespace(backend=recorder))
    return {"received": recorder.received, "most_gathered": recorder.most_gathered}


def main(out: Path) -> None:
    torch.set_num_threads(1)
    zero3, sched = engine(3)
    module = zero3.module
    three_params = 3 * 32 * 32 * 4  # ~3 of the tiny model's attention matrices
    result = {
        "reference": {n: p.detach().clone() for n, p in tiny_llama(VOCAB, seed=SEED).named_parameters()},
        "rank0_one_param": push(module, 1, to_rank=0),
        "rank0_three_params": push(module, three_params, to_rank=0),
        "all_ranks_whole_model": push(module, 2**40, to_rank=None),
        "early_stop": push(module, three_params, to_rank=None, limit=2),
        "after_early_stop": push(module, 1, to_rank=0),  # the collectives are still in step
        "trainer_push": trainer_push(zero3),
        "whole_after": gathered_count(module),  # everything released again
        "n_params": len(list(module.parameters())),
    }
    train_on(zero3, sched, seed=21)
    stepped: dict[str, torch.Tensor] = {}
    checkpointing.for_each_full_parameter(zero3, lambda n, t: stepped.__setitem__(n, t.detach().clone()))
    result |= {"stepped_reference": stepped, "stepped": push(module, three_params, to_rank=0)}
    zero2, _ = engine(2)
    result["zero2"] = push(zero2.module, 1, to_rank=0)
    if dist.get_rank() == 0:
        torch.save(result, out / "weight_sync.pt")
    else:
        torch.save({k: v for k, v in result.items() if isinstance(v, dict) and "received" in v},
                   out / "weight_sync_rank1.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    leave_process_group()
