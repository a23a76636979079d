"""The headline numbers of a stage: a handful a reader compares first, apart from the diagnostics.

`metrics/headline/train.json` and `metrics/headline/eval.json` are the only files dvc.yaml declares as metrics,
so `dvc metrics show`, `dvc metrics diff` and `dvc exp show` print a few columns that fit a terminal. Their keys
are short and unique across both files (`dvc exp show` names a column by its key alone, and `--sort-by reward`
or `--keep accuracy` find exactly one): training's is `reward`; evaluation's (`pipeline.evaluation.report`) the
policy's `accuracy` and `right_tool`, each baseline's `acc_<name>` and the flips `to_right`, `to_wrong`,
`p_value`. The detail stays beside them as plain outputs: `metrics/train_final.json` (training's final figures,
below), `metrics/train.json` (the last step's every metric), `metrics/eval.json` (every benchmark's).

"Final" means one thing everywhere: the mean over the run's last quarter of steps (at least one step), never
the last step alone, whose batch of a few prompts is too noisy to compare runs by. The train stage's last line
(`final_line`), the headline's `reward`, `train_final.json`, the stage's MLflow `headline/*` metrics (which the
flows copy onto the pipeline's parent run as `train/<name>`) and `python -m pipeline.tracking.compare` all show
it; the per-step values stay the curve (`reward/mean` in MLflow, `metrics/train_curve.csv`).
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
FINAL_FILE = "train_final.json"
TRAIN_KEYS = {"reward/mean": "reward", "reward/accuracy": "accuracy", "reward/format_error_rate": "format_error_rate",
              "train/kept_group_fraction": "kept_group_fraction",
              "rollout/entropy_reducing_call_share": "entropy_reducing_call_share"}
TOOL_CALLS = "rollout/calls_per_traj/"
TRAIN_HEADLINE = ("reward",)  # of the final figures, what `dvc metrics show` prints
EVAL_KEYS = ("accuracy", "format_error_rate", "tool_failure_rate", "calls_per_rollout/code", "calls_per_rollout/search",
             "tool_use", "right_tool")


def last_quarter(n_steps: int) -> int:
    return max(1, math.ceil(n_steps / 4))


def train_final(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Training's final figures: reward, accuracy, format errors, kept groups and tool calls per trajectory,
    averaged over the last quarter of the steps (`rows`: the history, one row per step), plus the number of steps
    and of those averaged."""
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


def train_headline(final: Mapping[str, float]) -> dict[str, float]:
    """The training headline (a DVC metric): the final reward."""
    return {k: final[k] for k in TRAIN_HEADLINE if k in final}


def final_line(final: Mapping[str, float]) -> str:
    """`final (mean of the last 4 of 16 steps): reward 0.439, accuracy 0.312, format errors 0.000`."""
    shown = [f"{name} {final[key]:.3f}" for key, name in (("reward", "reward"), ("accuracy", "accuracy"),
                                                         ("format_error_rate", "format errors")) if key in final]
    return (f"final (mean of the last {final['averaged_steps']:.0f} of {final['steps']:.0f} steps): "
            + ", ".join(shown))


def eval_headline(metrics: Mapping[str, float], categories: Mapping[str, str]) -> dict[str, float]:
    """Pooled accuracy, format errors, tool failures and calls; accuracy per benchmark and per category
    (when there are several); the number of problems. `categories`: benchmark -> category. Logged to MLflow beside
    the evaluation headline; not a DVC metric (`metrics/eval.json` holds it all)."""
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


def final_file(metrics_dir: Path) -> Path:
    return Path(metrics_dir) / FINAL_FILE


def log_headline(run_cfg: RunSection, run_id: str | None, headline: Mapping[str, float]) -> None:
    """`headline/<name>` metrics on run `run_id` (which may have ended); nothing without a run."""
    if run_id is None:
        return
    client = mlflow.MlflowClient(run_cfg.tracking_uri)
    for name, value in headline.items():
        client.log_metric(run_id, PREFIX + name, float(value))


def write_train_headline(metrics_dir: Path, rows: Sequence[Mapping[str, float]], curve_columns: Sequence[str],
                         run_cfg: RunSection, run_id: str | None) -> dict[str, float]:
    """`train_final.json`, the headline `headline/train.json`, the curve as a PNG (`train_curve.png`), and the
    final figures on the MLflow run as `headline/*`; returns the final figures."""
    final = train_final(rows)
    write_json_durably(final_file(metrics_dir), final)
    write_json_durably(headline_file(metrics_dir, "train"), train_headline(final))
    plot_curve(Path(metrics_dir) / "train_curve.png", rows, curve_columns)
    log_headline(run_cfg, run_id, final)
    return final
