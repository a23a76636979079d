"""Per-step metrics kept on disk as they happen (nothing lost on a crash) and sent to MLflow, and a
one-line summary of each step for logs (a progress bar only draws on a terminal).

The history is the record a resumed run finishes from: the last step's metrics (`metrics/train.json`)
and the curve are rendered from it, never from what one process happened to run. So it is state a resume needs
as much as the checkpoint: a resume at step S needs the rows of steps 0..S-1, exactly those the run had logged
when it saved that checkpoint (the checkpoint records their digest, `history_sha256`). `RecordedHistory.problem`
says why a history cannot serve a resume; the resume point (`pipeline.training_run.resume_point`) falls back to an
earlier checkpoint or stops on it, and `MetricHistory` refuses to resume over a gap (`HistoryGap`) rather than
write a history and a curve that silently lack steps. Every write is fsynced (`pipeline.outputs`)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from pipeline.outputs import append_durably, write_durably
from pipeline.tracking.progress import pace_and_eta
from pipeline.tracking.runs import log_metric_rows, log_metrics

TRAIN_HISTORY = "train_history.jsonl"  # the stage's output, in its metrics folder


class HistoryGap(ValueError):
    """A resume whose history lacks steps before its checkpoint (the file and the steps are named)."""


def _row_line(row: Mapping) -> str:
    return json.dumps(row, sort_keys=True) + "\n"


def _span(steps: Sequence[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    spans: list[list[int]] = []
    for step in steps:
        if spans and step == spans[-1][1] + 1:
            spans[-1][1] = step
        else:
            spans.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def history_sha256(rows: Sequence[Mapping]) -> str:
    """The digest a checkpoint records of the rows of the steps before it (in step order, as logged)."""
    return hashlib.sha256("".join(map(_row_line, rows)).encode()).hexdigest()


@dataclass(frozen=True)
class RecordedHistory:
    """A run's history as a resume finds it: the run's copy, else the stage's output (`source`; None when
    neither exists), its whole rows in file order up to the first damaged line (`damage` names it; a last line
    cut short by a kill is no damage: that step has no checkpoint and runs again)."""

    source: Path | None
    rows: tuple[dict, ...]
    damage: str | None = None
    looked_in: tuple[Path, ...] = ()

    def steps_before(self, step: int) -> list[dict]:
        """The rows of steps 0..step-1 in order, the last logged of each (fewer when some are missing)."""
        latest = {row["step"]: row for row in self.rows if row["step"] < step}
        return [latest[s] for s in sorted(latest)]

    def problem(self, step: int, sha256: str | None = None) -> str | None:
        """Why this history cannot serve a resume at `step` (None when it can): missing, lacking steps, or not
        the rows the checkpoint was saved after (`sha256`, the checkpoint's record of them)."""
        if step == 0:
            return None
        if self.source is None:
            where = " nor ".join(map(str, self.looked_in))
            return (f"the run's history is missing ({'neither ' if len(self.looked_in) > 1 else ''}{where} exists), "
                    f"so steps {_span(range(step))} before it have no metrics")
        rows = self.steps_before(step)
        missing = sorted(set(range(step)) - {row["step"] for row in rows})
        if missing:
            return (f"{self.source} lacks step(s) {_span(missing)} of the {step} before it"
                    + (f" ({self.damage})" if self.damage else ""))
        if sha256 is not None and history_sha256(rows) != sha256:
            return (f"{self.source}: steps {_span(range(step))} are not the rows the checkpoint was saved after "
                    "(their digest differs: the history was replaced or edited)")
        return None


def recorded_history(path: Path, run_copy: Path | None = None) -> RecordedHistory:
    """Read the run's history as a resume does (the run's copy first: DVC removes the stage's outputs)."""
    looked_in = tuple(p for p in (run_copy, path) if p is not None)
    source = next((p for p in looked_in if p.is_file()), None)
    if source is None:
        return RecordedHistory(None, (), None, looked_in)
    text = source.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):  # a kill mid-line: that step has no checkpoint, so it runs again
        text = text[: text.rfind("\n") + 1]
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(_row(source, lineno, line))
        except ValueError as err:
            return RecordedHistory(source, tuple(rows), str(err), looked_in)
    return RecordedHistory(source, tuple(rows), None, looked_in)


class MetricHistory:
    """Appends one JSON line per step; `write_csv` renders the curve file DVC plots.

    Kept twice: at `path` (the stage's output, `metrics/train_history.jsonl`) and at `run_copy`, in the run's own
    folder beside its checkpoints. DVC removes a stage's outputs before it runs the stage again, so a run resumed
    by `dvc repro` after a kill reads its earlier steps from the run's copy. A resume at step `resume_at` keeps the
    rows of the steps before it (later ones were logged after the checkpoint it resumes from and run again), and
    refuses (`HistoryGap`) when any of them is missing."""

    def __init__(self, path: Path, *, resume_at: int = 0, enabled: bool = True, run_copy: Path | None = None) -> None:
        self.path, self.run_copy, self.enabled, self.rows = path, run_copy, enabled, []
        if not enabled:  # a non-main rank of a data-parallel job records nothing
            return
        if resume_at > 0:
            recorded = recorded_history(path, run_copy)
            gap = recorded.problem(resume_at)
            if gap:
                raise HistoryGap(f"resuming at step {resume_at}: {gap}. The run cannot reproduce its metrics: "
                                 "restore the history, or train afresh (train.checkpoints.resume: never)")
            self.rows = recorded.steps_before(resume_at)
        text = "".join(map(_row_line, self.rows))
        for target in self._targets():
            write_durably(target, text)

    def _targets(self) -> list[Path]:
        return [self.path] + ([self.run_copy] if self.run_copy is not None else [])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        self.rows = [r for r in self.rows if r["step"] != step] + [row]
        for target in self._targets():
            append_durably(target, _row_line(row))
        log_metrics(metrics, step=step)

    def log_earlier_steps(self) -> None:
        """Send the steps before a resume's checkpoint to the active MLflow run: a resumed attempt logs into a
        run of its own (`pipeline.tracking.runs.tracked_run`), which then holds every step once."""
        if self.enabled and self.rows:
            log_metric_rows(self.rows)

    def digest(self, steps_done: int) -> str | None:
        """`history_sha256` of the rows of steps 0..steps_done-1, for the checkpoint saved after them (None on a
        rank that records nothing)."""
        if not self.enabled:
            return None
        return history_sha256(RecordedHistory(self.path, tuple(self.rows)).steps_before(steps_done))

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
        write_durably(path, out.getvalue())


def _row(path: Path, lineno: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{lineno}: not a metrics row ({err.msg}): damaged") from None
    if not isinstance(row, dict) or type(row.get("step")) is not int:
        raise ValueError(f"{path}:{lineno}: not a metrics row (an object with an integer 'step'): damaged")
    return row


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
