"""The headline numbers of a stage: a handful a reader compares first, apart from the diagnostics.

`metrics/headline/train.json` and `metrics/headline/eval.json` are the files dvc.yaml declares as metrics
(so `dvc metrics show` / `dvc exp show` show a few columns, accuracy among them); the full records stay
beside them (`metrics/train.json`: the last step's every metric; `metrics/eval.json`: every benchmark's).
The same numbers are logged to the stage's MLflow run as `headline/<name>`, and the flows copy them onto
the pipeline's parent run (`<stage>/<name>`), so a collapsed parent row reads like `dvc exp show`.

Training's headline is the mean over the run's last quarter of steps (at least one step), not the last
step alone: one step is a batch of a few prompts, too noisy to compare runs by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import mlflow

from pipeline.config.run import RunSection
from pipeline.outputs import write_json_durably
from pipeline.tracking.curve import plot_curve

HEADLINE_DIR = "headline"
PREFIX = "headline/"
TRAIN_KEYS = {"reward/mean": "reward", "reward/accuracy": "accuracy", "reward/format_error_rate": "format_error_rate",
              "train/kept_group_fraction": "kept_group_fraction",
              "rollout/entropy_reducing_call_share": "entropy_reducing_call_share"}
TOOL_CALLS = "rollout/calls_per_traj/"
EVAL_KEYS = ("accuracy", "format_error_rate", "tool_failure_rate", "calls_per_rollout/code", "calls_per_rollout/search",
             "tool_use", "right_tool")


def last_quarter(n_steps: int) -> int:
    return max(1, math.ceil(n_steps / 4))


def train_headline(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Reward, accuracy, format errors, kept groups and tool calls per trajectory, averaged over the last
    quarter of the steps (`rows`: the history, one row per step), plus the number of steps."""
    ordered = sorted(rows, key=lambda r: r["step"])
    tail = ordered[-last_quarter(len(ordered)):]
    keys = {k: v for k, v in TRAIN_KEYS.items()} | {
        k: f"calls_per_traj/{k.removeprefix(TOOL_CALLS)}" for r in tail for k in r if k.startswith(TOOL_CALLS)}
    out: dict[str, float] = {}
    for source, name in sorted(keys.items(), key=lambda kv: kv[1]):
        values = [float(r[source]) for r in tail if source in r]
        if values:
            out[name] = sum(values) / len(values)
    return out | {"steps": float(len(ordered)), "averaged_steps": float(len(tail))}


def eval_headline(metrics: Mapping[str, float], categories: Mapping[str, str]) -> dict[str, float]:
    """Pooled accuracy, format errors, tool failures and calls; accuracy per benchmark and per category
    (when there are several); the number of problems. `categories`: benchmark -> category."""
    out = {name: metrics[f"all/{name}"] for name in EVAL_KEYS if f"all/{name}" in metrics}
    if len(categories) > 1:
        out |= {f"accuracy/{b}": metrics[f"{b}/accuracy"] for b in categories}
    by_category: dict[str, list[str]] = {}
    for bench, category in categories.items():
        by_category.setdefault(category, []).append(bench)
    if len(by_category) > 1:
        for category, benches in by_category.items():
            solved = sum(metrics[f"{b}/accuracy"] * metrics[f"{b}/n_samples"] for b in benches)
            out[f"accuracy/{category}"] = solved / sum(metrics[f"{b}/n_samples"] for b in benches)
    return out | {"n_problems": metrics["n_problems"]}


def headline_file(metrics_dir: Path, stage: str) -> Path:
    return Path(metrics_dir) / HEADLINE_DIR / f"{stage}.json"


def log_headline(run_cfg: RunSection, run_id: str | None, headline: Mapping[str, float]) -> None:
    """`headline/<name>` metrics on run `run_id` (which may have ended); nothing without a run."""
    if run_id is None:
        return
    client = mlflow.MlflowClient(run_cfg.tracking_uri)
    for name, value in headline.items():
        client.log_metric(run_id, PREFIX + name, float(value))


def write_train_headline(metrics_dir: Path, rows: Sequence[Mapping[str, float]], curve_columns: Sequence[str],
                         run_cfg: RunSection, run_id: str | None) -> dict[str, float]:
    """`headline/train.json`, the curve as a PNG (`train_curve.png`), and the headline on the MLflow run."""
    headline = train_headline(rows)
    write_json_durably(headline_file(metrics_dir, "train"), headline)
    plot_curve(Path(metrics_dir) / "train_curve.png", rows, curve_columns)
    log_headline(run_cfg, run_id, headline)
    return headline
