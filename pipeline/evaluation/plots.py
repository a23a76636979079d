"""PNG plots of evaluated runs (matplotlib, Agg backend: no display needed). Images, so `dvc plots show`
renders them offline (its Vega plots load scripts from a CDN); only plots with something to show are written.

- `accuracy.png`: accuracy and right-tool rate per benchmark (and over all), one bar per run: the models side
  by side, the comparison a reader wants first (the Vega plot of `eval_accuracy.csv` shows accuracy across DVC
  experiments).
- `tool_calls.png` (TAPO Figure 3): mean tool calls per rollout for each benchmark, one panel
  per tool, one bar per run.
- `accuracy_vs_search.png` (TAPO Figure 4), when a fact benchmark was evaluated: left, each run's mean
  search calls against its accuracy on the fact benchmarks; right, accuracy of rollouts grouped by how
  many searches they made (marker size = how many rollouts).
- `response_length.png`: distribution of policy tokens per rollout, per run.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless servers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.evaluation.results import RunResult  # noqa: E402
from pipeline.evaluation.summary import TOOLS, accuracy_by_calls  # noqa: E402

DPI = 120


def _benchmarks(runs: list[RunResult]) -> list[str]:
    names: dict[str, None] = {}
    for run in runs:
        names |= dict.fromkeys(run.benchmarks)
    return list(names)


def plot_tool_calls(path: Path, runs: list[RunResult]) -> Path:
    benches = _benchmarks(runs)
    fig, axes = plt.subplots(1, len(TOOLS), figsize=(max(6.0, 1.2 * len(benches) * len(TOOLS)), 4.2),
                             squeeze=False, sharey=True)
    width = 0.8 / len(runs)
    x = np.arange(len(benches))
    for ax, tool in zip(axes[0], TOOLS, strict=True):
        for i, run in enumerate(runs):
            values = [run.value(b, f"calls_per_rollout/{tool}") or 0.0 for b in benches]
            ax.bar(x + (i - (len(runs) - 1) / 2) * width, values, width, label=run.label)
        ax.set_title(f"{tool} calls per rollout")
        ax.set_xticks(x, benches, rotation=30, ha="right")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean calls per rollout")
    axes[0][-1].legend(fontsize=8)
    return _save(fig, path)


def _fact_records(run: RunResult) -> list[dict]:
    return [r for r in run.records if run.benchmarks.get(r["benchmark"]) == "fact"]


def plot_accuracy_vs_search(path: Path, runs: list[RunResult]) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for run in runs:
        rows = _fact_records(run)
        if not rows:
            continue
        searches = np.mean([sum(c["tool"] == "search" for c in r["tool_calls"]) for r in rows])
        accuracy = np.mean([r["score"] > 0.9 for r in rows])
        left.scatter([searches], [100 * accuracy], s=60, label=run.label)
        buckets = accuracy_by_calls(rows, "search")
        counts = list(buckets)
        right.plot(counts, [100 * a for a, _ in buckets.values()], marker="o", label=run.label)
        right.scatter(counts, [100 * a for a, _ in buckets.values()], s=[20 + 4 * n for _, n in buckets.values()],
                      alpha=0.3)
    left.set(xlabel="mean search calls per rollout", ylabel="accuracy (%)", title="fact benchmarks: per run")
    right.set(xlabel="search calls in the rollout", ylabel="accuracy (%)", title="accuracy by search calls")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no fact benchmarks evaluated", ha="center", va="center", transform=ax.transAxes)
    return _save(fig, path)


def plot_response_lengths(path: Path, runs: list[RunResult]) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lengths = [[r["policy_tokens"] for r in run.records] for run in runs]
    top = max((max(v) for v in lengths if v), default=1)
    bins = np.linspace(0, top + 1, 30)
    for run, values in zip(runs, lengths, strict=True):
        ax.hist(values, bins=bins.tolist(), histtype="step", linewidth=1.8,
                label=f"{run.label} (mean {np.mean(values):.0f})" if values else run.label)
    ax.set(xlabel="policy tokens per rollout", ylabel="rollouts", title="response length distribution")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_accuracy(path: Path, runs: list[RunResult]) -> Path:
    benches = _benchmarks(runs) + ["all"]
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(benches) * 2), 4.2), squeeze=False, sharey=True)
    width = 0.8 / len(runs)
    x = np.arange(len(benches))
    for ax, metric, title in zip(axes[0], ("accuracy", "right_tool"), ("accuracy", "first call is the right tool"),
                                 strict=True):
        for i, run in enumerate(runs):
            values = [100 * (run.value(b, metric) or 0.0) for b in benches]
            bars = ax.bar(x + (i - (len(runs) - 1) / 2) * width, values, width, label=run.label)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_title(title)
        ax.set_xticks(x, benches, rotation=30, ha="right")
        ax.set_ylim(0, 105)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("% of rollouts")
    axes[0][-1].legend(fontsize=8)
    return _save(fig, path)


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def write_plots(out_dir: Path, runs: list[RunResult]) -> list[Path]:
    """The plots with something to show (a stale one from an earlier evaluation in `out_dir` is removed)."""
    written = [plot_accuracy(out_dir / "accuracy.png", runs), plot_tool_calls(out_dir / "tool_calls.png", runs)]
    fact = out_dir / "accuracy_vs_search.png"
    if any(_fact_records(run) for run in runs):
        written.append(plot_accuracy_vs_search(fact, runs))
    else:
        fact.unlink(missing_ok=True)
    return [*written, plot_response_lengths(out_dir / "response_length.png", runs)]
