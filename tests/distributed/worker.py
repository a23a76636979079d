"""One rank of the 2-process test (started by `pipeline.distributed.launch`).

1. Parity: ZeRO-2 steps on uneven shards (3 groups on 2 ranks: unequal micro-batch counts),
   with an idle rank (1 group on 2 ranks), ZeRO-0, and ZeRO-3 with parameter and optimiser offload,
   against the one-process step on the whole batch.
2. Resume: ZeRO-3 with AdamW and warm-up: step, checkpoint, step; a fresh engine (other
   initial weights) loads the checkpoint and repeats the second step.
3. Export: an HF directory gathered from the ZeRO-3 shards in-process, and one merged from
   the shards on disk offline.
4. With a params file: the trainer end to end (`trainer_worker`), and precision and layout under data
   parallelism (`precision_worker`), in the same launch to pay the process start-up once.
Rank 0 writes what it saw to OUT/result.pt (and OUT/trainer.pt); the tests make the assertions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from pipeline.training_run.checkpoint import TrainerState
from pipeline.config.distributed import DistributedConfig
from pipeline.config.train import DAPOLoss
from pipeline.distributed import checkpointing
from pipeline.distributed.replicas import DeepSpeedReplicas, deepspeed_engine
from pipeline.export import export_checkpoint
from pipeline.distributed.sharding import assign_groups, rank_rows
from pipeline.rl.loss import make_policy_loss
from pipeline.types import TrainBatch
from pipeline.trainer.update import UpdateSettings, apply_policy_gradient, policy_gradient_step
from pipeline.distributed.launch import leave_process_group
from tests.helpers.tiny import tiny_llama, tiny_tokenizer

GROUP = 4
VOCAB = 64
SETTINGS = UpdateSettings(micro_batch_size=2, grad_clip=1e9, temperature=1.0)
LOSS = make_policy_loss(DAPOLoss())


def make_batch(groups: int, seed: int, vocab: int = VOCAB) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    B, T = groups * GROUP, 16
    ids = torch.randint(0, vocab, (B, T), generator=g)
    lengths = torch.randint(8, T + 1, (B,), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask = attn.float()
    mask[:, :4] = 0
    mask[::2, 6:8] = 0
    adv = torch.randn(B, 1, generator=g).expand(B, T) * mask
    old = -torch.rand(B, T, generator=g) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


def my_rows(batch: TrainBatch, rank: int, world: int) -> tuple[TrainBatch, float]:
    n = len(batch) // GROUP
    costs = [float(batch.loss_mask_BT[i * GROUP:(i + 1) * GROUP].sum()) for i in range(n)]
    mine = assign_groups(costs, world)[rank]
    if not mine:
        return rank_rows(batch, list(range(GROUP))), 0.0
    return rank_rows(batch, [i * GROUP + j for i in mine for j in range(GROUP)]), 1.0


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


ZERO0 = DistributedConfig(enabled=True, zero_stage=0, collectives="gloo")
ZERO2 = DistributedConfig(enabled=True, zero_stage=2, collectives="gloo")
ZERO3_OFFLOAD = DistributedConfig(enabled=True, zero_stage=3, offload_params=True, offload_optimizer=True,
                                  collectives="gloo")


def parity(groups: int, seed: int, cfg: DistributedConfig = ZERO2) -> dict:
    """max |single - data parallel| of loss and gradient (SGD lr 1: change = -gradient)."""
    batch = make_batch(groups, seed)
    ref = tiny_llama(VOCAB, seed=1)
    before = flat_params(ref)
    ref_metrics = policy_gradient_step(ref, torch.optim.SGD(ref.parameters(), lr=1.0), batch, LOSS, SETTINGS)
    ref_grad = before - flat_params(ref)
    model = tiny_llama(VOCAB, seed=1)
    replicas = DeepSpeedReplicas(deepspeed_engine(model, torch.optim.SGD(model.parameters(), lr=1.0), cfg,
                                                 SETTINGS.micro_batch_size, SETTINGS.grad_clip, "float32"))
    local, weight = my_rows(batch, replicas.rank, replicas.world)
    metrics = apply_policy_gradient(replicas, local, LOSS, SETTINGS, weight)
    grad = before - gathered(replicas)
    return {"loss_diff": abs(metrics["train/loss"] - ref_metrics["train/loss"]),
            "grad_diff": float((grad - ref_grad).abs().max()), "grad_max": float(ref_grad.abs().max()),
            "entropy_diff": abs(metrics["train/entropy"] - ref_metrics["train/entropy"]),
            "grad_norm_diff": abs(metrics["train/grad_norm"] - ref_metrics["train/grad_norm"])}


def zero3_engine(seed: int):
    model = tiny_llama(VOCAB, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))
    replicas = DeepSpeedReplicas(deepspeed_engine(model, opt, DistributedConfig(enabled=True, zero_stage=3,
                                                                                collectives="gloo"),
                                                 SETTINGS.micro_batch_size, 1.0, "float32"))
    return replicas, sched


def gathered(replicas) -> torch.Tensor:
    parts: list[torch.Tensor] = []
    checkpointing.for_each_full_parameter(replicas, lambda _, t: parts.append(t.detach().flatten().clone()))
    return torch.cat(parts)


def train_on(replicas, sched, seed: int) -> None:
    local, weight = my_rows(make_batch(3, seed), replicas.rank, replicas.world)
    apply_policy_gradient(replicas, local, LOSS, SETTINGS, weight)
    sched.step()


def resume_and_export(out: Path) -> dict:
    tok = tiny_tokenizer()
    root = out / "resume_run"
    a, sched_a = zero3_engine(seed=1)
    train_on(a, sched_a, seed=10)
    saved_state = TrainerState(step=1, data_cursor=5, rollout_calls=3)
    saved = checkpointing.save(a, root, saved_state, sched_a, tok)
    after_step1 = gathered(a)
    draw_a = torch.rand(3)
    train_on(a, sched_a, seed=11)
    b, sched_b = zero3_engine(seed=7)
    state = checkpointing.load(b, saved, sched_b)
    loaded = gathered(b)
    draw_b = torch.rand(3)
    train_on(b, sched_b, seed=11)
    checkpointing.export_hf(b, tok, out / "hf")
    if b.rank == 0:
        checkpointing.export_from_checkpoint(root / "checkpoints", out / "hf_offline")
        export_checkpoint(root / "checkpoints", out / "cli_latest")  # the export command, either form
        export_checkpoint(root / "checkpoints" / "step-000001", out / "cli_step")
    return {"state_ok": state == saved_state, "rng_ok": bool(torch.equal(draw_a, draw_b)),
            "lr": (sched_a.get_last_lr()[0], sched_b.get_last_lr()[0]),
            "step1": after_step1, "loaded": loaded, "resumed_a": gathered(a), "resumed_b": gathered(b)}


def main(out: Path, params: Path | None) -> None:
    torch.set_num_threads(1)
    result = {"uneven": parity(groups=3, seed=0), "idle_rank": parity(groups=1, seed=1),
              "zero3_offload": parity(groups=3, seed=2, cfg=ZERO3_OFFLOAD), "zero0": parity(3, 3, ZERO0)}
    result |= resume_and_export(out)
    if torch.distributed.get_rank() == 0:
        torch.save(result, out / "result.pt")
    if params is not None:
        from tests.distributed import precision_worker, trainer_worker

        trainer_worker.main(params, out)
        precision_worker.main(params, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    leave_process_group()
