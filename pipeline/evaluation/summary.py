"""Metrics from per-sample records (pure): accuracy, pass@k, tool calls, format errors, lengths.

`accuracy` is avg@k, the mean correctness over all samples (with one greedy sample it is
pass@1); `pass@k` is the unbiased estimator of Chen et al. (2021) over each problem's n
samples. A sample is correct when its score exceeds 0.9 (as `RewardBreakdown.correct`).
`all/*` pools every sample; `all/macro_accuracy` averages the benchmarks (Table 1's Avg.).
Tool choice: `tool_use` is the share of rollouts that call a tool at all; `right_tool` the share whose
first call is the tool the problem's verifier kind calls for (`RIGHT_TOOL`: search for a fact, code for a
computation), over the rollouts of problems that have one (a policy answering facts with code shows here).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from pipeline.evaluation.pass_at_k import pass_at_k

TOOLS = ("code", "search")
CORRECT_ABOVE = 0.9
RIGHT_TOOL = {"fact": "search", "calculator": "code", "math": "code"}  # verifier kind -> the tool that answers it


def is_correct(record: dict[str, Any]) -> bool:
    return record["score"] > CORRECT_ABOVE


def calls_of(record: dict[str, Any], tool: str) -> int:
    return sum(1 for c in record["tool_calls"] if c["tool"] == tool)


def first_tool(record: dict[str, Any]) -> str | None:
    return record["tool_calls"][0]["tool"] if record["tool_calls"] else None


def _tool_choice(rows: list[dict[str, Any]]) -> dict[str, float]:
    out = {"tool_use": float(np.mean([first_tool(r) is not None for r in rows]))}
    judged = [r for r in rows if r.get("verifier") in RIGHT_TOOL]
    if judged:
        out["right_tool"] = float(np.mean([first_tool(r) == RIGHT_TOOL[r["verifier"]] for r in judged]))
    return out


def _group_metrics(rows: list[dict[str, Any]], pass_k: tuple[int, ...]) -> dict[str, float]:
    per_problem: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        per_problem[r["id"]].append(is_correct(r))
    out = {
        "n_problems": float(len(per_problem)),
        "n_samples": float(len(rows)),
        "accuracy": float(np.mean([is_correct(r) for r in rows])),
        "format_error_rate": float(np.mean([not r["format_ok"] for r in rows])),
        "mean_policy_tokens": float(np.mean([r["policy_tokens"] for r in rows])),
        "tool_failure_rate": _failure_rate(rows),
    } | _tool_choice(rows)
    for tool in TOOLS:
        out[f"calls_per_rollout/{tool}"] = float(np.mean([calls_of(r, tool) for r in rows]))
    for k in pass_k:
        out[f"pass@{k}"] = float(np.mean([pass_at_k(len(v), sum(v), k) for v in per_problem.values()]))
    judged = [r for r in rows if r.get("judged")]
    if any("rule_score" in r for r in rows):
        out["accuracy_rule"] = float(np.mean([r["rule_score"] > CORRECT_ABOVE for r in rows]))
        out["judge_accepted"] = float(sum(is_correct(r) for r in judged))
    return out


def _failure_rate(rows: list[dict[str, Any]]) -> float:
    calls = [c for r in rows for c in r["tool_calls"]]
    return float(np.mean([not c["ok"] for c in calls])) if calls else 0.0


def summarise(records: list[dict[str, Any]], pass_k: tuple[int, ...] = (1,)) -> dict[str, float]:
    """Flat `benchmark/metric` -> value, plus `all/*` and `n_problems` (the DVC metrics file)."""
    if not records:
        raise ValueError("no samples to summarise")
    by_benchmark: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_benchmark[r["benchmark"]].append(r)
    out: dict[str, float] = {}
    for name, rows in list(by_benchmark.items()) + [("all", records)]:
        out |= {f"{name}/{k}": v for k, v in _group_metrics(rows, pass_k).items()}
    out["all/macro_accuracy"] = float(np.mean([out[f"{b}/accuracy"] for b in by_benchmark]))
    out["n_problems"] = out["all/n_problems"] = float(sum(out[f"{b}/n_problems"] for b in by_benchmark))
    return out


def accuracy_by_calls(records: list[dict[str, Any]], tool: str) -> dict[int, tuple[float, int]]:
    """Number of `tool` calls in a rollout -> (accuracy of those rollouts, how many there are)."""
    buckets: dict[int, list[bool]] = defaultdict(list)
    for r in records:
        buckets[calls_of(r, tool)].append(is_correct(r))
    return {n: (float(np.mean(v)), len(v)) for n, v in sorted(buckets.items())}
