"""Continuous vs turn-synchronous tool scheduling in the rollout engine (issue: rollout overlap).

Same model, prompts, tools and scripts on both sides; only `rollout.schedule` differs:
- turn-synchronous (baseline): TAPO/ToRL's batch-synchronous rounds, everyone waits for the
  slowest tool of each turn;
- continuous (ours): a sequence resumes as soon as its own tool answers.

Two models, both doing real forward passes with their KV caches; only the *choice* of each
next token is forced to a script, so every trajectory makes exactly `turns` tool calls
(alternating a real search call and a real code-sandbox call) whatever the weights:
- `policy`: the real SmolLM2-135M policy (`models/sft`, else `models/base`). On 2 CPU cores
  its prefill and decoding cost ~10x the tool latency per turn, so the generator is busy
  almost all the time on either schedule: this regime shows what CPU users get.
- `scaled`: SmolLM2's tokenizer and architecture, randomly initialised with fewer, narrower
  layers (`--scaled-layers`, `--scaled-hidden`), so that one turn of generation costs about
  what a tool call costs: the balance of a GPU serving a 1-7B policy, where TAPO's appendix
  measured the generator idling on tools. This is the regime the scheduling is for.
Search calls get an injected latency drawn from [min, max] ms (a remote search API), on top
of the real local service. Generation cost, tool cost and scheduling are all real; the
script only fixes the number of turns.

Prints per configuration: trajectories/s of both schedules, their ratio, generator idle
fraction. Last line: one JSON object; `ratio` is the scaled model's at the most turns.

    nice -n 10 .venv/bin/python -m benchmarks.rollout_overlap [--models policy scaled] [--trajectories 16] [--quick]

The rollout settings are params.yaml's (`rollout`), with the benchmark's own (schedule, batch, limits) on top; the
tool services are started from the same params (`benchmarks.services`), the search service over a BM25 index of
the default corpus built here.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import Cache, DynamicCache

from benchmarks import harness
from benchmarks.preset_run import policy_dir, workspace
from benchmarks.services import tool_services
from pipeline.config.rollout import RolloutConfig
from pipeline.model import load_policy
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import Problem, ToolResult
from pipeline.rollout.engine import RolloutEngine

QUERIES = ["capital of France", "Wikipedia history", "largest ocean", "first moon landing"]
SCHEDULES = ("turn-synchronous", "continuous")  # the baseline, ours
QUICK = {"trajectories": 2, "filler": [2, 4], "turns": [2], "latency_ms": [1.0, 5.0], "repeats": 1, "max_batch": 2,
         "scaled_layers": 1, "scaled_hidden": 64, "threads": 1}


class ForcedScript(torch.nn.Module):
    """Real forward passes of `model`; the next token is forced to the trajectory's script.

    The token ids of each row ride along in one extra cache layer, which the decoder merges,
    pads and selects exactly like the model's own layers."""

    def __init__(self, model, tokenizer, scripts: dict[str, list[str]]) -> None:
        super().__init__()
        self.model, self.tok = model, tokenizer
        self.scripts = {q: [tokenizer(s, add_special_tokens=False)["input_ids"] for s in segs]
                        for q, segs in scripts.items()}
        # decoded prefix of each segment -> how many of its tokens were emitted (one lookup a step)
        self.prefixes = {q: [{tokenizer.decode(seg[:j]): j for j in range(len(seg) + 1)} for seg in segs]
                         for q, segs in self.scripts.items()}
        self.generation_config = model.generation_config
        self.header = "<|im_start|>assistant\n"
        # context -> (question, segment k, tokens emitted j) of the last step, so a step that only appended
        # the forced token advances without decoding the context again (harness cost, not the engine's)
        self.position: dict[tuple[int, ...], tuple[str, int, int]] = {}

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        ids = input_ids[:, None, :, None].float()
        # The model's layers are handed over as they are, so the decoder's cache class (and its in-place
        # appends) is what gets measured; the history layer is appended the same way.
        real_cache = None if cache is None else Cache(layers=cache.layers[:-1])
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=real_cache, use_cache=True, logits_to_keep=1)
        if cache is None:
            history = ids
            out.cache = DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in out.cache.layers]
                                     + [(ids, ids)])
        else:
            history, _ = cache.layers[-1].update(ids, ids)
            out.cache = cache
        logits = torch.full_like(out.logits[:, -1:, :], -1e4)
        for b in range(input_ids.shape[0]):
            context = history[b, 0, :, 0][attention_mask[b].bool()].long().tolist()
            logits[b, 0, self._next(context)] = 0.0
        out.logits = logits
        return out

    def _next(self, context: list[int]) -> int:
        key = tuple(context)
        before = self.position.pop(key[:-1], None)
        if before is not None:  # the row just took the forced token: one more of its segment is emitted
            question, k, j = before
            seg = self.scripts[question][k]
            assert j < len(seg) and seg[j] == key[-1], "diverged from the script"
            self.position[key] = (question, k, j + 1)
            return seg[j + 1] if j + 1 < len(seg) else self.tok.eos_token_id
        return self._locate(context)

    def _locate(self, context: list[int]) -> int:
        """The next scripted token, read from the decoded context (a new row, or after a tool output). The prompts'
        shared system turn, which the decoder prefills alone once, names no question: its logits go unread."""
        text = self.tok.decode(context)
        question = next((q for q in self.scripts if q in text), None)
        if question is None:
            return self.tok.eos_token_id
        response = text[text.rfind(self.header) + len(self.header):]
        k = response.count("<response>")
        emitted = response[response.rfind("</response>\n") + len("</response>\n"):] if k else response
        segments = self.scripts[question]
        if k >= len(segments):
            return self.tok.eos_token_id
        seg = segments[k]
        j = self.prefixes[question][k].get(emitted)
        assert j is not None, f"diverged from the script: {emitted!r}"
        self.position[tuple(context)] = (question, k, j)
        return seg[j] if j < len(seg) else self.tok.eos_token_id


