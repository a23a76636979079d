"""Seconds per training update with micro-batches cut to their own longest row vs padded to the batch's.

A TAPO step mixes short calculator rollouts (~400 tokens with the system prompt) and long search
rollouts (~600 tokens, up to rollout.max_total_tokens): padded to the longest row of the batch, every
micro-batch pays for it. The row lengths below were measured on the learning_cpu task mix (one step's
calculator and fact groups of 8, SmolLM2-135M policy); the token ids are random (the cost does not depend
on them). Both sides run the same `policy_gradient_step` (DAPO loss, KL-free), alternately in one process;
the baseline only swaps in micro-batches that keep the full width. Prefixes are not shared here (as under
gradient checkpointing): where they are, the prefix tree (`pipeline.trainer.prefix_tree`) runs no padding at
all, so the cut no longer matters there.

    python benchmarks/trim_micro_batches.py [--reps 2] [--threads 2] [--quick]
Last line: one JSON object; "ratio" = padded seconds / trimmed seconds on the typical step (higher is better).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipeline.trainer.update as update  # noqa: E402
from benchmarks import harness
from benchmarks.update_bench import args_and_base_model, swapped  # noqa: E402
from pipeline.config.train import DAPOLoss  # noqa: E402
from pipeline.rl.loss import make_policy_loss  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402

# (prompt tokens, total tokens per row) per group, from one learning_cpu step each
STEPS = {
    "typical": [(309, [392, 390, 396, 404, 377, 402, 386, 407]), (293, [622, 596, 594, 591, 592, 593, 597, 632])],
    "long_outlier": [(352, [942, 1024, 1024, 643, 449, 1024, 430, 528]),
                     (294, [606, 603, 610, 603, 606, 604, 602, 603])],
}


def step_batch(groups: list[tuple[int, list[int]]], vocab: int, seed: int = 0) -> TrainBatch:
    """Right-padded rows; a group's rows share their prompt; every response token is trained."""
    g = torch.Generator().manual_seed(seed)
    rows = [(p, n) for p, lengths in groups for n in lengths]
    width = max(n for _, n in rows)
    ids = torch.randint(0, vocab, (len(rows), width), generator=g)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(rows), width)
    start = 0
    for p, lengths in groups:
        ids[start:start + len(lengths), :p] = ids[start, :p]
        start += len(lengths)
    for i, (p, n) in enumerate(rows):
        attn[i, :n] = 1
        mask[i, p:n] = 1
    adv = torch.randn(len(rows), 1, generator=g).expand(-1, width) * mask
    old = -torch.rand(len(rows), width, generator=g) * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()))


def padded_micro_batches(batch: TrainBatch, size: int) -> list[TrainBatch]:
    """The baseline: consecutive rows at the batch's full width."""
    return [batch.select(slice(i, i + size)) for i in range(0, len(batch), size)]


def seconds_per_update(model, batch: TrainBatch, padded: bool) -> float:
    settings = update.UpdateSettings(micro_batch_size=8, grad_clip=1.0, temperature=1.0, share_prefixes=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the same weights for every run
    with swapped("micro_batches", padded_micro_batches if padded else update.micro_batches):
        t = time.perf_counter()
        update.policy_gradient_step(model, optimizer, batch, make_policy_loss(DAPOLoss()), settings)
        return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    args, model, tokenizer = args_and_base_model(__doc__.splitlines()[0], argv)
    figures: dict[str, dict[str, float]] = {}
    for name, groups in STEPS.items():
        batch = step_batch(groups, len(tokenizer))
        times: dict[str, list[float]] = {"trimmed": [], "padded": []}
        for _ in range(args.reps):
            for side in times:  # alternate, so drift on a noisy machine hits both sides
                times[side].append(seconds_per_update(model, batch, padded=side == "padded"))
        best = {side: min(v) for side, v in times.items()}
        figures[name] = {f"{side}_s": round(s, 2) for side, s in best.items()} | {
            "speedup": round(best["padded"] / best["trimmed"], 3), "rows": len(batch),
            "width": batch.input_ids_BT.shape[1]}
        print(name, figures[name], flush=True)
    harness.last_line({"steps": figures, "ratio": figures["typical"]["speedup"], "reps": args.reps,
                       "threads": args.threads}, args.quick)


if __name__ == "__main__":
    main()
