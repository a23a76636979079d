"""Compare the last N runs of an experiment: one row per top-level MLflow run, key metrics as columns.

    python -m pipeline.tracking.compare [--last N] [--experiment NAME] [--tracking-uri URI] [--params params.yaml]

A pipeline run's row gathers the metrics of its nested stage runs (train, evaluate, sft); a
stage run started on its own (e.g. `python -m flows.evaluate --model runs/step12`, named `evaluate-step12`) is a
row by itself, its model in the `model` column. Experiment and tracking URI default to the params file's `run`
section. Columns no row has are left out. Training and evaluation figures are each stage's headline (training's
"final": the mean over the last quarter of the steps, as the stage's last line and `metrics/headline/train.json`
say; `pipeline.tracking.headline`), never its last step; a run logged before headlines existed falls back to its
last logged value.

Two accuracies compare only within one evaluation setting, so each row also shows what its evaluation (the
`evaluate` stage, the policy's) ran on: split, problem count, samples, temperature and model (the run's
`eval.setting.*` tags, `pipeline.evaluation.setting`). Below the table, every param whose value differs between
the rows shown (the whole config each top-level run logged; not its stages' own figures), one line a key.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipeline.config import DEFAULT_PARAMS, ConfigError, load_config


def parser() -> argparse.ArgumentParser:
    """The command line, built before MLflow is imported (seconds), so `--help` answers at once."""
    built = argparse.ArgumentParser(prog="python -m pipeline.tracking.compare",
                                    description="Print the key metrics of the last N runs from MLflow.")
    built.add_argument("--last", type=int, default=10, help="number of top-level runs (default 10)")
    built.add_argument("--experiment", default=None, help="experiment name (default: run.experiment in params)")
    built.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: run.tracking_uri)")
    built.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file for the defaults")
    return built


if __name__ == "__main__":
    parser().parse_args()

from mlflow import MlflowClient  # noqa: E402  (after the command line: see `parser`)
from mlflow.entities import Run  # noqa: E402

from pipeline.tracking.views import stage_headline  # noqa: E402

# (stage, headline name, metric key when the run has no headline, column title): what a reader compares first.
KEY_METRICS: tuple[tuple[str, str | None, str, str], ...] = (
    ("sft", None, "sft/loss", "sft loss"),
    ("train", "reward", "reward/mean", "reward"),
    ("train", "accuracy", "reward/accuracy", "train acc"),
    ("train", "format_error_rate", "reward/format_error_rate", "format err"),
    ("evaluate", "accuracy", "eval/all/accuracy", "eval acc"),
    ("evaluate", "format_error_rate", "eval/all/format_error_rate", "eval fmt err"),
    ("evaluate", "tool_failure_rate", "eval/all/tool_failure_rate", "tool fail"),
)
KEY_PARAMS: tuple[tuple[str, str], ...] = (("train.optimizer.lr", "lr"), ("train.algorithm.kind", "algo"))
# What the policy's evaluation ran on (tags of the `evaluate` stage run; the model is its param).
SETTING_TAGS: tuple[tuple[str, str], ...] = (
    ("eval.setting.split", "split"), ("eval.setting.problems", "problems"), ("eval.setting.samples", "samples"),
    ("eval.setting.temperature", "temp"),
)
SETTING_MODEL = ("evaluate.model", "model")
EVALUATE_STAGE = "evaluate"
MAX_DIFFERING_SHOWN = 60
MAX_VALUE_CHARS = 40  # a long param value (a path, a prompt) is cut in the differing-params table
PARENT_TAG = "mlflow.parentRunId"
SEARCH_LIMIT = 2000


@dataclass
class Row:
    run: Run
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    setting: dict[str, str] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)  # every param the row's own run logged: its config


def _stage(run: Run) -> str:
    return run.data.tags.get("stage", "")


def _absorb(row: Row, run: Run) -> None:
    """Take a run's key metrics into its row; runs come newest first, so a stage's newest run wins."""
    headline = stage_headline(run)
    for stage, name, key, title in KEY_METRICS:
        if _stage(run) != stage:
            continue
        if name in headline:
            row.metrics.setdefault(title, headline[name])
        elif key in run.data.metrics:
            row.metrics.setdefault(title, run.data.metrics[key])
    for key, title in KEY_PARAMS:
        if key in run.data.params:
            row.params.setdefault(title, run.data.params[key])
    if _stage(run) == EVALUATE_STAGE:
        for tag, title in SETTING_TAGS:
            if tag in run.data.tags:
                row.setting.setdefault(title, run.data.tags[tag])
        key, title = SETTING_MODEL
        if key in run.data.params:
            row.setting.setdefault(title, run.data.params[key])


def collect_rows(client: MlflowClient, experiment: str, last: int) -> list[Row]:
    """The last `last` top-level runs (newest first), each with its nested runs' key metrics."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"no MLflow experiment {experiment!r} (experiments: {', '.join(names) or 'none'})")
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=SEARCH_LIMIT)
    tops = [r for r in runs if PARENT_TAG not in r.data.tags][:last]
    rows = {r.info.run_id: Row(r, config=dict(r.data.params)) for r in tops}
    for run in runs:
        parent = run.data.tags.get(PARENT_TAG, run.info.run_id)
        if parent in rows:
            _absorb(rows[parent], run)
    return [rows[r.info.run_id] for r in tops]


