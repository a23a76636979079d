"""Evaluate a model on benchmarks with the rollout engine and the reward verifiers (TAPO Table 1).

    benchmarks = load_benchmarks(cfg)                # every file read first: bad input fails at once
    model      = load(resolve_model(cfg.model))      # path, embedded name, hub id or MLflow URI
    for each benchmark, for each chunk of problems not yet in eval_samples.jsonl:
        groups  = engine.rollout(chunk, samples)     # with tools (mode tools) or none (no_tools)
        records = score + judge each sample          # reward verifiers; optional LLM judge
        append records                               # resumable: finished chunks are kept
    eval.json, eval_table.md, eval_plots/*.png       # summary, Table-1 layout, Figures 3-4

Greedy decoding (temperature 0, one sample) gives pass@1; with samples > 1 and a
temperature, avg@k and unbiased pass@k. The sampler seed of a chunk depends only on the
run seed and the chunk's position, so a resumed run equals an uninterrupted one, sampled or not.

Departures from the papers: TAPO/ToRL run one batch over the whole test set; here problems go
in chunks of `chunk_problems` so a crash loses at most one chunk. Accuracy is the rule-based
verifier's (the reward's f_T); the LLM judge, when enabled, may only turn a rejected fact
answer into an accepted one, never the reverse. A chunk in which a tool service failed
(`ToolResult.infrastructure`) is not scored as the model's answers: the run stops with
`ToolOutage` naming the service, before the chunk is stored, so a resumed run samples it again;
likewise a judge that cannot answer stops the run with `JudgeUnavailable` before the chunk is stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow

from pipeline.config import RunConfig
from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.model import ModelConfig
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.run import TracesSection
from pipeline.config.sandbox import SandboxConfig
from pipeline.config.search import SearchConfig
from pipeline.config.tools import ToolEntry
from pipeline.data.judge_client import JudgeUnavailable
from pipeline.evaluation.benchmarks import Benchmark, load_benchmarks
from pipeline.evaluation.judge import judge_records
from pipeline.evaluation.labels import run_label
from pipeline.tracking.model_source import fingerprint, resolve_model
from pipeline.evaluation.report import headline as evaluation_headline
from pipeline.evaluation.report import write_reports
from pipeline.evaluation.results import RUN_FILE, RunResult, load_run
from pipeline.evaluation.setting import evaluation_setting
from pipeline.tracking.headline import HEADLINE_DIR, PREFIX, eval_headline, headline_file
from pipeline.evaluation.store import SAMPLES_FILE, SampleStore, run_key
from pipeline.evaluation.summary import summarise
from pipeline.jsonl import write_json
from pipeline.model import load_policy
from pipeline.tools.outages import OutageCounts, ToolOutage
from pipeline.tracking.progress import progress
from pipeline.tracking.traces import finish_traces, log_evaluation_traces
from pipeline.protocols import protocol_of
from pipeline.reward import route, score_trajectory
from pipeline.rollout.engine import RolloutEngine
from pipeline.rollout.offered import TOOLS_FOR_TYPE
from pipeline.tools.base import Tool
from pipeline.tools.factory import make_tools
from pipeline.types import Group, Problem, ToolName

METRICS_FILE = "eval.json"
SAMPLES_TABLE = "evaluation/samples.json"  # the samples as an MLflow table
TABLE_RESPONSE_CHARS = 2000


class EvaluationError(ValueError):
    """Input the evaluation cannot use (model, tools, benchmarks); the message names it."""


@dataclass
class _Plan:
    """What the chunks read: the evaluate, rollout and reward sections, and which problems are logged as traces."""
    evaluate: EvaluateConfig
    rollout: RolloutConfig
    reward: RewardConfig
    traces: TracesSection
    benchmarks: list[Benchmark]
    engine: RolloutEngine
    store: SampleStore


def tools_needed(benchmarks: list[Benchmark]) -> tuple[ToolName, ...]:
    """The tool services the benchmarks' problem types may call (what the flow starts)."""
    types = {p.type for b in benchmarks for p in b.problems}
    return tuple(sorted({tool for t in types for tool in TOOLS_FOR_TYPE.get(t, ())}))


def load_model(model: str, mc: ModelConfig, tracking_uri: str):
    """`model` (a path, embedded name, hub id or MLflow URI, resolved against `tracking_uri`) in model.dtype on
    model.device, in eval mode; with the path it resolved to."""
    resolved = resolve_model(model, tracking_uri)
    try:
        policy, tokenizer = load_policy(resolved, mc.dtype, mc.device)
    except (OSError, ValueError) as err:
        raise EvaluationError(f"model {model!r}: cannot load: {err}") from None
    policy.eval()
    return policy, tokenizer, resolved


