"""Evaluate a policy with tools on a problem file: accuracy, tool use, format errors, lengths.

Greedy decoding (temperature 0, one sample) gives pass@1; with `samples` > 1 and a
temperature, avg@k and unbiased pass@k are reported. Every sample is written to
`samples.jsonl` (question, full response, extracted answer, gold, score, tool calls) for
error analysis.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.config import RunConfig
from pipeline.evaluation.pass_at_k import pass_at_k
from pipeline.jsonl import read_problems, write_json, write_json_lines
from pipeline.model import load_policy
from pipeline.reward import score_trajectory
from pipeline.rollout.engine import RolloutEngine
from pipeline.tools.factory import make_tools
from pipeline.types import Group, RewardBreakdown, ToolName


def sample_record(group: Group, rewards: tuple[RewardBreakdown, ...]) -> list[dict]:
    p = group.problem
    return [
        {
            "id": p.id, "source": p.source, "question": p.question, "gold": list(p.answers),
            "response": t.text, "predicted": r.predicted, "score": r.accuracy, "reward": r.total,
            "format_ok": r.format_ok, "finish_reason": t.finish_reason, "policy_tokens": t.policy_token_count,
            "tool_calls": [{"tool": c.tool, "input": c.input, "output": c.result.output, "ok": c.result.ok}
                           for c in t.tool_calls],
        }
        for t, r in zip(group.trajectories, rewards, strict=True)
    ]


def summarise(records: list[dict], samples: int) -> dict[str, float]:
    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_source[r["source"]].append(r)
    out: dict[str, float] = {"n_problems": len(records) / samples}
    for name, rows in sorted(by_source.items()) + [("all", records)]:
        out[f"{name}/accuracy"] = float(np.mean([r["score"] > 0.9 for r in rows]))
        out[f"{name}/format_error_rate"] = float(np.mean([not r["format_ok"] for r in rows]))
        out[f"{name}/mean_policy_tokens"] = float(np.mean([r["policy_tokens"] for r in rows]))
        for tool in ("code", "search"):
            out[f"{name}/calls_per_rollout/{tool}"] = float(np.mean([sum(c["tool"] == tool for c in r["tool_calls"])
                                                                     for r in rows]))
        if samples > 1:
            per_problem: dict[str, list[bool]] = defaultdict(list)
            for r in rows:
                per_problem[r["id"]].append(r["score"] > 0.9)
            out[f"{name}/pass@{samples}"] = float(np.mean([pass_at_k(len(v), sum(v), samples)
                                                           for v in per_problem.values()]))
    return out


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], *, model_path: str | None = None) -> dict[str, float]:
    ec = cfg.evaluate
    problems = read_problems(ec.split_file)
    if ec.limit:
        problems = problems[: ec.limit]
    model, tokenizer = load_policy(model_path or ec.model, cfg.model.dtype)
    engine = RolloutEngine(model, tokenizer, make_tools(cfg, tool_urls), cfg.rollout, seed=cfg.run.seed)
    result = engine.rollout(problems, ec.samples, temperature=ec.temperature)
    records = []
    for group in result.groups:
        rewards = tuple(score_trajectory(group.problem, t, cfg.reward, protocol=cfg.rollout.protocol,
                                         max_policy_tokens=cfg.rollout.max_policy_tokens) for t in group.trajectories)
        records += sample_record(group, rewards)
    out_dir = Path(ec.output_dir)
    write_json_lines(out_dir / "eval_samples.jsonl", records)
    metrics = summarise(records, ec.samples) | {"generator_idle_fraction": result.stats.idle_fraction}
    write_json(out_dir / "eval.json", metrics)
    return metrics
