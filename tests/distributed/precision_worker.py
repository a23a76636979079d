"""One rank of the precision and layout checks under data parallelism (run by `tests.distributed.worker`).

1. DeepSpeed's bf16 and fp16 modes (ZeRO-2): one AdamW step at lr 1e-5 moves (nearly) every float32 master
   weight, as one process's float32 masters do; fp16's dynamic loss scale does not skip it (fp16 where the
   accelerator has it: DeepSpeed refuses fp16 on a CPU).
2. Before the first update the reference, the old log-probs and the update agree exactly (ratio 1, KL 0, and
   with zero advantages no gradient), the reference running the update's padded layout and bf16 forward: on
   rows that would pack (a shared prompt, uneven lengths), where packed and padded differ in rounding; and
   wired by the trainer's own set-up (a KL term, recomputed old log-probs, train.update.autocast bfloat16).
Rank 0 writes what it saw to OUT/precision.pt.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist
from deepspeed.utils import safe_get_full_fp32_param

from pipeline.config import load_config
from pipeline.config.distributed import DistributedConfig
from pipeline.config.train import DAPOLoss
from pipeline.distributed.replicas import DeepSpeedReplicas, deepspeed_engine
from pipeline.model import DTYPES
from pipeline.rl.loss import PolicyLoss, make_policy_loss
from pipeline.train import set_up, update
from pipeline.trainer.reference import FrozenReference
from pipeline.trainer.update import apply_policy_gradient, recomputed_old_logprobs, update_settings
from pipeline.types import TrainBatch
from tests.distributed.worker import GROUP, LOSS, SETTINGS, VOCAB, make_batch, my_rows
from tests.helpers.tiny import tiny_llama
from tests.helpers.training import collect

ZERO2 = DistributedConfig(enabled=True, zero_stage=2, collectives="gloo")


def masters(replicas: DeepSpeedReplicas) -> list[torch.Tensor]:
    """The float32 master weights DeepSpeed steps (collective)."""
    return [safe_get_full_fp32_param(p).detach().clone() for p in replicas.module.parameters()]


def moved_share(dtype: str) -> dict:
    model = tiny_llama(VOCAB, seed=1).to(DTYPES[dtype])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)  # decay moves zero-gradient rows
    replicas = DeepSpeedReplicas(deepspeed_engine(model, optimizer, ZERO2, SETTINGS.micro_batch_size, 1.0, dtype))
    before = masters(replicas)
    local, weight = my_rows(make_batch(3, seed=5), replicas.rank, replicas.world)
    metrics = apply_policy_gradient(replicas, local, LOSS, SETTINGS, weight)
    after = masters(replicas)
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True))
    return {"share": changed / sum(b.numel() for b in before), "grad_norm": metrics["train/grad_norm"],
            "master_dtypes": sorted({str(t.dtype) for t in after}),
            "module_dtypes": sorted({str(p.dtype) for p in replicas.module.parameters()})}


def same_forward() -> dict:
    """One rank's step on rows that would pack, with a reference equal to the policy and zero advantages."""
    model = tiny_llama(VOCAB, seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    replicas = DeepSpeedReplicas(deepspeed_engine(model, optimizer, ZERO2, SETTINGS.micro_batch_size, 1e9, "float32"))
    settings = update_settings(SETTINGS.micro_batch_size, 1e9, 1.0, replicas, torch.bfloat16)
    local, weight = my_rows(packing_batch(seed=0), replicas.rank, replicas.world)
    local = dataclasses.replace(local, advantages_BT=torch.zeros_like(local.advantages_BT))
    local = FrozenReference(tiny_llama(VOCAB, seed=1)).attach(local, settings)
    local = recomputed_old_logprobs(replicas, local, settings)
    exact = [bool(torch.equal(local.ref_logprobs_BT, local.old_logprobs_BT))]
    metrics = apply_policy_gradient(replicas, local, _watching(make_policy_loss(DAPOLoss(kl_coef=1.0)), exact),
                                    settings, weight)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, exact)
    return {"exact": everyone, "metrics": metrics, "share_prefixes": settings.share_prefixes}


def packing_batch(seed: int, groups: int = 3, prompt: int = 20, width: int = 48) -> TrainBatch:
    """Groups of GROUP rows, each group one prompt, rows of uneven lengths: they pack, and a packed forward's
    rounding differs from a padded one's (rows of 16 tokens, `make_batch`'s, happened to agree bit for bit)."""
    g = torch.Generator().manual_seed(seed)
    B = groups * GROUP
    ids = torch.randint(0, VOCAB, (B, width), generator=g)
    for k in range(groups):
        ids[k * GROUP:(k + 1) * GROUP, :prompt] = ids[k * GROUP, :prompt].clone()
    lengths = torch.randint(prompt + 4, width + 1, (B,), generator=g)
    attn = (torch.arange(width)[None, :] < lengths[:, None]).long()
    mask = attn.float()
    mask[:, :prompt] = 0
    zeros = torch.zeros(B, width)
    return TrainBatch(ids, attn, mask, zeros, zeros, n_policy_tokens=int(mask.sum()))


def _watching(loss: PolicyLoss, exact: list[bool]) -> PolicyLoss:
    """`loss`, noting for each micro-batch whether its log-probs are exactly the old ones and the reference's."""
    def watched(logprobs_BT, micro):
        scored = micro.loss_mask_BT.bool()
        exact.append(bool(torch.equal(logprobs_BT.detach()[scored], micro.old_logprobs_BT[scored]))
                     and bool(torch.equal(micro.ref_logprobs_BT[scored], micro.old_logprobs_BT[scored])))
        return loss.fn(logprobs_BT, micro)
    return dataclasses.replace(loss, fn=watched)


def first_update(params: Path, out: Path) -> dict:
    """One trainer step on 2 ranks: the log-probs each micro-batch of the first update trains against."""
    cfg = load_config(params, overrides={
        "train.algorithm.kl_coef": 0.1, "train.update.logprobs_source": "recompute", "train.update.autocast": "bfloat16",
        "train.update.ppo_mini_batches": 1, "train.update.ppo_epochs": 1,
        "train.checkpoints.dir": str(out / "precision_run"), "train.output_dir": str(out / "precision_policy")})
    tr = set_up(cfg, {})
    exact: list[bool] = []
    metrics = update(dataclasses.replace(tr, loss=_watching(tr.loss, exact)), collect(tr).kept)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, exact)
    return {"exact": everyone, "metrics": metrics, "share_prefixes": tr.settings.share_prefixes,
            "autocast": tr.settings.autocast}


def main(params: Path, out: Path) -> None:
    from deepspeed.accelerator import get_accelerator

    dtypes = ["bfloat16"] + (["float16"] if get_accelerator().is_fp16_supported() else [])  # DeepSpeed: not on CPU
    result = {dtype: moved_share(dtype) for dtype in dtypes}
    result |= {"same_forward": same_forward(), "first_update": first_update(params, out)}
    if dist.get_rank() == 0:
        torch.save(result, out / "precision.pt")


if __name__ == "__main__":  # alone: python -m tests.distributed.precision_worker OUT PARAMS, on 2 ranks
    import sys

    from pipeline.distributed.launch import leave_process_group

    torch.set_num_threads(1)
    main(Path(sys.argv[2]), Path(sys.argv[1]))
    leave_process_group()
