"""Does RL add to SFT? SmolLM2-135M-Instruct on CPU: prompted base vs SFT vs SFT + DAPO on a task mix.

The mix (every problem offers *both* tools, type `complex`; the verifier is chosen by source):
- calculator: the Calculator generator (all templates and levels). The program is known, so
  the scripted teacher solves it with one real `<code>` call.
- fact: NQ-open questions kept only when a gold alias appears in the top results of the *real*
  search service over the local Wikipedia index, within the part of the output the policy sees
  (cut to rollout.max_tool_output_chars); the scripted teacher searches the question and answers
  with the alias found there.

Why this mix and this cold start (measured, see benchmarks/RESULTS.md): SFT on 400 calculator
traces solves the calculator outright (100%), leaving RL nothing to show; so the cold start is
light, as in ARPO/TEPO and near the `sft` stage's default of 48 traces (here 32 calculator + 32
fact, one epoch), which leaves the SFT model inside the 20-80% band on the mix (~40% calculator, failing
on copied digits, thousands separators and formulas; ~10% fact, failing to pick the answer out
of the passages). Short GSM8K problems were tried and dropped: the SFT model solved 0 of 20
greedy and RL gets no reward signal from a 135M model there within this budget.
RL draws calculator and fact problems in turn (train.balance_sources): with 2 problems a step and
dynamic sampling, a uniform draw let the easier calculator groups crowd out the fact groups. RL keeps
a KL anchor to the SFT model (train.algorithm.kl_coef 0.2; DAPO itself has none): fact groups are
mostly all-zero and dropped, so nothing else holds the tool choice on facts while calculator groups
reward the shared opening; without it one seed in three drifted to answering facts with code (with it,
one run in ten still did; --code-penalty -0.5, ToRL's price on code that fails to run, held tool choice over
a whole run on that seed, but for +8.8 points in 64 minutes, as more groups become informative: RESULTS, run 7).

Stages: (1) evaluate the prompted base; (2) SFT on the traces (tool output masked,
`pipeline.sft`); (3) evaluate SFT; (4) DAPO from SFT on the training mix (`pipeline.train.run`,
real sandbox and search services); (5) evaluate SFT + DAPO. Evaluation is greedy pass@1 on the
held-out problems; with --sampled K (default 0: off) SFT and SFT + DAPO are also sampled K times at
the RL temperature (avg@K and pass@K), which tells sharpening (avg@K up, pass@K flat) from a new skill.
Reported per type: accuracy, tool-use rate, right-tool rate (search for fact, code for
calculator, judged on the first call); learning curves as PNG. Goal (issue):
DAPO >= SFT + 10 points on the mix, right tool >= 90%, all within 60 minutes on 2 cores.

    python benchmarks/learning_cpu.py [--quick] [--out runs/learning_cpu] [--rl-steps N] [--lr LR] [--rl-seed S]
                                      [--kl B] [--prompts P] [--mini-batches M] [--temperature T] [--code-penalty C]
                                      [--anchor-dropped N] [--lr-decay constant|linear|cosine] [--min-lr-ratio R]
                                      [--[no-]refill] [--max-batch ROWS] [--autocast none|bfloat16] [--eval-checkpoint STEP]
--quick shrinks every size to check the wiring in a few minutes; its figures mean nothing. Finished
stages are kept in <out>/stages.json: a re-run resumes, and one with other RL settings (--lr, --rl-steps,
--rl-seed, --kl, --prompts, --mini-batches, --temperature, --code-penalty, --anchor-dropped, --lr-decay,
--min-lr-ratio, --refill, --max-batch, --autocast) keeps the cold start (evaluation
of base and SFT, SFT itself) and runs RL and what follows again.
Last line: one JSON object with the per-model, per-type figures and "dapo_minus_sft".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import shutil
import time
from pathlib import Path

import torch

from flows.services import running_services
from pipeline.trainer.checkpoint import checkpoint_dir
from pipeline.trainer.run_folder import run_folder
from pipeline.config import RunConfig, load_config
from pipeline.data.adapters import nq_open as nq_row
from pipeline.data.calculator import generate
from pipeline.evaluation import evaluate
from pipeline.evaluation.summary import is_correct, summarise
from pipeline.jsonl import iter_json_lines, write_problems
from pipeline.model import load_policy
from pipeline.paths import REPO_ROOT, shared_data_dir
from pipeline.rollout.engine import cut_middle, encode_prompt
from pipeline.protocols import TapoProtocol
from pipeline.sft import Trace, sft_step, to_batch
from pipeline.tools.code import CodeSandboxClient
from pipeline.tools.search import SearchClient
from pipeline.export import export_checkpoint
from pipeline.train import run as train_run
from pipeline.types import Problem


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Problem counts per type (train, held out), SFT traces per type, and the RL run."""

    calc: tuple[int, int]
    fact: tuple[int, int]
    nq_scan: int  # NQ-open questions searched to find answerable ones
    sft_traces: int  # per type (calculator, fact): the light cold start
    sft_epochs: int
    rl_steps: int
    group: int
    prompts: int  # problems per RL step (each sampled `group` times)
    lr: float
    eval_tokens: int  # max policy tokens, in evaluation and in RL rollouts
    rl_seed: int = 0  # run.seed of the RL stage (sampling, problem order): replicates share the cold start
    kl_coef: float = 0.0  # train.algorithm.kl_coef: a KL anchor to the SFT model (0 = plain DAPO)
    mini_batches: int = 1  # train.ppo_mini_batches: optimiser steps per rollout batch (whole groups each)
    temperature: float = 1.0  # rollout.temperature of RL sampling (DAPO's 1.0); evaluation stays greedy
    code_penalty: float = 0.0  # reward.code_penalty: ToRL's penalty when a code call fails to run (0 = off)
    anchor_dropped: int = 0  # train.anchor_dropped_tokens: KL on the openings of dropped groups (0 = off)
    lr_decay: str = "constant"  # train.lr_decay after the 1-step warm-up: constant (DAPO), linear or cosine
    min_lr_ratio: float = 0.0  # train.min_lr_ratio: the decay's floor, a share of lr
    max_gen_rounds: int = 2  # train.max_gen_rounds (with refill: at most prompts x this many problems a step)
    refill: bool = False  # train.refill_dropped_groups: replace dropped groups inside the running rollout
    max_batch: int = 16  # rollout.max_batch_sequences in RL: rows the hf decoder decodes together
    autocast: str = "none"  # train.autocast: bfloat16 runs the RL update's forward in mixed precision


