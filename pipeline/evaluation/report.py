"""Comparison reports across evaluated models/runs: a markdown table in TAPO Table 1's layout.

Earlier runs (`evaluate.compare_dirs`, read by `results.load_run`) go beside the current one.

Table 1's layout: one row per method, columns grouped Fact-reasoning | Math | Comprehensive,
pass@1 (%) per benchmark, then the average per group present and over all benchmarks (the
paper averages TAPO-easy/-hard; our groups are the benchmark categories). A second table gives
tool calls per rollout (search / code), as TAPO Figure 3 and TEPO report them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.evaluation.plots import write_plots
from pipeline.evaluation.results import RunResult

TABLE_FILE = "eval_table.md"
ACCURACY_FILE = "eval_accuracy.csv"
PLOTS_DIR = "eval_plots"
CATEGORY_ORDER = ("fact", "math", "comprehensive")
CATEGORY_TITLES = {"fact": "Fact-reasoning", "math": "Math", "comprehensive": "Comprehensive"}


def column_groups(runs: list[RunResult]) -> list[tuple[str, list[str]]]:
    """(category, benchmark names) in Table 1's group order, benchmarks in first-seen order."""
    names: dict[str, str] = {}
    for run in runs:
        for name, category in run.benchmarks.items():
            names.setdefault(name, category)
    return [(c, [n for n, cat in names.items() if cat == c]) for c in CATEGORY_ORDER
            if any(cat == c for cat in names.values())]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present and len(present) == len(values) else None


def accuracy_table(runs: list[RunResult], metric: str = "pass@1") -> str:
    groups = column_groups(runs)
    benches = [(c, n) for c, names in groups for n in names]
    head = ["Method"] + [f"{CATEGORY_TITLES[c]}: {n}" for c, n in benches]
    head += [f"Avg. {CATEGORY_TITLES[c]}" for c, _ in groups if len(groups) > 1] + ["Avg."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = [run.value(n, metric) for _, n in benches]
        by_group = [_mean([run.value(n, metric) for n in names]) for _, names in groups] if len(groups) > 1 else []
        lines.append("| " + " | ".join([run.label] + [_pct(v) for v in cells + by_group + [_mean(cells)]]) + " |")
    return "\n".join(lines)


def tool_calls_table(runs: list[RunResult]) -> str:
    benches = [n for _, names in column_groups(runs) for n in names]
    head = ["Method"] + benches
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        cells = []
        for n in benches:
            search, code = run.value(n, "calls_per_rollout/search"), run.value(n, "calls_per_rollout/code")
            cells.append("–" if search is None else f"{search:.2f} / {code:.2f}")
        lines.append("| " + " | ".join([run.label] + cells) + " |")
    return "\n".join(lines)


def markdown_report(runs: list[RunResult]) -> str:
    return "\n".join([
        "# Evaluation", "",
        "Pass@1 accuracy (%) per benchmark (TAPO Table 1 layout; avg@k when samples > 1).", "",
        accuracy_table(runs, "accuracy"), "",
        "Mean tool calls per rollout (search / code).", "",
        tool_calls_table(runs), "",
        "Runs: " + "; ".join(f"{r.label} = {r.model} [{r.mode}]" for r in runs), "",
    ])


def accuracy_csv(run: RunResult) -> str:
    """`benchmark,accuracy` rows (each benchmark, then all): what DVC's Vega plot compares across experiments."""
    rows = [f"{name},{run.value(name, 'accuracy'):.6f}" for name in [*run.benchmarks, "all"]]
    return "\n".join(["benchmark,accuracy", *rows]) + "\n"


def write_reports(out_dir: Path, current: RunResult, earlier: list[RunResult], *, plots: bool) -> list[Path]:
    """Write eval_table.md, eval_accuracy.csv (and the PNG plots) for the earlier runs and the current one;
    return the files."""
    runs = [*earlier, current]
    table = out_dir / TABLE_FILE
    table.write_text(markdown_report(runs), encoding="utf-8")
    curve = out_dir / ACCURACY_FILE
    curve.write_text(accuracy_csv(current), encoding="utf-8")
    written = [table, curve]
    if plots:
        written += write_plots(out_dir / PLOTS_DIR, runs)
    return written