def make_eval_tools(mode: str, entries: Sequence[ToolEntry], sandbox: SandboxConfig, search: SearchConfig,
                    benchmarks: list[Benchmark], urls: Mapping[ToolName, str]) -> dict[ToolName, Tool]:
    """The registry's tools (`rollout.tools` entries; code and search clients configured by the sandbox and search
    sections) for evaluate.mode `tools`, none for `no_tools`; a service the benchmarks need without a URL is refused
    before any rollout."""
    if mode == "no_tools":
        return {}
    missing = [t for t in tools_needed(benchmarks) if t not in urls]
    if missing:
        raise EvaluationError(f"mode 'tools' needs running services for {missing}; got URLs for {sorted(urls)}")
    return make_tools(entries, sandbox, search, urls)


def sample_records(group: Group, benchmark: Benchmark, rc: RolloutConfig, reward: RewardConfig
                   ) -> list[dict[str, Any]]:
    """One record per trajectory: question, full response, tool calls, answer, gold, score (scored by the reward
    section's verifiers under the rollout section's protocol and policy-token budget)."""
    p = group.problem
    kind, protocol = route(p, reward), protocol_of(rc)
    out = []
    for i, t in enumerate(group.trajectories):
        r = score_trajectory(p, t, reward, protocol=protocol, max_policy_tokens=rc.max_policy_tokens)
        out.append({
            "benchmark": benchmark.name, "category": benchmark.category, "id": p.id, "sample": i,
            "question": p.question, "gold": list(p.answers), "type": p.type, "verifier": kind,
            "response": t.text, "predicted": r.predicted, "score": r.accuracy, "reward": r.total,
            "format_ok": r.format_ok, "finish_reason": t.finish_reason, "turns": t.turns,
            "policy_tokens": t.policy_token_count, "response_tokens": len(t.response_ids),
            "tool_calls": [{"tool": c.tool, "input": c.input, "output": c.result.output, "ok": c.result.ok,
                            "status": c.result.status, "latency_s": round(c.result.latency_s, 4)}
                           for c in t.tool_calls],
        })
    return out


def chunks(problems: tuple[Problem, ...], size: int) -> list[tuple[Problem, ...]]:
    return [problems[i:i + size] for i in range(0, len(problems), size)]


async def _evaluate_chunks(plan: _Plan) -> None:
    ec = plan.evaluate
    position = 0
    # A bar with ETA over samples on a terminal, a line every 30 s elsewhere (a log, a flow's worker).
    total = sum(len(b.problems) for b in plan.benchmarks) * ec.samples
    with progress(total, "evaluate", "sample") as bar:
        for bench in plan.benchmarks:
            for chunk in chunks(bench.problems, ec.chunk_problems):
                position += 1
                await _evaluate_chunk(plan, bench, chunk, position)
                bar.update(len(chunk) * ec.samples)


async def _evaluate_chunk(plan: _Plan, bench: Benchmark, chunk: tuple[Problem, ...], position: int) -> None:
    ec = plan.evaluate
    todo = [p for p in chunk if not plan.store.done(bench.name, p.id, ec.samples)]
    if not todo:
        return
    # Seed by chunk position (not by how many rollouts this process ran) so resuming
    # reproduces exactly what an uninterrupted run would have sampled.
    plan.engine.rollouts_started = position - 1
    result = await plan.engine.arollout(list(chunk), ec.samples, temperature=ec.temperature)
    outages = OutageCounts.of(t for g in result.groups for t in g.trajectories)
    for tool in outages.over(0.0):
        raise ToolOutage(f"tool service {tool!r} failed {outages.failures[tool]} of its {outages.calls[tool]} calls in "
                         f"chunk {position} of {bench.name} (e.g. {outages.example[tool][:300]!r}); stopped before "
                         "scoring it (a resumed run samples it again)")
    records = [r for g in result.groups if g.problem in todo
               for r in sample_records(g, bench, plan.rollout, plan.reward)]
    try:
        judged = await judge_records(records, ec.judge)
    except JudgeUnavailable as err:  # an outage scores nothing: the chunk is judged again on resume
        raise JudgeUnavailable(f"{err}; stopped before storing chunk {position} of {bench.name} "
                               "(a resumed run judges it again)") from None
    plan.store.append(judged)
    log_evaluation_traces(plan.traces, bench.name, bench.problems, [g for g in result.groups if g.problem in todo],
                          judged)  # each problem a trace in the run (pipeline.tracking.traces)


async def _evaluate(plan: _Plan) -> None:
    try:
        await _evaluate_chunks(plan)
    finally:
        for tool in plan.engine.tools.values():
            await tool.aclose()