def _fmt(value: float | str | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _cut(text: str) -> str:
    """One cell of the differing-params table: on one line (a value's line breaks shown as \\n), at most
    MAX_VALUE_CHARS long."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *body, strict=False)]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
             for line in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def differing_params(rows: Sequence[Row]) -> list[str]:
    """The params whose value is not the same in every row (a param a row lacks counts as a value), sorted."""
    keys = sorted(set().union(*(row.config for row in rows)))
    return [k for k in keys if len({row.config.get(k) for row in rows}) > 1]


def render(rows: Sequence[Row]) -> str:
    """A plain aligned text table (readable in a terminal and in CI logs), then the params that differ."""
    metric_cols = [t for *_, t in KEY_METRICS if any(t in r.metrics for r in rows)]
    param_cols = [t for _, t in KEY_PARAMS if any(t in r.params for r in rows)]
    setting_cols = [t for _, t in (*SETTING_TAGS, SETTING_MODEL) if any(t in r.setting for r in rows)]
    header = ["run", "name", "started (UTC)", "status", "commit", *param_cols, *setting_cols, *metric_cols]
    body = []
    for row in rows:
        info, tags = row.run.info, row.run.data.tags
        started = datetime.fromtimestamp(info.start_time / 1000, UTC).strftime("%Y-%m-%d %H:%M")
        body.append([info.run_id[:8], info.run_name or _stage(row.run), started, info.status,
                     tags.get("git_commit", "")[:8], *(_fmt(row.params.get(c)) for c in param_cols),
                     *(_fmt(row.setting.get(c)) for c in setting_cols), *(_fmt(row.metrics.get(c)) for c in metric_cols)])
    lines = _table(header, body)
    if len(rows) > 1:
        differing = differing_params(rows)
        if differing:
            lines += ["", f"params that differ between these {len(rows)} runs ({len(differing)}):"]
            shown = differing[:MAX_DIFFERING_SHOWN]
            lines += _table(["param", *(r.run.info.run_id[:8] for r in rows)],
                            [[key, *(_cut(_fmt(r.config.get(key))) for r in rows)] for key in shown])
            if len(differing) > len(shown):
                lines.append(f"... and {len(differing) - len(shown)} more: {', '.join(differing[len(shown):])}")
        else:
            lines += ["", f"the {len(rows)} runs logged the same params"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    command = parser()
    args = command.parse_args(argv)
    if args.last < 1:
        command.error("--last must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    experiment, uri = args.experiment, args.tracking_uri
    if experiment is None or uri is None:
        try:
            run_cfg = load_config(Path(args.params)).run
        except ConfigError as err:
            print(f"compare: {err}", file=sys.stderr)
            return 1
        experiment, uri = experiment or run_cfg.experiment, uri or run_cfg.tracking_uri
    try:
        rows = collect_rows(MlflowClient(uri), experiment, args.last)
    except ValueError as err:
        print(f"compare: {err}", file=sys.stderr)
        return 1
    print(render(rows) if rows else f"no runs in experiment {experiment!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
