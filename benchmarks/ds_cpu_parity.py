"""Data-parallel parity: 1 process vs 2 gloo processes (DeepSpeed ZeRO-2 and ZeRO-3), same batch.

The baseline is the single-process trainer step (`policy_gradient_step`); ours is the same
step through `DeepSpeedReplicas` with the batch's groups split whole across 2 ranks and the
DAPO denominator all-reduced. The optimiser is SGD with lr 1 and no clipping for the
compared step, so parameter change = -gradient: loss and full gradient are compared
without reaching into DeepSpeed's partitioned gradient buffers. Then a few timed steps.

    .venv/bin/python benchmarks/ds_cpu_parity.py [--steps 3] [--stages 2 3] [--quick]

Last line: JSON with max_abs_diff (loss and gradients, all stages; goal <= 1e-5 in fp32),
per-stage figures, and ratio = single-process step time / 2-process step time (first stage
listed, ZeRO-2 by default; ideal 2 on 2 idle cores).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from pipeline.config.distributed import DistributedConfig  # noqa: E402
from pipeline.config.train import DAPOLoss  # noqa: E402
from pipeline.distributed.launch import leave_process_group, on_this_machine, run_ranks  # noqa: E402
from pipeline.distributed.sharding import assign_groups, rank_rows  # noqa: E402
from pipeline.rl.loss import make_policy_loss  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402
from pipeline.trainer.update import UpdateSettings, apply_policy_gradient, policy_gradient_step  # noqa: E402

VOCAB, GROUPS, GROUP_SIZE, T, MICRO = 512, 8, 4, 64, 4
NO_CLIP = 1e9
QUICK = {"steps": 1, "stages": [2]}


def build_model(seed: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).float()


def build_batch(seed: int = 0) -> TrainBatch:
    """GROUPS groups of GROUP_SIZE rows: prompts, ragged responses, masked tool-output spans."""
    g = torch.Generator().manual_seed(seed)
    B = GROUPS * GROUP_SIZE
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    lengths = torch.randint(T // 3, T + 1, (B,), generator=g)
    attn = (torch.arange(T)[None, :] < lengths[:, None]).long()
    mask = attn.float().clone()
    mask[:, :12] = 0  # prompt
    mask[::3, 20:28] = 0  # tool output inside some responses
    rewards = torch.randint(0, 2, (GROUPS, GROUP_SIZE), generator=g).float()
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(B, 1)
    old = -torch.rand(B, T, generator=g) * 3 * mask
    return TrainBatch(ids, attn, mask, old, adv.expand(B, T) * mask, n_policy_tokens=int(mask.sum()))


def group_rows(batch: TrainBatch, rank: int, world: int) -> list[int]:
    costs = [float(batch.loss_mask_BT[i * GROUP_SIZE:(i + 1) * GROUP_SIZE].sum()) for i in range(GROUPS)]
    return [i * GROUP_SIZE + j for i in assign_groups(costs, world)[rank] for j in range(GROUP_SIZE)]


def timed_steps(step, optimizer, steps: int) -> list[float]:
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def single_process(steps: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model, batch = build_model(), build_batch()
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    settings, loss = UpdateSettings(MICRO, NO_CLIP, 1.0), make_policy_loss(DAPOLoss())
    metrics = policy_gradient_step(model, opt, batch, loss, settings)
    grad = before - torch.cat([p.detach().flatten() for p in model.parameters()])
    times = timed_steps(lambda: policy_gradient_step(model, opt, batch, loss, settings), opt, steps)
    return {"loss": metrics["train/loss"], "grad_norm": metrics["train/grad_norm"], "grad": grad, "times": times}


def worker(stage: int, steps: int, out: Path) -> None:
    from pipeline.distributed.replicas import DeepSpeedReplicas, deepspeed_engine
    from pipeline.distributed.checkpointing import for_each_full_parameter

    torch.set_num_threads(1)
    model, batch = build_model(), build_batch()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    cfg = DistributedConfig(enabled=True, zero_stage=stage, collectives="gloo")
    backend = DeepSpeedReplicas(deepspeed_engine(model, opt, cfg, MICRO, NO_CLIP, "float32"))
    local = rank_rows(batch, group_rows(batch, backend.rank, backend.world))
    settings, loss = UpdateSettings(MICRO, NO_CLIP, 1.0), make_policy_loss(DAPOLoss())

    def flat() -> torch.Tensor:
        parts: list[torch.Tensor] = []
        for_each_full_parameter(backend, lambda _, t: parts.append(t.detach().flatten().clone()))
        return torch.cat(parts)

    before = flat()
    metrics = apply_policy_gradient(backend, local, loss, settings)
    grad = before - flat()
    times = timed_steps(lambda: apply_policy_gradient(backend, local, loss, settings), opt, steps)
    if backend.rank == 0:
        torch.save({"loss": metrics["train/loss"], "grad_norm": metrics["train/grad_norm"], "grad": grad,
                    "times": times}, out)
    leave_process_group()


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def compare(base: dict, ours: dict) -> dict:
    return {
        "loss_abs_diff": abs(base["loss"] - ours["loss"]),
        "grad_max_abs_diff": float((base["grad"] - ours["grad"]).abs().max()),
        "grad_max_abs": float(base["grad"].abs().max()),
        "grad_norm_abs_diff": abs(base["grad_norm"] - ours["grad_norm"]),
        "step_s": statistics.median(ours["times"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the compared one")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the 1-process baseline (each rank gets 1); on a shared machine 2 "
                             "OpenMP threads can be many times slower than 1, so the default compares 1 core vs 2")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = harness.parse(parser, argv, QUICK)
    if args.worker is not None:
        worker(args.worker, args.steps, args.out)
        return
    base = single_process(args.steps, args.threads)
    report: dict = {"model_params": sum(p.numel() for p in build_model().parameters()),
                    "rows": GROUPS * GROUP_SIZE, "tokens_per_row": T, "single_step_s": statistics.median(base["times"])}
    with tempfile.TemporaryDirectory() as tmp:
        for stage in args.stages:
            out = Path(tmp) / f"zero{stage}.pt"
            program = [__file__, "--worker", str(stage), "--steps", str(args.steps), "--out", str(out)]
            t0 = time.perf_counter()
            ranks = run_ranks(program, on_this_machine(2), log_dir=Path(tmp) / f"zero{stage}_logs",
                              env=os.environ | {"OMP_NUM_THREADS": "1"}, on_line=print_to_stderr, timeout_s=900)
            if ranks.returncode != 0 or not out.is_file():
                raise SystemExit(f"ZeRO-{stage} ranks failed (launcher exit {ranks.returncode}):\n{ranks.tail}")
            report[f"zero{stage}"] = compare(base, torch.load(out)) | {"launch_s": time.perf_counter() - t0}
            report[f"zero{stage}"]["ratio"] = report["single_step_s"] / report[f"zero{stage}"]["step_s"]
    stages = [report[f"zero{s}"] for s in args.stages]
    report["max_abs_diff"] = max(max(s["loss_abs_diff"], s["grad_max_abs_diff"]) for s in stages)
    report["ratio"] = report[f"zero{args.stages[0]}"]["ratio"]  # ZeRO-2 by default: the recommended stage
    report["baseline_threads"] = args.threads
    harness.last_line(report, args.quick)


if __name__ == "__main__":
    main()
