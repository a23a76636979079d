"""Does RL add to SFT? SmolLM2-135M-Instruct on CPU: prompted base vs SFT vs SFT + DAPO on a task mix.

The mix (every problem offers *both* tools; the verifier is chosen by source):
- calculator: generated arithmetic (the Calculator generator); the program is known, so the
  scripted SFT teacher solves it with a real `<code>` call. SFT alone reaches ~100% here.
- fact: NQ-open questions kept only when the gold answer appears in the top results of the
  *real* search service over the local Wikipedia index (so they are answerable offline); the
  scripted teacher searches the question and answers with the gold alias found in the output.
- gsm8k: short GSM8K word problems. There is no scripted teacher for them (no program is
  known), so SFT only transfers the calling habit from calculator traces: this is where SFT
  leaves a gap and RL must prove itself.

Stages: (1) evaluate the prompted base; (2) SFT on calculator + fact traces (tool output
masked, `pipeline.sft`); (3) evaluate SFT; (4) DAPO from SFT on the mix (`pipeline.train.run`,
real sandbox and search services); (5) evaluate SFT + DAPO. Reported per type: accuracy,
tool-use rate, right-tool rate (search for fact, code otherwise, judged on the first call);
learning curves as PNG. Goal (issue): DAPO >= SFT + 10 points on the mix, right tool >= 90%.

    python benchmarks/learning_cpu.py [--quick] [--out runs/learning_cpu]
--quick shrinks every size to check the wiring in a few minutes; its figures mean nothing.
Last line: one JSON object with the per-model, per-type figures and "dapo_minus_sft".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path

import torch

from flows.services import running_services
from pipeline.config import RunConfig, load_config
from pipeline.data.adapters import gsm8k as gsm8k_row, nq_open as nq_row
from pipeline.data.calculator import generate
from pipeline.evaluation import evaluate
from pipeline.jsonl import iter_json_lines, write_problems
from pipeline.model import load_policy
from pipeline.paths import REPO_ROOT, shared_data_dir
from pipeline.rollout.engine import cut_middle, encode_prompt
from pipeline.rollout.protocol import TapoProtocol
from pipeline.sft import Trace, sft_step, to_batch
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.train import run as train_run
from pipeline.types import Problem

BOTH_TOOLS = ("search", "code")
RIGHT_TOOL = {"calculator": "code", "gsm8k": "code", "nq_open": "search"}
FULL = dict(calc=(300, 40), fact=(200, 40), gsm=(200, 40), nq_scan=3000, sft_epochs=2, rl_steps=40, group=8,
            prompts=4, eval_tokens=192)
QUICK = dict(calc=(8, 4), fact=(8, 4), gsm=(8, 4), nq_scan=150, sft_epochs=1, rl_steps=2, group=4, prompts=2,
             eval_tokens=96)


def as_mix(problem: Problem, source: str, split: str, index: int) -> Problem:
    """Offer both tools (type complex); the source still routes the verifier."""
    return Problem(f"{source}-{split}-{index}", problem.question, problem.answers, "complex", source, split,
                   problem.meta)


def calculator_problems(n: int, seed: int) -> list[Problem]:
    return [as_mix(p, "calculator", p.split, i) for i, p in enumerate(generate(n, seed=seed))]


def gsm8k_problems(n: int) -> list[Problem]:
    rows = [gsm8k_row(row) for _, row in iter_json_lines(shared_data_dir() / "gsm8k" / "test.jsonl")]
    easy = [(q, a) for q, a, _ in rows if len(q) < 220 and a[0].isdigit() and int(float(a[0])) < 1000]
    return [Problem(f"gsm8k-{i}", q, tuple(a), "complex", "gsm8k", "train") for i, (q, a) in enumerate(easy[:n])]


async def answerable_facts(search_url: str, scan: int, need: int) -> list[tuple[Problem, str, str]]:
    """NQ-open questions whose gold appears in the real search output: (problem, output, alias found)."""
    rows = [nq_row(row) for _, row in iter_json_lines(shared_data_dir() / "nq_open" / "NQ-open.dev.jsonl")][:scan]
    tool = SearchClient(search_url)
    try:
        results = await asyncio.gather(*(tool(q) for q, _, _ in rows))
    finally:
        await tool.aclose()
    kept = []
    for i, ((question, answers, _), result) in enumerate(zip(rows, results, strict=True)):
        found = [a for a in answers if result.ok and a.lower() in result.output.lower()]
        if found:
            kept.append((Problem(f"nq_open-{i}", question, tuple(answers), "complex", "nq_open", "train"),
                         result.output, found[0]))
    return kept[:need]


async def program_outputs(code_url: str, programs: list[str]) -> list:
    tool = CodeSandboxClient(code_url)
    try:
        return await asyncio.gather(*(tool(p) for p in programs))
    finally:
        await tool.aclose()


def trace(tokenizer, problem: Problem, tool: str, call: str, output: str, answer: str, max_chars: int) -> Trace:
    """Prompt (both tools offered) + call + real tool output (mask 0) + answer, as the rollout writes it."""
    protocol = TapoProtocol()
    prompt = encode_prompt(tokenizer, protocol, problem, BOTH_TOOLS)
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    thought = "I should look it up." if tool == "search" else "I will compute this exactly with Python."
    c, o = ids(protocol.render_call(tool, call, thought)), ids(protocol.wrap_output(cut_middle(output, max_chars)))
    a = ids(protocol.render_answer(answer)) + [tokenizer.eos_token_id]
    mask = [0] * len(prompt) + [1] * len(c) + [0] * len(o) + [1] * len(a)
    return Trace(problem.id, tuple(prompt + c + o + a), tuple(mask))


def sft(cfg: RunConfig, traces: list[Trace], out_dir: Path, epochs: int) -> dict[str, float]:
    model, tokenizer = load_policy(cfg.model.base_dir, cfg.model.dtype)
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr, weight_decay=0.0)
    order, t0, losses = random.Random(0), time.perf_counter(), []
    for _ in range(epochs):
        shuffled = order.sample(traces, len(traces))
        for i in range(0, len(shuffled), cfg.sft.batch_size):
            losses.append(sft_step(model, optimizer, to_batch(shuffled[i:i + cfg.sft.batch_size],
                                                              tokenizer.pad_token_id), micro_size=4))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"sft_steps": len(losses), "sft_final_loss": losses[-1], "sft_seconds": time.perf_counter() - t0}


def per_type(eval_dir: Path) -> dict[str, dict[str, float]]:
    """Accuracy, tool-use and right-tool rates per source from the evaluation's sample records."""
    records = [r for _, r in iter_json_lines(eval_dir / "eval_samples.jsonl")]
    out = {}
    for source in sorted({r["benchmark"] for r in records}):
        rows = [r for r in records if r["benchmark"] == source]
        first = [r["tool_calls"][0]["tool"] if r["tool_calls"] else None for r in rows]
        out[source] = {"n": len(rows), "accuracy": sum(r["score"] >= 0.9 for r in rows) / len(rows),
                       "tool_use": sum(f is not None for f in first) / len(rows),
                       "right_tool": sum(f == RIGHT_TOOL.get(source) for f in first) / len(rows)}
    out["mix"] = {k: sum(v[k] * v["n"] for v in out.values()) / sum(v["n"] for v in out.values())
                  for k in ("accuracy", "tool_use", "right_tool")}
    return out


