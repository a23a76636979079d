"""Continuous vs turn-synchronous tool scheduling in the rollout engine (issue: rollout overlap).

Same model, prompts, tools and scripts on both sides; only `rollout.schedule` differs:
- turn-synchronous (baseline): TAPO/ToRL's batch-synchronous rounds, everyone waits for the
  slowest tool of each turn;
- continuous (ours): a sequence resumes as soon as its own tool answers.

The model is the real SmolLM2 policy (`models/sft`, else `models/base`) doing real forward
passes with its KV cache; only the *choice* of each next token is forced to a script, so
every trajectory makes exactly `turns` tool calls (alternating a real search call and a real
code-sandbox call) whatever the weights. Search calls get an injected latency drawn from
[min, max] ms (a remote search API), on top of the real local service. Generation cost, tool
cost and scheduling are therefore all real; the script only fixes the number of turns.

Prints per configuration: trajectories/s of both schedules, their ratio, generator idle
fraction. Last line: one JSON object.

    nice -n 10 .venv/bin/python -m benchmarks.rollout_overlap [--trajectories 16] [--filler 12]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from pipeline.config import RunConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.model import load_policy
from pipeline.paths import REPO_ROOT
from pipeline.search.build_index import build_index
from pipeline.services import free_port, python_service, redis_service
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.types import Problem, ToolResult
from pipeline.rollout.engine import RolloutEngine

QUERIES = ["capital of France", "Wikipedia history", "largest ocean", "first moon landing"]


class ForcedScript(torch.nn.Module):
    """Real forward passes of `model`; the next token is forced to the trajectory's script.

    The token ids of each row ride along in one extra cache layer, which the decoder merges,
    pads and selects exactly like the model's own layers."""

    def __init__(self, model, tokenizer, scripts: dict[str, list[str]]) -> None:
        super().__init__()
        self.model, self.tok = model, tokenizer
        self.scripts = {q: [tokenizer(s, add_special_tokens=False)["input_ids"] for s in segs]
                        for q, segs in scripts.items()}
        self.generation_config = model.generation_config
        self.header = "<|im_start|>assistant\n"

    def forward(self, input_ids, attention_mask, position_ids=None, cache=None, use_cache=True, logits_to_keep=0):
        ids = input_ids[:, None, :, None].float()
        if cache is None:
            real_cache, history = None, ids
        else:
            layers = [(layer.keys, layer.values) for layer in cache.layers]
            real_cache = DynamicCache(ddp_cache_data=layers[:-1])
            history = torch.cat([layers[-1][0], ids], dim=2)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=real_cache, use_cache=True, logits_to_keep=1)
        logits = torch.full_like(out.logits[:, -1:, :], -1e4)
        for b in range(input_ids.shape[0]):
            context = history[b, 0, :, 0][attention_mask[b].bool()].long().tolist()
            logits[b, 0, self._next(context)] = 0.0
        layers = [(layer.keys, layer.values) for layer in out.cache.layers] + [(history, history)]
        out.logits, out.cache = logits, DynamicCache(ddp_cache_data=layers)
        return out

    def _next(self, context: list[int]) -> int:
        text = self.tok.decode(context)
        question = next(q for q in self.scripts if q in text)
        response = text[text.rfind(self.header) + len(self.header):]
        k = response.count("<response>")
        emitted = response[response.rfind("</response>\n") + len("</response>\n"):] if k else response
        segments = self.scripts[question]
        if k >= len(segments):
            return self.tok.eos_token_id
        seg = segments[k]
        for j in range(len(seg) + 1):
            if self.tok.decode(seg[:j]) == emitted:
                return seg[j] if j < len(seg) else self.tok.eos_token_id
        raise AssertionError(f"diverged from the script: {emitted!r}")


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


def scripts_for(problems: list[Problem], turns: int, filler: int) -> dict[str, list[str]]:
    words = " ".join(["step"] * filler)
    out = {}
    for i, p in enumerate(problems):
        segments = []
        for t in range(turns):
            call = (f"<search>{QUERIES[(i + t) % len(QUERIES)]}</search>" if t % 2 == 0
                    else f"<code>print({i} * {t} + 1)</code>")
            segments.append(f"<think>{words}</think>\n{call}")
        segments.append(f"<think>{words}</think>\n<answer>{i}</answer>")
        out[p.question] = segments
    return out


def measure(model, tok, tools, problems, turns: int, filler: int, schedule: str, max_batch: int) -> dict:
    cfg = RolloutConfig(schedule=schedule, max_batch_sequences=max_batch, max_tool_calls=turns, max_turns=turns + 1,
                        max_policy_tokens=60 * (turns + 1) + filler * (turns + 1), max_total_tokens=4096,
                        temperature=1.0)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trajectories", type=int, default=16)
    ap.add_argument("--filler", type=int, default=12, help="filler tokens the model writes before each call")
    ap.add_argument("--turns", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--latency-ms", type=float, nargs=2, default=[100.0, 500.0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model_dir = next((d for d in (REPO_ROOT / "models/sft", REPO_ROOT / "models/base") if (d / "config.json").is_file()),
                     None)
    if model_dir is None:
        raise SystemExit("no model: run `python -m flows.prepare_model` first (writes models/base)")
    model, tok = load_policy(str(model_dir))
    problems = [Problem(f"b{i}", f"Question {i}: combine the facts.", ("0",), "complex", "bench", "test")
                for i in range(args.trajectories)]
    cfg = RunConfig()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        search_cfg = cfg.search.model_copy(update={"index_dir": str(tmp / "index")})
        build_index(search_cfg)
        params = tmp / "params.yaml"
        params.write_text(f"search:\n  index_dir: {tmp / 'index'}\n")
        with redis_service(tmp / "redis") as redis, \
                python_service("sandbox", "sandbox.code", cfg.sandbox.server_args(), free_port(), tmp) as sandbox, \
                python_service("search", "sandbox.search", ["--redis-url", redis.url, "--params", str(params)],
                               free_port(), tmp) as search:
            def tools():
                return {"code": CodeSandboxClient(sandbox.url),
                        "search": DelayedSearch(SearchClient(search.url), *args.latency_ms, seed=0)}
            figures = run_all(model, tok, tools, problems, args)
    print(json.dumps(figures))


def run_all(model, tok, tools, problems, args) -> dict:
    figures: dict = {"trajectories": len(problems), "filler_tokens": args.filler, "latency_ms": args.latency_ms}
    for turns in args.turns:
        runs = {"turn-synchronous": [], "continuous": []}
        for r in range(args.repeats):  # alternate the order: the machine's load drifts
            order = ("turn-synchronous", "continuous") if r % 2 == 0 else ("continuous", "turn-synchronous")
            for schedule in order:
                runs[schedule].append(measure(model, tok, tools, problems, turns, args.filler, schedule, args.max_batch))
        sync = statistics.median(m["traj_per_s"] for m in runs["turn-synchronous"])
        ours = statistics.median(m["traj_per_s"] for m in runs["continuous"])
        row = {"sync_traj_per_s": sync, "ours_traj_per_s": ours, "ratio": ours / sync,
               "sync_idle_fraction": statistics.median(m["idle_fraction"] for m in runs["turn-synchronous"]),
               "ours_idle_fraction": statistics.median(m["idle_fraction"] for m in runs["continuous"])}
        print(f"turns={turns}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()), flush=True)
        figures[f"turns_{turns}"] = row
    last = figures[f"turns_{args.turns[-1]}"]
    figures["ratio"] = last["ratio"]
    figures["idle_fraction"] = last["ours_idle_fraction"]
    return figures


if __name__ == "__main__":
    main()
