"""A step's rollout with dynamic sampling: refilled and wide (ours) vs generation rounds of 16 rows (baseline).

On 2 CPU cores a decoding step of SmolLM2-135M costs nearly as much for 4 rows as for 16 (measured
here in the same run: the last JSON's `decode_ms_by_rows`), so a rollout lasts about as long as its
longest row. DAPO's generation rounds then pay that tail once per round, and rows beyond
`rollout.max_batch_sequences` decode in a thin wave behind the first. Settings (`mode@rows`):
- baseline `rounds@16`: what learning_cpu ran through run 11 (params.yaml's 16 rows then, rounds);
- `rounds@24`: the same rounds with room for a whole 3 x 8 first round;
- ours `refill@24`: `train.sampling.refill_dropped_groups` (pipeline.sampling.dynamic_sampling), 24 rows.
Each setting is a trainer built by `pipeline.train.set_up` from the SFT model of a workspace where the
learning-cpu preset ran (`benchmarks.preset_run`), with the preset's RL settings but for the setting's two knobs,
`--prompts` and `--seed`, the real sandbox and search services, and its own problem stream and engine with the
same seed (the same problems in the same order); steps only sample (no update), so every step samples the same SFT policy. Settings alternate their order across steps (machines here are
noisy). Speed = kept groups per second of rollout (what a training step needs).
Last line: one JSON object; `ratio` = ours / baseline kept groups per second.

    .venv/bin/python -m benchmarks.dynamic_sampling_rollout [--run WORKSPACE] [--steps 5] [--quick]

`--run` is a pipeline workspace where the learning-cpu preset ran (default: this repo; e.g. after
`dvc exp apply learning-cpu-s0`): its models/sft and data/curated/train.jsonl.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.preset_run import PresetRun, preset_config, preset_run_or_exit, workspace
from flows.common import tools_needed
from flows.services import running_services
from pipeline.model import load_policy
from pipeline.config import RunConfig
from pipeline.rollout.kv_cache import GrowingCache
from pipeline.train import Training, set_up
from pipeline.types import Collected

SETTINGS = {"rounds@16": (False, 16), "rounds@24": (False, 24), "refill@24": (True, 24)}
BASELINE, OURS = "rounds@16", "refill@24"
QUICK = {"steps": 3, "prompts": 3}  # enough draws that each setting keeps a group (a ratio of kept groups)


@dataclasses.dataclass
class Tally:
    seconds: float = 0.0
    kept: int = 0
    drawn: int = 0
    policy_tokens: int = 0
    decode_steps: int = 0
    decode_rows: int = 0

    def add(self, metrics: dict, seconds: float) -> None:
        self.seconds += seconds
        self.kept += round(metrics["train/kept_group_fraction"] * metrics["train/problems_drawn"])
        self.drawn += int(metrics["train/problems_drawn"])
        self.policy_tokens += round(metrics["rollout/mean_policy_tokens"] * metrics["rollout/trajectories"])
        self.decode_steps += int(metrics["rollout/decode_steps"])
        self.decode_rows += round(metrics["rollout/rows_per_decode_step"] * metrics["rollout/decode_steps"])

    def figures(self, steps: int) -> dict:
        return {"seconds_per_step": round(self.seconds / steps, 1), "kept_groups": self.kept,
                "problems_drawn": self.drawn, "kept_groups_per_s": round(self.kept / self.seconds, 4),
                "policy_tokens_per_s": round(self.policy_tokens / self.seconds, 1),
                "rows_per_decode_step": round(self.decode_rows / max(self.decode_steps, 1), 2)}


def collected(t: Training) -> Collected:
    """One step's sampling, as `pipeline.train.run` makes it."""
    return t.sampler.collect(t.rollouts, t.stream, t.reward, t.keep)


def decode_ms_by_rows(model_dir: str, rows: tuple[int, ...] = (4, 8, 16, 24, 32), context: int = 300) -> dict:
    """Milliseconds per decoding step of B rows over a `context`-token cache (the latency argument above)."""
    model, _ = load_policy(model_dir, "float32")
    model.eval()
    out = {}
    for b in rows:
        with torch.no_grad():
            ids = torch.randint(0, model.config.vocab_size, (b, context), generator=torch.Generator().manual_seed(b))
            prefill = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = GrowingCache([(layer.keys, layer.values) for layer in prefill.cache.layers], context + 40)
            attn, token = torch.ones(b, context, dtype=torch.long), torch.zeros(b, 1, dtype=torch.long)
            for s in range(28):
                if s == 4:
                    t0 = time.perf_counter()
                attn = torch.cat([attn, torch.ones(b, 1, dtype=torch.long)], 1)
                step = model(input_ids=token, attention_mask=attn, position_ids=torch.full((b, 1), context + s),
                             cache=cache, use_cache=True)
                token = step.logits[:, -1].argmax(-1, keepdim=True)
        out[str(b)] = round((time.perf_counter() - t0) / 24 * 1000, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="a pipeline workspace where the learning-cpu preset ran (its models/sft and "
                             "data/curated/train.jsonl; default: this repo)")
    parser.add_argument("--steps", type=int, default=5, help="rollout steps per setting")
    parser.add_argument("--prompts", type=int, default=3, help="problems per step")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    args = harness.parse(parser, argv, QUICK)
    with workspace(args.run, args.quick) as root, tempfile.TemporaryDirectory(prefix="dynamic-sampling-") as tmp:
        out = measure(args, preset_run_or_exit(root), Path(tmp))
    harness.last_line(out, args.quick)


def measure(args: argparse.Namespace, run: PresetRun, work: Path) -> dict:
    """The settings' figures, each setting's trainer working under `work`."""

    def config(name: str) -> RunConfig:  # the preset's RL settings, this setting's two knobs
        refill, rows = SETTINGS[name]
        return preset_config(run.root, work / name, {
            "run.seed": args.seed, "train.sampling.prompts_per_step": args.prompts, "train.sampling.max_gen_rounds": 2,
            "train.sampling.refill_dropped_groups": refill, "rollout.max_batch_sequences": rows})

    latency = decode_ms_by_rows(str(run.sft))
    print(f"decode ms/step by rows: {latency}", flush=True)
    tallies = {name: Tally() for name in args.settings}
    cfg = config(args.settings[0])
    with running_services(cfg, tools_needed(run.train), str(run.preset), log_dir=work / "logs") as urls:
        trainers = {name: set_up(config(name), urls) for name in args.settings}
        for k in range(args.steps):
            for name in (args.settings if k % 2 == 0 else args.settings[::-1]):
                t0 = time.perf_counter()
                metrics = collected(trainers[name]).metrics
                tallies[name].add(metrics, time.perf_counter() - t0)
                print(f"step {k} {name}: {time.perf_counter() - t0:.1f} s, drew {metrics['train/problems_drawn']:.0f}, "
                      f"kept {metrics['train/kept_group_fraction']:.2f}", flush=True)
        for tr in trainers.values():
            tr.engine.close()
    out = {"steps": args.steps, "prompts": args.prompts, "group": cfg.rollout.group_size, "seed": args.seed,
           "decode_ms_by_rows": latency, "settings": {n: t.figures(args.steps) for n, t in tallies.items()}}
    if BASELINE in tallies and OURS in tallies:
        out["ratio"] = round(tallies[OURS].kept / tallies[OURS].seconds / (tallies[BASELINE].kept / tallies[BASELINE].seconds), 3)
    return out


if __name__ == "__main__":
    main()
