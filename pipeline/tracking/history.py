"""Per-step metrics kept on disk as they happen (nothing lost on a crash) and sent to MLflow, and a
one-line summary of each step for logs (a progress bar only draws on a terminal).

The history is the record a resumed run finishes from: the last step's metrics (`metrics/train.json`)
and the curve are rendered from it, never from what one process happened to run."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from pipeline.tracking.progress import pace_and_eta
from pipeline.tracking.runs import log_metrics


class MetricHistory:
    """Appends one JSON line per step; `write_csv` renders the curve file DVC plots.

    Kept twice: at `path` (the stage's output, `metrics/train_history.jsonl`) and at `run_copy`, in the run's own
    folder beside its checkpoints. DVC removes a stage's outputs before it runs the stage again, so a run resumed
    by `dvc repro` after a kill reads its earlier steps from the run's copy. A resume at step `resume_at` keeps the
    rows of the steps before it: later ones were logged after the checkpoint it resumes from and run again."""

    def __init__(self, path: Path, *, resume_at: int = 0, enabled: bool = True, run_copy: Path | None = None) -> None:
        self.path, self.run_copy, self.enabled, self.rows = path, run_copy, enabled, []
        if not enabled:  # a non-main rank of a data-parallel job records nothing
            return
        source = run_copy if run_copy is not None and run_copy.is_file() else path
        text = source.read_text(encoding="utf-8") if resume_at > 0 and source.is_file() else ""
        if text and not text.endswith("\n"):  # a kill mid-line: that step has no checkpoint, so it runs again
            text = text[: text.rfind("\n") + 1]
        rows = [_row(source, n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
        self.rows = [row for row in rows if row["step"] < resume_at]
        text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in self.rows)
        for target in self._targets():
            _write_atomically(target, text)

    def _targets(self) -> list[Path]:
        return [self.path] + ([self.run_copy] if self.run_copy is not None else [])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.rows = [r for r in self.rows if r["step"] != step] + [row]
        for target in self._targets():
            with target.open("a") as fh:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
        log_metrics(metrics, step=step)

    def final_metrics(self, steps_done: int) -> dict[str, float]:
        """The metrics logged for the last step of a run that has done `steps_done` steps (a resumed run's
        earlier steps were logged by the process that ran them)."""
        rows = {r["step"]: r for r in self.rows}
        if steps_done - 1 not in rows:
            raise RuntimeError(f"{self.path}: no metrics for step {steps_done - 1}, the run's last "
                               f"(has steps {sorted(rows)}); the history was removed or replaced after training")
        return {k: v for k, v in rows[steps_done - 1].items() if k != "step"}

    def write_csv(self, path: Path, columns: list[str]) -> None:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["step", *columns])
        for row in sorted(self.rows, key=lambda r: r["step"]):
            writer.writerow([row["step"], *(row.get(c, "") for c in columns)])
        _write_atomically(path, out.getvalue())


def _row(path: Path, lineno: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{lineno}: not a metrics row ({err.msg}); the history was edited or "
                         "damaged, so the resumed run cannot reproduce its metrics") from None
    if not isinstance(row, dict) or type(row.get("step")) is not int:
        raise ValueError(f"{path}:{lineno}: not a metrics row (an object with an integer 'step'); the history was "
                         "edited or damaged, so the resumed run cannot reproduce its metrics")
    return row


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, path)


def step_summary(metrics: dict[str, float]) -> list[str]:
    """`["reward 0.250", "accuracy 0.310", "code 0.50 search 0.40 calls/traj"]`: a step at a glance."""
    calls = " ".join(f"{k.rsplit('/', 1)[1]} {v:.2f}" for k, v in sorted(metrics.items())
                     if k.startswith("rollout/calls_per_traj/"))
    return [f"reward {metrics.get('reward/mean', float('nan')):.3f}",
            f"accuracy {metrics.get('reward/accuracy', float('nan')):.3f}", *([f"{calls} calls/traj"] if calls else [])]


def progress_line(step: int, total: int, metrics: dict[str, float], seconds_so_far: float, steps_done: int) -> str:
    """`train step 3/40 | reward 0.250 | accuracy 0.310 | code 0.50 search 0.40 calls/traj | 85.1 s/step | ETA 52 min`:
    what a person tailing a log of a long run wants. `step` is 0-based; `steps_done` counts this invocation's steps
    (a resumed run's pace is its own)."""
    per_step = seconds_so_far / max(steps_done, 1)
    parts = [f"train step {step + 1}/{total}", *step_summary(metrics), *pace_and_eta(per_step, total - step - 1, "step")]
    return " | ".join(parts)


class StepProgress:
    """The steps a run makes, shown where a person can see them: a tqdm bar with ETA on a terminal, the last
    step's reward, accuracy and tool calls beside it; elsewhere (a log file, a flow's worker), where a bar cannot
    redraw, `progress_line` once a step. Only the main process of a data-parallel job shows either."""

    def __init__(self, first: int, total: int, *, enabled: bool) -> None:
        self.first, self.total, self.enabled = first, total, enabled
        self.bar = tqdm(range(first, total), desc="train", unit="step", disable=None if enabled else True)
        self.started = time.perf_counter()

    def __iter__(self) -> Iterator[int]:
        return iter(self.bar)

    def show(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.bar.disable:
            print(progress_line(step, self.total, metrics, time.perf_counter() - self.started, step + 1 - self.first),
                  file=sys.stderr, flush=True)
        else:
            self.bar.set_postfix_str(" | ".join(step_summary(metrics)))