# kl_coef 0.2: without an anchor, one seed in three collapsed tool choice on facts to code (RESULTS, run 2).
# The RL settings are learning_cpu run 16's (+11.2 points in 56.8 minutes on seed 3; RESULTS): 3 problems x 36
# steps, KL anchor also on the openings of dropped groups, cosine lr, refilled dynamic sampling over 24 rows,
# two mini-batches a step, the update in bf16 mixed precision.
FULL = Sizes(calc=(200, 40), fact=(200, 40), nq_scan=3610, sft_traces=32, sft_epochs=1, rl_steps=36, group=8,
             prompts=3, lr=1e-5, eval_tokens=192, kl_coef=0.2, mini_batches=2, anchor_dropped=32, lr_decay="cosine",
             min_lr_ratio=0.1, refill=True, max_batch=24, autocast="bfloat16")
QUICK = Sizes(calc=(8, 4), fact=(8, 4), nq_scan=150, sft_traces=4, sft_epochs=1, rl_steps=2, group=4, prompts=2,
              lr=2e-5, eval_tokens=96, kl_coef=0.2, anchor_dropped=16)  # --quick wires the anchor too


BOTH_TOOLS = ("search", "code")
RIGHT_TOOL = {"calculator": "code", "nq_open": "search"}


def as_mix(problem: Problem, source: str, split: str, index: int) -> Problem:
    """Offer both tools (type complex); the source still routes the verifier."""
    return Problem(f"{source}-{split}-{index}", problem.question, problem.answers, "complex", source, split,
                   problem.meta)


