"""One evaluated model/run as the reports see it, and reading an earlier run back from disk.

Each evaluation leaves `eval_run.json` (label, model, mode, benchmark -> category), `eval.json`
and `eval_samples.jsonl` in its output dir; `load_run(dir)` reads them back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.jsonl import iter_json_lines

RUN_FILE = "eval_run.json"


@dataclass
class RunResult:
    """One evaluated model/run: what it was, its metrics, its per-sample records."""

    label: str
    model: str
    mode: str
    benchmarks: dict[str, str]  # name -> category, in evaluation order
    metrics: dict[str, float]
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)
    source: str = ""  # the output folder it was read back from (load_run); "" for the run in hand

    def header(self) -> dict[str, Any]:
        return {"label": self.label, "model": self.model, "mode": self.mode, "benchmarks": self.benchmarks}

    def value(self, benchmark: str, metric: str) -> float | None:
        return self.metrics.get(f"{benchmark}/{metric}")


def load_run(out_dir: Path) -> RunResult:
    """An earlier evaluation's results; a clear error when the directory lacks them."""
    missing = [n for n in (RUN_FILE, "eval.json", "eval_samples.jsonl") if not (out_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"compare dir {out_dir}: missing {missing} (not an evaluation output dir? the main job's "
                                "baselines come from `dvc repro evaluate-base evaluate-sft`; evaluate.compare_dirs: [] "
                                "compares with nothing)")
    header = json.loads((out_dir / RUN_FILE).read_text(encoding="utf-8"))
    metrics = json.loads((out_dir / "eval.json").read_text(encoding="utf-8"))
    records = [r for _, r in iter_json_lines(out_dir / "eval_samples.jsonl")]
    return RunResult(header["label"], header["model"], header["mode"], header["benchmarks"], metrics, records,
                     str(out_dir))