class DelayedSearch:
    """The real search client with an injected remote-API latency."""

    name = "search"

    def __init__(self, client: SearchClient, low_ms: float, high_ms: float, seed: int) -> None:
        self.client, self.low, self.high, self.rng = client, low_ms, high_ms, random.Random(seed)

    async def __call__(self, query: str) -> ToolResult:
        await asyncio.sleep(self.rng.uniform(self.low, self.high) / 1000)
        return await self.client(query)

    async def aclose(self) -> None:
        await self.client.aclose()


def scripts_for(problems: list[Problem], turns: int, filler: tuple[int, int]) -> dict[str, list[str]]:
    """Per trajectory and turn, a thought of a length drawn from `filler` (fixed seed: the same
    scripts on both schedules), then a call; last, the answer."""
    rng = random.Random(1)

    def thought() -> str:
        return " ".join(["step"] * rng.randint(*filler))

    out = {}
    for i, p in enumerate(problems):
        segments = []
        for t in range(turns):
            call = (f"<search>{QUERIES[(i + t) % len(QUERIES)]}</search>" if t % 2 == 0
                    else f"<code>print({i} * {t} + 1)</code>")
            segments.append(f"<think>{thought()}</think>\n{call}")
        segments.append(f"<think>{thought()}</think>\n<answer>{i}</answer>")
        out[p.question] = segments
    return out


def rollout_config(base: Path, schedule: str, turns: int, filler: tuple[int, int], max_batch: int,
                   tool_concurrency: int) -> RolloutConfig:
    """The base params' rollout settings with this measurement's schedule, batch and limits (validated). Refilled
    dynamic sampling is a training setting this benchmark does not use; it is set off because it needs the
    continuous schedule."""
    return harness.derive({
        "train.sampling.refill_dropped_groups": False, "rollout.schedule": schedule, "rollout.max_batch_sequences": max_batch,
        "rollout.max_tool_calls": turns, "rollout.max_turns": turns + 1, "rollout.tool_concurrency": tool_concurrency,
        "rollout.max_policy_tokens": (60 + filler[1]) * (turns + 1), "rollout.max_total_tokens": 4096,
        "rollout.temperature": 1.0}, base).rollout


