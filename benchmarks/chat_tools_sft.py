"""Does chat-tools train? SmolLM2-135M-Instruct on CPU, calculator problems: the TAPO tag protocol vs chat-tools (the
packaged ChatML template with tools, hermes calls), each prompted and after the same SFT cold start.

For each protocol: (1) the prompted model is evaluated greedy on held-out calculator problems; (2) it is fine-tuned
on scripted traces (`pipeline.sft.scripted_traces`: the problem's own program really run in the code sandbox, the
trace rendered by the protocol's renderer, so chat-tools is taught the template's own conversation), as the `sft`
stage does (one epoch, batch 8, lr 5e-5 unless changed); (3) the SFT model is evaluated the same way. Reported per
model: accuracy, format-ok rate, right-tool rate (the first call is code), malformed calls, mean policy tokens.
DAPO after SFT is not run here (the learning_cpu benchmark's hour of 2 cores per protocol).

    python benchmarks/chat_tools_sft.py [--traces 48] [--test 40] [--epochs 1] [--lr 5e-5] [--threads N]
                                        [--out runs/chat_tools_sft] [--model smollm2-135m-instruct] [--quick]

Each protocol's rollout settings are params.yaml's with the protocol (and chat-tools' packaged hermes template) on
top; the code sandbox is started from the same params (`benchmarks.services`).
Last line: one JSON object with the figures per protocol and model.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.preset_run import workspace
from benchmarks.services import tool_services
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.data.calculator import generate
from pipeline.model import load_policy
from pipeline.protocols import MALFORMED, protocol_of
from pipeline.reward import RewardScorer
from pipeline.rollout.backends.decoding import eos_ids
from pipeline.rollout.engine import RolloutEngine
from pipeline.sft import scripted_traces, sft_step, to_batch
from pipeline.tools.code import CodeSandboxClient
from pipeline.types import Problem

PROTOCOLS = {  # each protocol's settings over params.yaml's rollout section
    "tapo": {"rollout.protocol": "tapo"},
    "chat-tools": {"rollout.protocol": "chat-tools", "rollout.chat_tools.template": "hermes"},
}
QUICK = {"traces": 2, "test": 2, "threads": 1}


def evaluate(model, tokenizer, rollout: RolloutConfig, problems: list[Problem], url: str) -> dict[str, float]:
    cfg = rollout.model_copy(update={"temperature": 0.0, "max_policy_tokens": 128, "max_total_tokens": 1024,
                                     "max_tool_calls": 2, "max_turns": 3})
    scorer = RewardScorer(RewardConfig())
    with RolloutEngine(model, tokenizer, {"code": CodeSandboxClient(url)}, cfg) as engine:
        groups = engine.rollout(problems, 1).groups
    trajs = [(g.problem, g.trajectories[0]) for g in groups]
    rewards = [scorer.score(p, t, protocol=engine.protocol, max_policy_tokens=cfg.max_policy_tokens) for p, t in trajs]
    n = len(trajs)
    return {
        "accuracy": sum(r.correct for r in rewards) / n,
        "format_ok": sum(r.format_ok for r in rewards) / n,
        "right_tool": sum(bool(t.tool_calls) and t.tool_calls[0].tool == "code" for _, t in trajs) / n,
        "malformed_calls": float(sum(c.result.status == MALFORMED for _, t in trajs for c in t.tool_calls)),
        "mean_policy_tokens": sum(t.policy_token_count for _, t in trajs) / n,
    }


def fine_tune(model, tokenizer, rollout: RolloutConfig, problems: list[Problem], url: str, args) -> dict[str, float]:
    traces = scripted_traces(problems, tokenizer, protocol_of(rollout), {"code": CodeSandboxClient(url)},
                             RewardConfig(), rollout.max_tool_output_chars, eos_ids(model, tokenizer))[:args.traces]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    order, t0, losses = random.Random(0), time.perf_counter(), []
    for _ in range(args.epochs):
        shuffled = order.sample(traces, len(traces))
        for i in range(0, len(shuffled), 8):
            losses.append(sft_step(model, optimizer, to_batch(shuffled[i:i + 8], tokenizer.pad_token_id), 4))
    return {"traces": float(len(traces)), "first_loss": losses[0], "last_loss": losses[-1],
            "sft_seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=48)
    parser.add_argument("--test", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--out", type=Path, default=None,
                        help="where results.json goes (default: runs/chat_tools_sft; --quick: nowhere kept)")
    parser.add_argument("--model", default=None, help="default: smollm2-135m-instruct; --quick: the tiny one")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = harness.parse(parser, argv, QUICK)
    if args.threads:
        torch.set_num_threads(args.threads)
    base = harness.base_params(args.quick)
    train = generate(args.traces + 16, seed=11)  # a few spare: a trace is kept only when its program verifies
    test = generate(args.test, seed=12)
    results: dict[str, dict] = {}
    with workspace(None, args.quick) as root, tempfile.TemporaryDirectory() as tmp, \
            tool_services(base, ("code",), Path(tmp)) as (_, urls):
        model_path = args.model or (str(root / "models" / "sft") if args.quick else "smollm2-135m-instruct")
        out = args.out or (Path(tmp) if args.quick else Path("runs/chat_tools_sft"))
        for name, settings in PROTOCOLS.items():
            rollout = harness.derive(settings, base).rollout
            model, tokenizer = load_policy(model_path, "float32", "cpu")
            results[name] = {"prompted": evaluate(model, tokenizer, rollout, test, urls["code"])}
            results[name]["sft"] = fine_tune(model, tokenizer, rollout, train, urls["code"], args)
            results[name]["after_sft"] = evaluate(model, tokenizer, rollout, test, urls["code"])
            print(name, json.dumps(results[name]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
    harness.last_line({"traces": args.traces, "test": args.test, "epochs": args.epochs, "lr": args.lr,
                       "model": model_path, **{name: {k: {m: round(v, 3) for m, v in r.items()} for k, r in res.items()}
                                               for name, res in results.items()}}, args.quick)


if __name__ == "__main__":
    main()