def calculator_problems(n: int, seed: int) -> list[Problem]:
    return [as_mix(p, "calculator", p.split, i) for i, p in enumerate(generate(n, seed=seed))]


async def answerable_facts(search_url: str, scan: int, need: int, max_chars: int) -> list[tuple[Problem, str, str]]:
    """NQ-open questions whose gold appears in the real search output *as the policy sees it* (cut to
    `max_chars`, as the rollout cuts it): (problem, visible output, alias found)."""
    rows = [nq_row(row) for _, row in iter_json_lines(shared_data_dir() / "nq_open" / "NQ-open.dev.jsonl")][:scan]
    tool = SearchClient(search_url)
    try:
        results = await asyncio.gather(*(tool(q) for q, _, _ in rows))
    finally:
        await tool.aclose()
    kept = []
    for i, ((question, answers, _), result) in enumerate(zip(rows, results, strict=True)):
        visible = cut_middle(result.output, max_chars) if result.ok else ""
        found = [a for a in answers if a.lower() in visible.lower()]
        if found:
            kept.append((Problem(f"nq_open-{i}", question, tuple(answers), "complex", "nq_open", "train"),
                         visible, found[0]))
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr, weight_decay=0.0)
    order, losses = random.Random(0), []
    for _ in range(epochs):
        shuffled = order.sample(traces, len(traces))
        for i in range(0, len(shuffled), cfg.sft.batch_size):
            losses.append(sft_step(model, optimizer, to_batch(shuffled[i:i + cfg.sft.batch_size],
                                                              tokenizer.pad_token_id), micro_size=4))
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return {"sft_steps": len(losses), "sft_final_loss": losses[-1]}


def eval_samples(eval_dir: Path) -> list[dict]:
    """The evaluation harness's per-sample records of one run."""
    return [r for _, r in iter_json_lines(eval_dir / "eval_samples.jsonl")]


def per_type(eval_dir: Path) -> dict[str, dict[str, float]]:
    """Accuracy, tool-use and right-tool rates per source from the evaluation's sample records."""
    records = eval_samples(eval_dir)
    out = {}
    for source in sorted({r["benchmark"] for r in records}):
        rows = [r for r in records if r["benchmark"] == source]
        first = [r["tool_calls"][0]["tool"] if r["tool_calls"] else None for r in rows]
        out[source] = {"n": len(rows), "accuracy": sum(map(is_correct, rows)) / len(rows),
                       "tool_use": sum(f is not None for f in first) / len(rows),
                       "right_tool": sum(f == RIGHT_TOOL.get(source) for f in first) / len(rows)}
    out["mix"] = {k: sum(v[k] * v["n"] for v in out.values()) / sum(v["n"] for v in out.values())
                  for k in ("accuracy", "tool_use", "right_tool")}
    return out


def solved_rate(eval_dir: Path, k: int) -> dict[str, float]:
    """Per source and for the mix: pass@k with k = the samples per problem, i.e. the share of problems
    at least one sample solved (the harness's own summary)."""
    records = eval_samples(eval_dir)
    figures = summarise(records, pass_k=(k,))
    return ({source: figures[f"{source}/pass@{k}"] for source in sorted({r["benchmark"] for r in records})}
            | {"mix": figures[f"all/pass@{k}"]})


def paired_flips(before: Path, after: Path) -> dict[str, float]:
    """Held-out problems greedy SFT got wrong and SFT + DAPO right, and the reverse, with the two-sided
    sign-test p-value of that split: how much of the difference one run's noise could explain."""
    a, b = ({r["id"]: is_correct(r) for r in eval_samples(d)} for d in (before, after))
    up, down = sum(b[i] and not a[i] for i in a), sum(a[i] and not b[i] for i in a)
    n = up + down
    p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(up, down) + 1)) / 2 ** n) if n else 1.0
    return {"wrong_to_right": up, "right_to_wrong": down, "sign_test_p": p}


