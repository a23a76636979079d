"""The importance ratio's precision gap under `train.update.autocast: bfloat16`, with each `train.update.logprobs_source`.

The rollout samples in float32; under autocast the update's forward runs in bf16. With
`logprobs_source: rollout` the ratio's old log-probs are the sampler's, so at the first update (same
weights) the ratio already differs from 1 by the precision gap. With `recompute` the old log-probs come
from `pipeline.train.recompute_old_logprobs`: the update's own forward (same precision, packing and head),
without gradient, before any step; the gap should vanish. Measured here on sampled groups, per side:
mean, 95th percentile and max of |log pi_update - log pi_old| over the trained tokens, and the share of
tokens whose ratio already lies outside DAPO's clip range [0.8, 1.28]; float32 without autocast is the
control (the decoder's KV-cache arithmetic against one full pass).

The groups: with `--run` (a pipeline workspace where the learning-cpu preset ran, e.g. after
`dvc exp apply learning-cpu-s0`), its SFT model samples its training mix with the real tools
(`benchmarks/shared_prefix_update.sample_groups`); without it, a small Llama (hidden 256,
4 layers) is cold-started on the tool-free toy coin flip of tests/train/toy_task.py and samples
`--groups` groups of `--group-size` with the hf backend.

    python benchmarks/autocast_logprob_gap.py [--run WORKSPACE] [--groups 8] [--threads 2] [--quick]
Last line: one JSON object; "ratio" = mean gap with recompute / mean gap with rollout log-probs
(ours / baseline, lower is better), and each side's numbers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from pipeline.trainer.batching import make_train_batch  # noqa: E402
from pipeline.model import load_policy  # noqa: E402
from pipeline.rollout.engine import RolloutEngine  # noqa: E402
from pipeline.sft import sft_step, to_batch  # noqa: E402
from pipeline.types import Group, RewardBreakdown, ScoredGroup, TrainBatch  # noqa: E402
from pipeline.trainer.update import masked_logprobs_no_grad, micro_batches, padded_cat, token_logprobs_and_entropy  # noqa: E402
from tests.train.toy_task import direct_traces, toy_problems, toy_tokenizer  # noqa: E402

EPS_LOW, EPS_HIGH = 0.2, 0.28
MICRO = 4  # params.yaml's train.update.micro_batch_size
QUICK = {"groups": 2, "group_size": 2, "sft_steps": 2, "threads": 1}


def cold_started_model(sft_steps: int, seed: int):
    tokenizer = toy_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=704,
                                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                                         max_position_embeddings=2048, tie_word_embeddings=False))
    batch = to_batch(direct_traces(tokenizer), tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.0)
    for _ in range(sft_steps):
        sft_step(model, optimizer, batch, micro_size=4)
    return model, tokenizer


def toy_groups(model, tokenizer, n_groups: int, group_size: int, seed: int, quick: bool) -> list[Group]:
    cfg = harness.derive({"rollout.max_policy_tokens": 48, "rollout.max_tool_calls": 0}, harness.base_params(quick))
    with RolloutEngine(model, tokenizer, {}, cfg.rollout, seed=seed) as engine:
        return engine.rollout(toy_problems(n_groups), group_size).groups


def as_batch(groups: list[Group], pad_id: int) -> TrainBatch:
    scored = [ScoredGroup(g, tuple(RewardBreakdown(True, 0.0, 0.0, 0.0) for _ in g.trajectories)) for g in groups]
    advantages = [torch.zeros(len(t.response_ids)).numpy() for g in groups for t in g.trajectories]
    return make_train_batch(scored, advantages, pad_id)


def update_logprobs(model, batch: TrainBatch, autocast: torch.dtype | None) -> torch.Tensor:
    """The update's forward as `policy_gradient_step` runs it (train mode, with gradient, packed rows, the
    same micro-batches as the recompute pass)."""
    model.train()
    parts = [token_logprobs_and_entropy(model, micro, 1.0, share_prefixes=True, autocast=autocast)[0].detach()
             for micro in micro_batches(batch, MICRO)]
    return padded_cat(parts, batch.input_ids_BT.shape[1]) * batch.loss_mask_BT


def gap_stats(new_BT: torch.Tensor, old_BT: torch.Tensor, mask_BT: torch.Tensor) -> dict[str, float]:
    gaps = (new_BT - old_BT)[mask_BT.bool()].double()
    ratio = gaps.exp()
    return {"mean_abs_logprob_gap": float(gaps.abs().mean()), "p95_abs_logprob_gap": float(gaps.abs().quantile(0.95)),
            "max_abs_logprob_gap": float(gaps.abs().max()),
            "outside_clip_range": float(((ratio < 1 - EPS_LOW) | (ratio > 1 + EPS_HIGH)).double().mean()),
            "tokens": int(gaps.numel())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="a pipeline workspace where the learning-cpu preset ran (its models/sft and "
                             "data/curated/train.jsonl)")
    parser.add_argument("--groups", type=int, default=8, help="groups (per source with --run)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    if args.run is not None:
        from benchmarks.preset_run import preset_run_or_exit
        from benchmarks.shared_prefix_update import sample_groups
        source = str(preset_run_or_exit(args.run).sft)
        groups, _ = sample_groups(args.run, args.groups, args.seed, reps=0)
        model, tokenizer = load_policy(source, "float32", "cpu")
    else:
        model, tokenizer = cold_started_model(args.sft_steps, args.seed)
        groups = toy_groups(model, tokenizer, args.groups, args.group_size, args.seed, args.quick)
        source = f"cold-started Llama h256 x4 layers ({sum(p.numel() for p in model.parameters())} parameters)"
    batch = as_batch(groups, tokenizer.pad_token_id)
    bf16 = torch.bfloat16
    recomputed = masked_logprobs_no_grad(model.eval(), batch, MICRO, 1.0, bf16)  # pipeline.train.recompute_old_logprobs
    sides = {
        "rollout_autocast": gap_stats(update_logprobs(model, batch, bf16), batch.old_logprobs_BT, batch.loss_mask_BT),
        "recompute_autocast": gap_stats(update_logprobs(model, batch, bf16), recomputed, batch.loss_mask_BT),
        "rollout_float32": gap_stats(update_logprobs(model, batch, None), batch.old_logprobs_BT, batch.loss_mask_BT),
    }
    for side, stats in sides.items():
        print(side, stats, flush=True)
    rollout_gap = sides["rollout_autocast"]["mean_abs_logprob_gap"]
    ratio = sides["recompute_autocast"]["mean_abs_logprob_gap"] / rollout_gap if rollout_gap else float("nan")
    harness.last_line({"ratio": ratio, "sides": sides, "model": source, "groups": len(groups),
                       "trajectories": len(batch), "threads": args.threads}, args.quick)


if __name__ == "__main__":
    main()