def measure(model, tok, tools, problems, turns: int, filler: tuple[int, int], cfg: RolloutConfig) -> dict:
    forced = ForcedScript(model, tok, scripts_for(problems, turns, filler))
    engine = RolloutEngine(forced, tok, tools(), cfg, seed=0)
    t0 = time.perf_counter()
    result = engine.rollout(problems, 1)
    wall = time.perf_counter() - t0
    engine.close()
    trajs = [t for g in result.groups for t in g.trajectories]
    assert all(len(t.tool_calls) == turns and t.finish_reason == "answer" for t in trajs), \
        [(len(t.tool_calls), t.finish_reason) for t in trajs]
    return {"traj_per_s": len(trajs) / wall, "wall_s": wall, "idle_fraction": result.stats.idle_fraction}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", choices=["policy", "scaled"], default=["policy", "scaled"])
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--filler", type=int, nargs=2, default=[4, 40],
                    help="range of thought tokens the model writes before each call or answer")
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--latency-ms", type=float, nargs=2, default=[100.0, 500.0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--tool-concurrency", type=int, default=None,
                    help="calls in flight per tool, the same for both schedules (default: params' "
                         "rollout.tool_concurrency)")
    ap.add_argument("--scaled-layers", type=int, default=4)
    ap.add_argument("--scaled-hidden", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads of the generator (the tool services share the same cores)")
    ap.add_argument("--model", type=Path, default=None,
                    help="model dir (default: models/sft, else models/base; --quick: the tiny one)")
    args = harness.parse(ap, argv, QUICK)
    torch.set_num_threads(args.threads)
    base = harness.base_params(args.quick)
    args.tool_concurrency = args.tool_concurrency or harness.derive(params=base).rollout.tool_concurrency
    # every configuration is read before anything runs: a params.yaml edited during the run changes nothing
    configs = {(turns, schedule): rollout_config(base, schedule, turns, args.filler, args.max_batch,
                                                 args.tool_concurrency)
               for turns in args.turns for schedule in SCHEDULES}
    problems = [Problem(f"b{i}", f"Question {i}: combine the facts.", ("0",), "complex", "bench", "test")
                for i in range(args.trajectories)]
    with workspace(None, args.quick) as ws, tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or policy_dir(ws)
        policy, tok = load_policy(str(model_dir))
        models = {"policy": lambda: policy,
                  "scaled": lambda: scaled_model(model_dir, args.scaled_layers, args.scaled_hidden)}
        figures: dict = {"trajectories": len(problems), "filler_tokens": args.filler, "latency_ms": args.latency_ms,
                         "max_batch": args.max_batch, "tool_concurrency": args.tool_concurrency,
                         "threads": args.threads, "policy_dir": model_dir.name,
                         "scaled_model": {"layers": args.scaled_layers, "hidden": args.scaled_hidden}}
        with tool_services(base, ("code", "search"), Path(tmp)) as (_, urls):
            def tools():
                return {"code": CodeSandboxClient(urls["code"]),
                        "search": DelayedSearch(SearchClient(urls["search"]), *args.latency_ms, seed=0)}
            for name in args.models:
                print(f"model {name}:", flush=True)
                figures[name] = run_all(models[name](), tok, tools, problems, args, configs)
    headline = figures.get("scaled", figures.get("policy"))
    last = headline[f"turns_{args.turns[-1]}"]
    figures["ratio"], figures["idle_fraction"] = last["ratio"], last["ours_idle_fraction"]
    figures["readmit_after_steps"] = configs[(args.turns[-1], "continuous")].readmit_after_steps  # 0: on arrival
    harness.last_line(figures, args.quick)


def scaled_model(model_dir: Path, layers: int, hidden: int) -> torch.nn.Module:
    """SmolLM2's architecture and vocabulary at a smaller size, randomly initialised (seed 0)."""
    config = AutoConfig.from_pretrained(model_dir)
    heads = max(hidden // 64, 1)
    config.update({"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": 3 * hidden,
                   "num_attention_heads": heads, "num_key_value_heads": heads, "head_dim": hidden // heads})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def run_all(model, tok, tools, problems, args, configs: dict[tuple[int, str], RolloutConfig]) -> dict:
    figures: dict = {}
    for turns in args.turns:
        runs: dict[str, list[dict]] = {schedule: [] for schedule in SCHEDULES}
        for r in range(args.repeats):  # alternate the order: the machine's load drifts
            order = ("turn-synchronous", "continuous") if r % 2 == 0 else ("continuous", "turn-synchronous")
            for schedule in order:
                runs[schedule].append(measure(model, tok, tools, problems, turns, args.filler,
                                              configs[(turns, schedule)]))
        sync = statistics.median(m["traj_per_s"] for m in runs["turn-synchronous"])
        ours = statistics.median(m["traj_per_s"] for m in runs["continuous"])
        row = {"sync_traj_per_s": sync, "ours_traj_per_s": ours, "ratio": ours / sync,
               "sync_idle_fraction": statistics.median(m["idle_fraction"] for m in runs["turn-synchronous"]),
               "ours_idle_fraction": statistics.median(m["idle_fraction"] for m in runs["continuous"])}
        print(f"turns={turns}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
        figures[f"turns_{turns}"] = row
    return figures


if __name__ == "__main__":
    main()