def evaluate_model(cfg: RunConfig, urls: dict, model: str, test_file: Path, out_dir: Path, tokens: int):
    ec = cfg.evaluate.model_copy(update={"split_file": str(test_file), "limit": 0, "output_dir": str(out_dir),
                                         "mode": "tools", "temperature": 0.0, "samples": 1, "resume": False,
                                         "plots": False, "label": out_dir.name})
    rc = cfg.rollout.model_copy(update={"max_policy_tokens": tokens})
    evaluate.run(cfg.model_copy(update={"evaluate": ec, "rollout": rc}), urls, model_path=model)
    return per_type(out_dir)


def plot_curves(history: Path, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for _, r in iter_json_lines(history)]
    keys = [k for k in ("reward/mean", "reward/accuracy/calculator", "reward/accuracy/nq_open",
                        "reward/accuracy/gsm8k", "rollout/calls_per_traj/code", "rollout/calls_per_traj/search")
            if any(k in r for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k in keys:
        ax.plot([r["step"] for r in rows if k in r], [r[k] for r in rows if k in r], label=k, marker=".")
    ax.set_xlabel("RL step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def build_mix(sizes: dict, urls: dict, tokenizer, max_chars: int) -> tuple[list, list, list]:
    """Train problems, held-out problems and SFT traces (calculator + fact; none for GSM8K)."""
    n_calc, t_calc = sizes["calc"]
    n_fact, t_fact = sizes["fact"]
    n_gsm, t_gsm = sizes["gsm"]
    calc = calculator_problems(n_calc + t_calc, seed=7)
    facts = asyncio.run(answerable_facts(urls["search"], sizes["nq_scan"], n_fact + t_fact))
    gsm = gsm8k_problems(n_gsm + t_gsm)
    fact_problems = [f[0] for f in facts]
    n_fact_train = max(len(facts) - t_fact, len(facts) // 2)
    train = calc[:n_calc] + fact_problems[:n_fact_train] + gsm[:n_gsm]
    test = calc[n_calc:] + fact_problems[n_fact_train:] + gsm[n_gsm:]
    outputs = asyncio.run(program_outputs(urls["code"], [p.meta["code"] for p in calc[:n_calc]]))
    traces = [trace(tokenizer, p, "code", p.meta["code"], r.output.strip(), r.output.strip(), max_chars)
              for p, r in zip(calc[:n_calc], outputs, strict=True) if r.ok]
    traces += [trace(tokenizer, p, "search", p.question, out, alias, max_chars)
               for p, out, alias in facts[:n_fact_train]]
    return train, test, traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the wiring only")
    parser.add_argument("--out", default="runs/learning_cpu")
    args = parser.parse_args()
    sizes, out = (QUICK if args.quick else FULL), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(REPO_ROOT / "params.yaml", overrides={"run.tracking_uri": f"sqlite:///{out / 'mlruns.db'}"})
    t0 = time.perf_counter()
    with running_services(cfg, BOTH_TOOLS, str(REPO_ROOT / "params.yaml"), log_dir=out / "logs") as urls:
        _, tokenizer = load_policy(cfg.model.base_dir, cfg.model.dtype)
        train, test, traces = build_mix(sizes, urls, tokenizer, cfg.rollout.max_tool_output_chars)
        write_problems(out / "train.jsonl", train)
        write_problems(out / "test.jsonl", test)
        print(f"mix: {len(train)} train, {len(test)} held out, {len(traces)} SFT traces", flush=True)
        results = {"base": evaluate_model(cfg, urls, cfg.model.base_dir, out / "test.jsonl", out / "eval_base",
                                          sizes["eval_tokens"])}
        sft_info = sft(cfg, traces, out / "sft", sizes["sft_epochs"])
        results["sft"] = evaluate_model(cfg, urls, str(out / "sft"), out / "test.jsonl", out / "eval_sft",
                                        sizes["eval_tokens"])
        train_cfg = load_config(REPO_ROOT / "params.yaml", overrides={
            "run.tracking_uri": f"sqlite:///{out / 'mlruns.db'}", "train.init_model": str(out / "sft"),
            "train.train_file": str(out / "train.jsonl"), "train.steps": sizes["rl_steps"],
            "train.prompts_per_step": sizes["prompts"], "train.lr": 2e-6, "train.checkpoint_every": 10,
            "train.checkpoint_dir": str(out / "rl"), "train.output_dir": str(out / "dapo"),
            "rollout.group_size": sizes["group"], "rollout.max_policy_tokens": sizes["eval_tokens"]})
        t_rl = time.perf_counter()
        train_run(train_cfg, urls, metrics_dir=out / "rl_metrics")
        rl_seconds = time.perf_counter() - t_rl
        results["dapo"] = evaluate_model(cfg, urls, str(out / "dapo"), out / "test.jsonl", out / "eval_dapo",
                                         sizes["eval_tokens"])
    plot_curves(out / "rl_metrics" / "train_history.jsonl", out / "learning_curves.png")
    summary = {"quick": args.quick, "n_train": len(train), "n_test": len(test), "sft_traces": len(traces),
               **{k: round(v, 3) for k, v in sft_info.items()}, "rl_steps": sizes["rl_steps"],
               "rl_seconds": round(rl_seconds, 1), "total_seconds": round(time.perf_counter() - t0, 1),
               "results": {m: {t: {k: round(v, 3) for k, v in f.items()} for t, f in r.items()}
                           for m, r in results.items()},
               "dapo_minus_sft": round(results["dapo"]["mix"]["accuracy"] - results["sft"]["mix"]["accuracy"], 3),
               "dapo_right_tool": round(results["dapo"]["mix"]["right_tool"], 3),
               "curves": str(out / "learning_curves.png")}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
