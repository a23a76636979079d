"""Decoding steps through the hf decoder's KV cache: ours (`GrowingCache`) vs transformers' `DynamicCache`.

Both decode the real SmolLM2-135M (`models/sft`, else `models/base`) one token per row per step from
a context of T tokens, B rows, feeding the greedy token back; the only difference is the cache class:
- ours: `GrowingCache`, what `HFDecoder` builds (keys and values appended in place into a buffer
  with headroom);
- baseline: `DynamicCache`, which `torch.cat`s the whole cache of every layer on every step.
The two must give bit-identical logits (checked; the JSON says so). Order alternates across
repeats (machines here are noisy). Last line: one JSON object; `ratio` = our steps/s / baseline
steps/s at the headline shape (the first of `--shapes`, B 16, T 400: a group's rows over a system prompt and a tool
turn).

    .venv/bin/python -m benchmarks.kv_cache [--repeats 3] [--steps 32] [--threads 2] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from benchmarks import harness
from benchmarks.preset_run import policy_dir, workspace
from pipeline.model import load_policy
from pipeline.rollout.kv_cache import GrowingCache

SHAPES = ((16, 400), (16, 800), (64, 400))  # (rows B, context tokens T)
QUICK = {"repeats": 1, "steps": 2, "threads": 1, "shapes": ["2x16"]}


def context_kv(model, B: int, T: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The real cache of B random T-token contexts (prefilled in chunks of rows to bound memory)."""
    g = torch.Generator().manual_seed(B * 100_003 + T)
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=g)
    parts = []
    with torch.no_grad():
        for chunk in ids.split(8):
            out = model(input_ids=chunk, use_cache=True, logits_to_keep=1)
            parts.append([(layer.keys, layer.values) for layer in out.cache.layers])
    return [(torch.cat([p[i][0] for p in parts]), torch.cat([p[i][1] for p in parts])) for i in range(len(parts[0]))]


def decode(model, cache, B: int, T: int, steps: int) -> tuple[float, torch.Tensor]:
    """Seconds per step and the last step's logits [B, V]."""
    attn = torch.ones(B, T, dtype=torch.long)
    token = torch.zeros(B, 1, dtype=torch.long)
    t0 = time.perf_counter()
    with torch.no_grad():
        for s in range(steps):
            attn = torch.cat([attn, torch.ones(B, 1, dtype=torch.long)], dim=1)
            out = model(input_ids=token, attention_mask=attn, position_ids=torch.full((B, 1), T + s), cache=cache,
                        use_cache=True)
            cache = out.cache
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return (time.perf_counter() - t0) / steps, out.logits[:, -1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=[f"{b}x{t}" for b, t in SHAPES],
                        help="rows x context tokens; the first is the headline")
    parser.add_argument("--model", type=Path, default=None,
                        help="model dir (default: models/sft, else models/base; --quick: the tiny one)")
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes]
    with workspace(None, args.quick) as ws:
        model_dir = args.model or policy_dir(ws)
        model = load_policy(model_dir, "float32")[0].eval()
    figures: dict[str, dict[str, float]] = {}
    for B, T in shapes:
        kv = context_kv(model, B, T)
        times: dict[str, list[float]] = {"ours": [], "baseline": []}
        identical = True
        for r in range(args.repeats):
            order = ("ours", "baseline") if r % 2 == 0 else ("baseline", "ours")
            logits = {}
            for name in order:
                cache = GrowingCache(kv) if name == "ours" else DynamicCache(ddp_cache_data=kv)
                seconds, logits[name] = decode(model, cache, B, T, args.steps)
                times[name].append(seconds)
            identical &= torch.equal(logits["ours"], logits["baseline"])
        ours_s, base_s = min(times["ours"]), min(times["baseline"])
        key = f"B{B}_T{T}"
        figures[key] = {"ours_steps_per_s": 1 / ours_s, "baseline_steps_per_s": 1 / base_s, "ratio": base_s / ours_s,
                        "identical_logits": identical}
        print(f"B={B} T={T}: ours {1000 * ours_s:.1f} ms/step, DynamicCache {1000 * base_s:.1f} ms/step, "
              f"ratio {base_s / ours_s:.2f}, identical logits: {identical}", flush=True)
    headline = figures[f"B{shapes[0][0]}_T{shapes[0][1]}"]
    harness.last_line({"model": model_dir.name, "steps": args.steps, "repeats": args.repeats, "threads": args.threads,
                       **figures, "ratio": headline["ratio"],
                       "identical_logits": all(f["identical_logits"] for f in figures.values())}, args.quick)


if __name__ == "__main__":
    main()
