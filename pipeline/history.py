"""Per-step metrics kept on disk as they happen (nothing lost on a crash) and sent to MLflow."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pipeline.tracking import log_metrics


class MetricHistory:
    """Appends one JSON line per step; `write_csv` renders the curve file DVC plots."""

    def __init__(self, jsonl_path: Path, *, keep_existing: bool, enabled: bool = True) -> None:
        self.path, self.enabled, self.rows = jsonl_path, enabled, []
        if not enabled:  # a non-main rank of a data-parallel job records nothing
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not keep_existing:
            self.path.write_text("")
        self.rows = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.rows = [r for r in self.rows if r["step"] != step] + [row]
        with self.path.open("a") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
        log_metrics(metrics, step=step)

    def write_csv(self, path: Path, columns: list[str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["step", *columns])
            for row in sorted(self.rows, key=lambda r: r["step"]):
                writer.writerow([row["step"], *(row.get(c, "") for c in columns)])