def evaluate_model(cfg: RunConfig, urls: dict, model: str, test_file: Path, out_dir: Path, tokens: int,
                   samples: int = 1, temperature: float = 0.0):
    ec = cfg.evaluate.model_copy(update={"split_file": str(test_file), "limit": 0, "output_dir": str(out_dir),
                                         "mode": "tools", "temperature": temperature, "samples": samples,
                                         "resume": False,
                                         "plots": False, "label": out_dir.name})
    rc = cfg.rollout.model_copy(update={"max_policy_tokens": tokens})
    evaluate.run(cfg.model_copy(update={"evaluate": ec, "rollout": rc}), urls, model_path=model)
    return per_type(out_dir)


def plot_curves(history: Path, results: dict, png: Path) -> None:
    """Left: RL training curves (reward, accuracy per type, tool calls); right: held-out accuracy per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for _, r in iter_json_lines(history)]
    keys = [k for k in ("reward/mean", "reward/accuracy/calculator", "reward/accuracy/nq_open",
                        "rollout/calls_per_traj/code", "rollout/calls_per_traj/search",
                        "tool_choice/nq_open/code")  # code on fact questions: the tool-choice collapse
            if any(k in r for r in rows)]
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    for k in keys:  # each step sees only a few problems: faint raw points, a 5-step running mean on top
        steps, values = [r["step"] for r in rows if k in r], [r[k] for r in rows if k in r]
        line, = curves.plot(steps, values, marker=".", alpha=0.25, linewidth=0.8)
        mean = [sum(values[max(0, i - 4):i + 1]) / len(values[max(0, i - 4):i + 1]) for i in range(len(values))]
        curves.plot(steps, mean, color=line.get_color(), label=f"{k} (5-step mean)")
    curves.set_xlabel("RL step")
    curves.set_title("DAPO training rollouts (T = 1)")
    curves.legend(fontsize=7)
    types = [t for t in results["base"] if t != "mix"] + ["mix"]
    width = 0.8 / len(results)
    for i, (model, per) in enumerate(results.items()):
        bars.bar([j + i * width for j in range(len(types))], [per[t]["accuracy"] for t in types], width, label=model)
    bars.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(types))], types)
    bars.set_ylim(0, 1)
    bars.set_title("held-out accuracy (greedy)")
    bars.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def build_mix(sizes: Sizes, urls: dict, tokenizer, max_chars: int) -> tuple[list, list, list]:
    """Train problems, held-out problems and the cold-start SFT traces (the first train problems of each type)."""
    (n_calc, t_calc), (n_fact, t_fact) = sizes.calc, sizes.fact
    calc = calculator_problems(n_calc + t_calc, seed=7)
    facts = asyncio.run(answerable_facts(urls["search"], sizes.nq_scan, n_fact + t_fact, max_chars))
    fact_problems = [f[0] for f in facts]
    n_fact_train = max(len(facts) - t_fact, len(facts) // 2)  # held-out first when answerable facts are few
    train = calc[:n_calc] + fact_problems[:n_fact_train]
    test = calc[n_calc:] + fact_problems[n_fact_train:]
    taught = calc[:sizes.sft_traces]
    outputs = asyncio.run(program_outputs(urls["code"], [p.meta["code"] for p in taught]))
    traces = [trace(tokenizer, p, "code", p.meta["code"], r.output.strip(), r.output.strip(), max_chars)
              for p, r in zip(taught, outputs, strict=True) if r.ok]
    traces += [trace(tokenizer, p, "search", p.question, out, alias, max_chars)
               for p, out, alias in facts[:min(sizes.sft_traces, n_fact_train)]]
    return train, test, traces


def rl_config(sizes: Sizes, out: Path) -> RunConfig:
    """DAPO (params.yaml's algorithm) from the SFT model; no gradient checkpointing so group prompts share a pass;
    sources drawn in turn, so fact groups are not crowded out by the easier calculator."""
    return load_config(REPO_ROOT / "params.yaml", overrides={
        "run.tracking_uri": f"sqlite:///{out / 'mlruns.db'}", "run.seed": sizes.rl_seed,
        "train.init_model": str(out / "sft"),
        "train.train_file": str(out / "train.jsonl"), "train.steps": sizes.rl_steps,
        "train.prompts_per_step": sizes.prompts, "train.lr": sizes.lr, "train.warmup_steps": 1,
        "train.lr_decay": sizes.lr_decay, "train.min_lr_ratio": sizes.min_lr_ratio,
        "train.max_gen_rounds": sizes.max_gen_rounds, "train.refill_dropped_groups": sizes.refill,
        "rollout.max_batch_sequences": sizes.max_batch,
        "train.micro_batch_size": 8, "train.gradient_checkpointing": False,
        "train.balance_sources": True, "train.algorithm.kl_coef": sizes.kl_coef,
        "train.ppo_mini_batches": sizes.mini_batches,
        "train.checkpoint_every": 10, "train.log_samples_every": 5,
        "train.checkpoint_dir": str(out / "rl"), "train.output_dir": str(out / "dapo"),
        "rollout.group_size": sizes.group, "rollout.max_policy_tokens": sizes.eval_tokens,
        "rollout.temperature": sizes.temperature, "reward.code_penalty": sizes.code_penalty,
        "train.anchor_dropped_tokens": sizes.anchor_dropped, "train.autocast": sizes.autocast})


def fresh_rl(cfg: RunConfig, urls: dict, out: Path) -> dict[str, float]:
    """DAPO from the SFT model, from step 0: checkpoints of an unfinished or other-sized run are removed."""
    shutil.rmtree(cfg.train.checkpoint_dir, ignore_errors=True)
    return train_run(cfg, urls, metrics_dir=out / "rl_metrics")


def rl_checkpoint_model(cfg: RunConfig, step: int, model_dir: Path) -> Path:
    """The RL checkpoint of `step` as a model directory (the trainer keeps the last two checkpoints)."""
    checkpoint = checkpoint_dir(run_folder(cfg), step)
    if not checkpoint.is_dir():
        kept = sorted(p.name for p in checkpoint.parent.glob("step-*"))
        raise FileNotFoundError(f"--eval-checkpoint {step}: {checkpoint} does not exist (kept: {kept})")
    return export_checkpoint(cfg, checkpoint, model_dir)


def rounded(figures: dict) -> dict:
    """Per-type figures (nested dicts of floats) to 3 decimals, for the summary line."""
    return {k: rounded(v) if isinstance(v, dict) else round(v, 3) for k, v in figures.items()}


COLD_START_FIELDS = ("calc", "fact", "nq_scan", "sft_traces", "sft_epochs", "eval_tokens")  # what stages up to SFT read


class StageLog:
    """Each finished stage's result, seconds and the sizes it was made with, in `path`: a re-run after a
    crash resumes at the first unfinished stage, and a re-run with other RL sizes (--lr, --rl-steps, --rl-seed) keeps
    the cold-start stages, whose inputs did not change. A stage made with other sizes is run again."""

    def __init__(self, path: Path, sizes: Sizes) -> None:
        self.path, self.sizes = path, json.loads(json.dumps(dataclasses.asdict(sizes)))  # as JSON reads it back
        saved = json.loads(path.read_text()) if path.is_file() else {}
        self.done: dict = saved.get("stages", {})
        for entry in self.done.values():  # files written before per-stage sizes: one "sizes" for all stages
            entry.setdefault("sizes", saved.get("sizes", {}))
        self.used: list[str] = []  # this invocation's stages, in order

    def run(self, stage: str, fn, fields: tuple[str, ...] | None = None):
        """Run `fn` unless `stage` was finished with the same values of `fields` (default: every size)."""
        made_with = {k: self.sizes[k] for k in fields or self.sizes}
        self.used.append(stage)
        kept = self.done.get(stage)
        if kept is not None and {k: kept["sizes"].get(k) for k in made_with} == made_with:
            print(f"{stage}: kept from an earlier run ({kept['seconds']:.1f} s)", flush=True)
            return kept["result"]
        t = time.perf_counter()
        result = fn()
        self.done[stage] = {"seconds": time.perf_counter() - t, "result": result, "sizes": made_with}
        self.path.write_text(json.dumps({"stages": self.done}, indent=1, default=str))
        print(f"{stage}: {self.done[stage]['seconds']:.1f} s", flush=True)
        return result

    def seconds(self) -> dict[str, float]:
        return {k: round(self.done[k]["seconds"], 1) for k in self.used}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the wiring only")
    parser.add_argument("--out", default="runs/learning_cpu")
    parser.add_argument("--rl-steps", type=int, help="override the RL steps")
    parser.add_argument("--lr", type=float, help="override the RL learning rate")
    parser.add_argument("--rl-seed", type=int, help="override the RL seed (a replicate on the same cold start)")
    parser.add_argument("--kl", type=float, help="override train.algorithm.kl_coef (KL anchor to the SFT model)")
    parser.add_argument("--prompts", type=int, help="override the problems per RL step (each sampled `group` times)")
    parser.add_argument("--mini-batches", type=int, help="override train.ppo_mini_batches (optimiser steps per batch)")
    parser.add_argument("--temperature", type=float, help="override the RL sampling temperature (rollout.temperature)")
    parser.add_argument("--code-penalty", type=float,
                        help="override reward.code_penalty in RL (ToRL: -0.5 when a code call fails to run)")
    parser.add_argument("--anchor-dropped", type=int, metavar="N",
                        help="override train.anchor_dropped_tokens: KL to the SFT model on the first N tokens of "
                             "the groups dynamic sampling drops (where the tool is chosen)")
    parser.add_argument("--lr-decay", choices=("constant", "linear", "cosine"),
                        help="override train.lr_decay: the RL learning rate after warm-up")
    parser.add_argument("--min-lr-ratio", type=float, help="override train.min_lr_ratio: the decay's floor")
    parser.add_argument("--refill", action=argparse.BooleanOptionalAction,
                        help="override train.refill_dropped_groups: a dropped group's replacement joins the running "
                             "rollout (--no-refill: generation rounds)")
    parser.add_argument("--max-batch", type=int, help="override rollout.max_batch_sequences in RL (rows decoded together)")
    parser.add_argument("--autocast", choices=("none", "bfloat16"),
                        help="override train.autocast: the RL update's forward in bf16 mixed precision")
    parser.add_argument("--sampled", type=int, default=0, metavar="K",
                        help="also evaluate SFT and SFT + DAPO with K samples at the RL temperature (avg@K, pass@K; "
                             "0 = skip)")
    parser.add_argument("--eval-checkpoint", type=int, action="append", default=[], metavar="STEP",
                        help="also evaluate the RL checkpoint of step STEP held out (one of the last two kept; "
                             "repeatable): what a run of STEP steps would give with a constant learning rate, "
                             "as nothing else depends on the step count (refused with --lr-decay)")
    args = parser.parse_args()
    sizes, out = (QUICK if args.quick else FULL), Path(args.out)
    sizes = dataclasses.replace(sizes, rl_steps=args.rl_steps or sizes.rl_steps, lr=args.lr or sizes.lr,
                                rl_seed=sizes.rl_seed if args.rl_seed is None else args.rl_seed,
                                kl_coef=sizes.kl_coef if args.kl is None else args.kl,
                                mini_batches=args.mini_batches or sizes.mini_batches,
                                prompts=args.prompts or sizes.prompts,
                                temperature=sizes.temperature if args.temperature is None else args.temperature,
                                code_penalty=sizes.code_penalty if args.code_penalty is None else args.code_penalty,
                                anchor_dropped=sizes.anchor_dropped if args.anchor_dropped is None else args.anchor_dropped,
                                lr_decay=args.lr_decay or sizes.lr_decay,
                                refill=sizes.refill if args.refill is None else args.refill,
                                max_batch=args.max_batch or sizes.max_batch, autocast=args.autocast or sizes.autocast,
                                min_lr_ratio=sizes.min_lr_ratio if args.min_lr_ratio is None else args.min_lr_ratio)
    if args.eval_checkpoint and sizes.lr_decay != "constant":
        parser.error("--eval-checkpoint stands for a shorter run only at a constant learning rate: a decaying "
                     "rate depends on the run's length (drop --lr-decay, or train the shorter run)")
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(REPO_ROOT / "params.yaml", overrides={"run.tracking_uri": f"sqlite:///{out / 'mlruns.db'}"})
    t0 = time.perf_counter()
    stages = StageLog(out / "stages.json", sizes)
    with running_services(cfg, BOTH_TOOLS, str(REPO_ROOT / "params.yaml"), log_dir=out / "logs") as urls:
        _, tokenizer = load_policy(cfg.model.base_dir, cfg.model.dtype)
        train, test, traces = build_mix(sizes, urls, tokenizer, cfg.rollout.max_tool_output_chars)
        write_problems(out / "train.jsonl", train)
        write_problems(out / "test.jsonl", test)
        print(f"mix: {len(train)} train, {len(test)} held out, {len(traces)} SFT traces", flush=True)

        def held_out(model: str, name: str) -> dict:
            return evaluate_model(cfg, urls, model, out / "test.jsonl", out / name, sizes.eval_tokens)

        cold = COLD_START_FIELDS
        results = {"base": stages.run("eval_base", lambda: held_out(cfg.model.base_dir, "eval_base"), cold)}
        sft_info = stages.run("sft", lambda: sft(cfg, traces, out / "sft", sizes.sft_epochs), cold)
        results["sft"] = stages.run("eval_sft", lambda: held_out(str(out / "sft"), "eval_sft"), cold)
        stages.run("rl", lambda: fresh_rl(rl_config(sizes, out), urls, out))
        results["dapo"] = stages.run("eval_dapo", lambda: held_out(str(out / "dapo"), "eval_dapo"))
        for step in args.eval_checkpoint:
            name = f"dapo_step{step}"
            results[name] = stages.run(f"eval_{name}", lambda step=step, name=name: held_out(
                str(rl_checkpoint_model(rl_config(sizes, out), step, out / name)), f"eval_{name}"))

        def sampled_eval(model: str, name: str) -> dict:  # at the RL temperature: sharpening or new skill?
            per = evaluate_model(cfg, urls, str(out / model), out / "test.jsonl", out / name, sizes.eval_tokens,
                                 samples=args.sampled, temperature=sizes.temperature)
            return per | {"pass_at_k": solved_rate(out / name, args.sampled)}

        names = {m: f"sampled{args.sampled}_{m}" for m in (("sft", "dapo") if args.sampled else ())}
        sampled_cold = cold + ("temperature",)  # sampled SFT depends on the cold start and the temperature only
        sampled = {m: stages.run(name, lambda m=m, name=name: sampled_eval(m, name),
                                 sampled_cold if m == "sft" else None)
                   for m, name in names.items()}
    seconds = stages.seconds()
    plot_curves(out / "rl_metrics" / "train_history.jsonl", results, out / "learning_curves.png")
    summary = {"quick": args.quick, "sizes": dataclasses.asdict(sizes), "n_train": len(train), "n_test": len(test),
               "sft_traces": len(traces), "sft_final_loss": round(sft_info["sft_final_loss"], 4),
               "stage_seconds": seconds, "stages_total_seconds": round(sum(seconds.values()), 1),
               "this_invocation_seconds": round(time.perf_counter() - t0, 1),
               "results": {m: rounded(r) for m, r in results.items()},
               "sampled": {"k": args.sampled, "temperature": sizes.temperature,
                           **{m: rounded(r) for m, r in sampled.items()}},
               "dapo_minus_sft": round(results["dapo"]["mix"]["accuracy"] - results["sft"]["mix"]["accuracy"], 3),
               "sft_to_dapo_flips": rounded(paired_flips(out / "eval_sft", out / "eval_dapo")),
               "dapo_right_tool": round(results["dapo"]["mix"]["right_tool"], 3),
               "curves": str(out / "learning_curves.png")}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
