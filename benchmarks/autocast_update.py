"""Seconds per training update in bf16 mixed precision (`train.update.autocast`) vs float32, on real groups.

Ours runs the update's forward (policy, and the KL reference's no-grad pass) under `torch.autocast`
to bf16, with float32 weights, gradients, optimiser state and output head; the baseline is the same
update in float32 throughout (what the trainer ran before, and still runs by default). Both sides run
the same `policy_gradient_step` (DAPO loss with a KL term, one micro-batch per group as a prefix tree,
lr 0) on the same groups, alternately in one process.

The price of the cast is measured too: the rollout samples in float32, so the update's log-probs
differ from the sampler's even before any step. Per side: the mean and 95th percentile of
|log pi_update - log pi_sampler| over the trained tokens, and the share of tokens whose importance
ratio already lies outside DAPO's clip range [1 - 0.2, 1 + 0.28] from that difference alone.

The groups are real: the SFT model of a workspace where the learning-cpu preset ran samples them (the preset's
RL rollout settings, the real sandbox and search service; `shared_prefix_update.sample_groups`) for `--groups`
problems per source of its training mix.

Each side's first pass over a group is timed apart from its fastest pass: in training every update meets
new shapes (its packed length), and kernels built per shape on first use would show in the first pass
only (measured: first and fastest passes give the same ratio, 1.49 against 1.50).

    python benchmarks/autocast_update.py [--run WORKSPACE] [--groups 3] [--reps 2] [--threads 2] [--quick]
`--run`: a pipeline workspace where the learning-cpu preset ran (default: this repo; e.g. after
`dvc exp apply learning-cpu-s0`), its models/sft and data/curated/train.jsonl.
Last line: one JSON object; "ratio" = float32 seconds / autocast seconds over all the groups on each side's
first pass (update + reference pass; higher is better); "ratio_repeat" the same on the fastest pass; per
source each side's seconds; per side the log-prob mismatch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from benchmarks.preset_run import preset_run_or_exit, workspace  # noqa: E402
from benchmarks.shared_prefix_update import group_batch, sample_groups  # noqa: E402
from benchmarks.update_bench import timed_update  # noqa: E402
from pipeline.model import load_policy  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402
from pipeline.trainer.update import token_logprobs_and_entropy  # noqa: E402

SIDES = {"float32": None, "autocast": torch.bfloat16}
EPS_LOW, EPS_HIGH = 0.2, 0.28  # DAPO's clip range (params.yaml)
QUICK = {"groups": 1, "reps": 1, "threads": 1}


def sampler_gaps(model: torch.nn.Module, batch: TrainBatch, autocast: torch.dtype | None) -> torch.Tensor:
    """|log pi_update - log pi_sampler| at the trained tokens, before any step (same weights)."""
    with torch.no_grad():
        logprobs, _ = token_logprobs_and_entropy(model, batch, 1.0, with_entropy=False, share_prefixes=True,
                                                 autocast=autocast)
    scored = batch.loss_mask_BT.bool()
    return (logprobs - batch.old_logprobs_BT)[scored].float()


def mismatch(gaps: torch.Tensor) -> dict[str, float]:
    ratio = gaps.exp()
    return {"mean_abs_logprob_gap": round(float(gaps.abs().mean()), 5),
            "p95_abs_logprob_gap": round(float(gaps.abs().quantile(0.95)), 5),
            "outside_clip_range": round(float(((ratio < 1 - EPS_LOW) | (ratio > 1 + EPS_HIGH)).float().mean()), 5),
            "tokens": int(gaps.numel())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="a pipeline workspace where the learning-cpu preset ran (its models/sft and "
                             "data/curated/train.jsonl; default: this repo)")
    parser.add_argument("--groups", type=int, default=3, help="groups sampled per source")
    parser.add_argument("--reps", type=int, default=2, help="alternations of the two sides")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    with workspace(args.run, args.quick) as root:
        groups, _ = sample_groups(root, args.groups, args.seed, reps=0)
        model, tokenizer = load_policy(str(preset_run_or_exit(root).sft), "float32", "cpu")
    seconds: dict[str, dict[str, float]] = {}
    gaps: dict[str, list[torch.Tensor]] = {side: [] for side in SIDES}
    for i, group in enumerate(groups):
        batch = group_batch(group, tokenizer.pad_token_id, args.seed + i)
        passes: dict[str, list[float]] = {side: [] for side in SIDES}
        for _ in range(max(args.reps, 1)):
            for side, autocast in SIDES.items():  # alternate, so drift on a noisy machine hits both sides
                r = timed_update(model, batch, len(batch), autocast=autocast)
                passes[side].append(r["update_s"] + r["reference_s"])
        timed = {f"{side}_first": p[0] for side, p in passes.items()} | {f"{side}_best": min(p) for side, p in passes.items()}
        for side, autocast in SIDES.items():
            gaps[side].append(sampler_gaps(model, batch, autocast))
        row = {key: round(s, 2) for key, s in timed.items()} | {"tokens": int(batch.attention_mask_BT.sum())}
        print(group.problem.source, group.problem.id, row, flush=True)
        per_source = seconds.setdefault(group.problem.source, dict.fromkeys(timed, 0.0) | {"groups": 0})
        per_source.update({key: round(per_source[key] + s, 2) for key, s in timed.items()})
        per_source["groups"] += 1
    def ratio(kind: str) -> float:  # float32 seconds / autocast seconds over every group, on `kind` passes
        return round(sum(s[f"float32_{kind}"] for s in seconds.values())
                     / sum(s[f"autocast_{kind}"] for s in seconds.values()), 3)

    harness.last_line({"ratio": ratio("first"), "ratio_repeat": ratio("best"), "seconds": seconds,
                       "sampler_mismatch": {side: mismatch(torch.cat(g)) for side, g in gaps.items()},
                       "groups_per_source": args.groups, "reps": args.reps, "threads": args.threads}, args.quick)


if __name__ == "__main__":
    main()