def _key(model_id: str, ec: EvaluateConfig, rollout: RolloutConfig, reward: RewardConfig, seed: int, dtype: str
         ) -> str:
    """The samples file's key: everything that decides what was sampled and how it was scored (a stored sample
    is resumed only under the same key)."""
    return run_key({"model": model_id, "mode": ec.mode, "samples": ec.samples,
                    "temperature": ec.temperature, "rollout": rollout.model_dump(), "seed": seed,
                    "dtype": dtype, "reward": reward.scoring(), "judge": ec.judge.model_dump()})


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], *, model_path: str | None = None) -> dict[str, float]:
    """Evaluate, write eval.json, eval_samples.jsonl, eval_table.md and plots; return the metrics."""
    ec = cfg.evaluate
    benchmarks = load_benchmarks(ec)
    for d in ec.compare_dirs:  # a bad compare dir fails now, not after the rollouts
        load_run(Path(d))
    model_name = model_path or ec.model
    policy, tokenizer, resolved = load_model(model_name, cfg.model, cfg.run.tracking_uri)
    tools = make_eval_tools(ec.mode, cfg.rollout.tools, cfg.sandbox, cfg.search, benchmarks, tool_urls)
    engine = RolloutEngine(policy, tokenizer, tools, cfg.rollout, seed=cfg.run.seed)
    return evaluate_engine(cfg, engine, benchmarks, model_name=model_name, model_id=fingerprint(resolved))


def evaluate_engine(cfg: RunConfig, engine: RolloutEngine, benchmarks: list[Benchmark], *, model_name: str,
                    model_id: str) -> dict[str, float]:
    """The evaluation proper, given a built engine (tests pass in-process model doubles and tools). It reads the
    evaluate, rollout, reward, run (seed, traces) and model (dtype) sections, and the train and sft sections that
    name the policy's row (`run_label`): the run's config, as the stage's entry passes it."""
    ec = cfg.evaluate
    earlier = [load_run(Path(d)) for d in ec.compare_dirs]
    out_dir = Path(ec.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    key = _key(model_id, ec, cfg.rollout, cfg.reward, cfg.run.seed, cfg.model.dtype)
    store = SampleStore(out_dir / SAMPLES_FILE, key, resume=ec.resume)
    asyncio.run(_evaluate(_Plan(ec, cfg.rollout, cfg.reward, cfg.run.traces, benchmarks, engine, store)))
    finish_traces()  # the problems' traces, written while it evaluated
    records = store.finalize([(b.name, p.id) for b in benchmarks for p in b.problems], ec.samples)
    metrics = summarise(records, ec.pass_k) | {"resumed_samples": float(store.resumed)}
    write_json(out_dir / METRICS_FILE, metrics)
    label = run_label(model_name, ec, cfg.train, cfg.sft, cfg.reward.tepo)
    result = RunResult(label=label, model=model_name, mode=ec.mode,
                       benchmarks={b.name: b.category for b in benchmarks}, metrics=metrics, records=records)
    # the headline (a DVC metric: a few short keys) in its file; in MLflow beside the pooled detail
    headline = evaluation_headline([*earlier, result], {n: b.output_dir for n, b in ec.baselines.items()})
    write_json(headline_file(out_dir, "eval"), headline)
    headline = eval_headline(metrics, {b.name: b.category for b in benchmarks}) | headline
    write_json(out_dir / RUN_FILE, result.header())
    artifacts = write_reports(out_dir, result, earlier, plots=ec.plots)
    log_to_mlflow(metrics | {PREFIX + k: v for k, v in headline.items()},
                  [out_dir / METRICS_FILE, headline_file(out_dir, "eval"), out_dir / SAMPLES_FILE, out_dir / RUN_FILE,
                   *artifacts], records, evaluation_setting(ec, cfg.rollout.protocol, benchmarks))
    return metrics


def samples_table(records: list[dict[str, Any]]) -> dict[str, list]:
    """One row per sample, the columns a reader scans (MLflow shows it as a table, not as JSON lines)."""
    return {"benchmark": [r["benchmark"] for r in records], "id": [r["id"] for r in records],
            "sample": [r["sample"] for r in records], "question": [r["question"] for r in records],
            "gold": [" | ".join(map(str, r["gold"])) for r in records], "predicted": [r["predicted"] for r in records],
            "score": [r["score"] for r in records], "reward": [r["reward"] for r in records],
            "format_ok": [r["format_ok"] for r in records], "tool_calls": [len(r["tool_calls"]) for r in records],
            "response": [r["response"][:TABLE_RESPONSE_CHARS] for r in records]}


def log_to_mlflow(metrics: Mapping[str, float], files: list[Path], records: list[dict[str, Any]],
                  setting: Mapping[str, str]) -> None:
    """Log into the active MLflow run, if the caller opened one (the flow does; tests need not): the metrics,
    the setting they are comparable within (tags `eval.setting.*`), the files and the samples as a table."""
    if mlflow.active_run() is None:
        return
    mlflow.log_metrics({(k if k.startswith(PREFIX) else f"eval/{k}").replace("@", "_at_"): float(v)
                        for k, v in metrics.items()})
    mlflow.set_tags({f"eval.setting.{k}": v for k, v in setting.items()})
    for path in files:
        folder = "plots" if path.suffix == ".png" else path.parent.name if path.parent.name == HEADLINE_DIR else ""
        mlflow.log_artifact(str(path), artifact_path=f"evaluation/{folder}".rstrip("/"))
    mlflow.log_table(samples_table(records), artifact_file=SAMPLES_TABLE)
