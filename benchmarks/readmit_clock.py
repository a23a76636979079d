"""What the decoding clock costs: continuous scheduling with rows rejoining on arrival (`readmit_after_steps: 0`,
latency-dependent log-prob rounding) against rows rejoining at a step fixed when they called (`readmit_after_steps`
k > 0, bit-identical whatever the tool latency), with turn-synchronous rounds as the floor.

Same model, prompts, tools and scripts for every configuration: a randomly initialised Llama (`--layers` x
`--hidden`, SmolLM2's vocabulary size) whose forward passes and KV caches are real; only the *choice* of each next
token is forced to a script (benchmarks.rollout_overlap.ForcedScript), so every trajectory makes exactly `--turns`
tool calls. Tools are in-process doubles that answer after a latency drawn from `--latency-ms` (a remote service);
nothing else is needed (no model download, no services).

The rollout settings are params.yaml's, with each configuration's schedule and clock and the benchmark's batch and
limits on top (loaded strictly: `benchmarks.harness.derive`).

Last line: one JSON object; `ratio` = clocked (k = `--headline-k`) traj/s over on-arrival traj/s.

    nice -n 10 .venv/bin/python -m benchmarks.readmit_clock [--trajectories 32] [--ks 0 2 8 32] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from benchmarks import harness
from benchmarks.rollout_overlap import QUERIES, ForcedScript, scripts_for
from pipeline.config.rollout import RolloutConfig
from pipeline.rollout.engine import RolloutEngine
from pipeline.protocols import TapoProtocol
from pipeline.types import Problem, ToolResult

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUICK = {"trajectories": 2, "turns": 2, "filler": [2, 4], "latency_ms": [1.0, 5.0], "ks": [0, 2], "headline_k": 2,
         "repeats": 1, "max_batch": 2, "layers": 1, "hidden": 32, "vocab": 2000, "threads": 1}


class DelayedTool:
    """A tool double answering after a random latency (seeded: the same draws for every configuration)."""

    def __init__(self, name: str, low_ms: float, high_ms: float, seed: int) -> None:
        self.name, self.low, self.high, self.rng = name, low_ms, high_ms, random.Random(seed)

    async def __call__(self, call_input: str) -> ToolResult:
        await asyncio.sleep(self.rng.uniform(self.low, self.high) / 1000)
        text = f"Doc 1 (Title: {call_input}) {call_input} is described here." if self.name == "search" else "42"
        return ToolResult(text, ok=True, latency_s=0.0)

    async def aclose(self) -> None:
        pass


def tokenizer_for(problems: list[Problem], scripts: dict[str, list[str]]) -> PreTrainedTokenizerFast:
    protocol = TapoProtocol()
    corpus = [m["content"] for p in problems[:1] for m in protocol.messages(p, ("search", "code"))]
    corpus += [s for segs in scripts.values() for s in segs] + [protocol.wrap_output(q) for q in QUERIES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus * 3, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_llama(layers: int, hidden: int, vocab: int) -> LlamaForCausalLM:
    heads = max(hidden // 64, 1)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                      max_position_embeddings=8192, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).eval()


def rollout_config(args, schedule: str, k: int) -> RolloutConfig:
    """params.yaml's rollout settings with this configuration's schedule and clock (refilled dynamic sampling, a
    training setting, is off: it needs the continuous schedule)."""
    turns = args.turns
    return harness.derive({
        "train.sampling.refill_dropped_groups": False, "rollout.schedule": schedule, "rollout.readmit_after_steps": k,
        "rollout.max_batch_sequences": args.max_batch, "rollout.max_tool_calls": turns, "rollout.max_turns": turns + 1,
        "rollout.max_policy_tokens": (60 + args.filler[1]) * (turns + 1), "rollout.max_total_tokens": 4096,
        "rollout.temperature": 1.0}, harness.base_params(args.quick)).rollout


def measure(model, tok, problems, scripts, args, cfg: RolloutConfig) -> dict:
    turns = args.turns
    tools = {name: DelayedTool(name, *args.latency_ms, seed=i) for i, name in enumerate(("search", "code"))}
    engine = RolloutEngine(ForcedScript(model, tok, scripts), tok, tools, cfg, seed=0)
    t0 = time.perf_counter()
    result = engine.rollout(problems, 1)
    wall = time.perf_counter() - t0
    engine.close()
    trajs = [t for g in result.groups for t in g.trajectories]
    assert all(len(t.tool_calls) == turns and t.finish_reason == "answer" for t in trajs)
    return {"traj_per_s": len(trajs) / wall, "idle_fraction": result.stats.idle_fraction}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--filler", type=int, nargs=2, default=[4, 40])
    ap.add_argument("--latency-ms", type=float, nargs=2, default=[100.0, 500.0])
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 2, 8, 32], help="readmit_after_steps values (0 = on arrival)")
    ap.add_argument("--headline-k", type=int, default=None, help="default: params' rollout.readmit_after_steps")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=49152, help="SmolLM2's (sampling cost grows with it)")
    ap.add_argument("--threads", type=int, default=2)
    args = harness.parse(ap, argv, QUICK)
    if args.headline_k is None:
        args.headline_k = harness.derive(params=harness.base_params(args.quick)).rollout.readmit_after_steps
    torch.set_num_threads(args.threads)
    problems = [Problem(f"b{i}", f"Question {i}: combine the facts.", ("0",), "complex", "bench", "test")
                for i in range(args.trajectories)]
    scripts = scripts_for(problems, args.turns, tuple(args.filler))
    tok = tokenizer_for(problems, scripts)
    model = random_llama(args.layers, args.hidden, max(args.vocab, len(tok)))
    configs = [("turn-synchronous", 0)] + [("continuous", k) for k in args.ks]
    settings = {(schedule, k): rollout_config(args, schedule, k) for schedule, k in configs}  # read once, before
    runs: dict[str, list[dict]] = {f"{s}/{k}": [] for s, k in configs}
    for r in range(args.repeats):  # alternate the order: the machine's load drifts
        for schedule, k in configs if r % 2 == 0 else configs[::-1]:
            runs[f"{schedule}/{k}"].append(measure(model, tok, problems, scripts, args, settings[(schedule, k)]))
    figures: dict = {"trajectories": args.trajectories, "turns": args.turns, "latency_ms": args.latency_ms,
                     "filler_tokens": args.filler, "model": f"{args.layers}x{args.hidden}", "threads": args.threads}
    for name, measured in runs.items():
        row = {"traj_per_s": statistics.median(m["traj_per_s"] for m in measured),
               "idle_fraction": statistics.median(m["idle_fraction"] for m in measured)}
        figures[name] = row
        print(f"{name}: traj/s {row['traj_per_s']:.3f}, generator idle {row['idle_fraction']:.1%}", flush=True)
    figures["ratio"] = figures[f"continuous/{args.headline_k}"]["traj_per_s"] / figures["continuous/0"]["traj_per_s"]
    harness.last_line(figures, args.quick)


if __name__ == "__main__":
    main()
