"""The training curve as a PNG beside the CSV DVC plots: `dvc plots show` renders its Vega plots with
scripts from a CDN, so offline the curve would be blank; an image renders anywhere (and in MLflow)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless servers and CI have no display

import matplotlib.pyplot as plt  # noqa: E402

from pipeline.outputs import fsync_path  # noqa: E402

LABELS = {"reward/mean": "reward (mean)", "reward/accuracy": "accuracy", "reward/format_error_rate": "format errors"}


def plot_curve(path: Path, rows: Sequence[Mapping[str, float]], columns: Sequence[str]) -> Path:
    """One line per column against the step; written beside and renamed into place."""
    ordered = sorted(rows, key=lambda r: r["step"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for column in columns:
        points = [(r["step"], r[column]) for r in ordered if column in r]
        if points:
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, marker="o", label=LABELS.get(column, column))
    ax.set_xlabel("step")
    ax.set_ylabel("reward / rate")
    ax.set_title("training: reward and accuracy per step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    fsync_path(tmp)
    tmp.replace(path)
    fsync_path(path.parent)
    return path
