"""Admitting fresh prompts to the hf decoder: the shared system turn prefilled once (ours) vs with every prompt.

Every TAPO prompt offering both tools opens with the same system turn (rules and one example per tool,
274 of ~313 tokens with SmolLM2's template). Ours: each `Sequence` carries `shared_prefix_len` (what the
rollout engine sets), and the decoder prefills that turn once and starts each fresh row from a copy of its
cache. Baseline: the same sequences with `shared_prefix_len = 0`, each prompt prefilled whole (the decoder
before this change). Both arms decode the real SmolLM2-135M (`models/sft`, else `models/base`) greedily,
`--tokens` tokens a row, over `--prompts` calculator questions admitted `--rows` at a time (an evaluation
chunk, or a rollout step's fresh groups), with no tool calls, so the arms differ in the prefill only. The
order alternates across repeats (machines here are noisy); each arm's best repeat is reported. Greedy
tokens are compared row by row: a prefill split in two rounds differently, so a rare near-tie may flip.
Last line: one JSON object; `ratio` = our prompts/s / baseline prompts/s.

    .venv/bin/python -m benchmarks.system_turn_prefix [--prompts 48] [--rows 16] [--tokens 32] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.preset_run import policy_dir, workspace
from pipeline.data.calculator import generate
from pipeline.model import load_policy
from pipeline.rollout.engine import encode_prompt, system_turn_length
from pipeline.rollout.backends.decoding import SamplingParams
from pipeline.rollout.backends.hf import HFDecoder
from pipeline.protocols import TapoProtocol
from pipeline.rollout.sequence import Sequence

TOOLS = ("search", "code")
QUICK = {"prompts": 2, "rows": 2, "tokens": 2, "repeats": 1, "threads": 1}


class AllAtOnce:
    """Hands out every sequence as soon as there is room; a segment's end finishes its row."""

    def __init__(self, seqs: list[Sequence]) -> None:
        self.pending, self.left = list(seqs), len(seqs)

    def take_ready(self, max_n: int) -> list[tuple[Sequence, tuple[str, ...]]]:
        taken, self.pending = self.pending[:max_n], self.pending[max_n:]
        return [(seq, ()) for seq in taken]

    def wait_ready(self, timeout_s: float) -> None:
        pass

    def unfinished(self) -> int:
        return self.left

    def segment_ended(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = "max_tokens"
        self.left -= 1


def fresh_rows(tokenizer, n: int, shared: bool) -> list[Sequence]:
    protocol, rows = TapoProtocol(), []
    for problem in generate(n, seed=7):
        prompt = encode_prompt(tokenizer, protocol, problem, TOOLS)
        prefix = system_turn_length(tokenizer, protocol, problem, TOOLS, prompt) if shared else 0
        rows.append(Sequence(problem=problem, tools=TOOLS, prompt_ids=prompt, shared_prefix_len=prefix))
    return rows


def timed(model, tokenizer, args, shared: bool) -> tuple[float, list[Sequence], int]:
    """Seconds, the finished rows, and the prompt tokens prefilled."""
    seqs = fresh_rows(tokenizer, args.prompts, shared)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_policy_tokens=args.tokens, max_total_tokens=4096)
    decoder = HFDecoder(model, tokenizer, params, max_batch=args.rows)
    t0 = time.perf_counter()
    stats = decoder.run(AllAtOnce(seqs))
    return time.perf_counter() - t0, seqs, stats.prefill_tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--rows", type=int, default=16, help="rows decoded together (rollout.max_batch_sequences)")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens a row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None,
                        help="model dir (default: models/sft, else models/base; --quick: the tiny one)")
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    with workspace(None, args.quick) as ws:
        model_dir = args.model or policy_dir(ws)
        model, tokenizer = load_policy(model_dir, "float32")
    seconds: dict[str, list[float]] = {"ours": [], "baseline": []}
    rows: dict[str, list[Sequence]] = {}
    prefilled: dict[str, int] = {}
    for r in range(args.repeats):
        for name in ("ours", "baseline") if r % 2 == 0 else ("baseline", "ours"):
            s, rows[name], prefilled[name] = timed(model, tokenizer, args, shared=name == "ours")
            seconds[name].append(s)
            print(f"repeat {r} {name}: {s:.2f} s, {prefilled[name]} prompt tokens prefilled", flush=True)
    ours_s, base_s = min(seconds["ours"]), min(seconds["baseline"])
    same = sum(a.response_ids == b.response_ids for a, b in zip(rows["ours"], rows["baseline"], strict=True))
    system_turn = rows["ours"][0].shared_prefix_len
    print(f"ours {args.prompts / ours_s:.2f} prompts/s, baseline {args.prompts / base_s:.2f} prompts/s, "
          f"ratio {base_s / ours_s:.2f}; system turn {system_turn} tokens; same greedy tokens on {same}/{args.prompts}")
    harness.last_line({"model": model_dir.name, "prompts": args.prompts, "rows": args.rows, "tokens": args.tokens,
                       "repeats": args.repeats, "threads": args.threads, "system_turn_tokens": system_turn,
                       "ours_s": round(ours_s, 3), "baseline_s": round(base_s, 3),
                       "ours_prefill_tokens": prefilled["ours"], "baseline_prefill_tokens": prefilled["baseline"],
                       "same_greedy_rows": same, "ratio": round(base_s / ours_s, 3)}, args.quick)


if __name__ == "__main__":
    main()
