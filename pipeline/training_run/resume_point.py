"""Where a resume continues from: the newest checkpoint whose state is all there and consistent, or a stop.

A resume continues exactly or says why it cannot. The state it needs from a checkpoint at step S:

1. the checkpoint's files, whole (`pipeline.training_run.manifest.problem`: manifest, sizes, headers, digests) and
   its trainer state readable;
2. the run's history of steps 0..S-1, every step of them, and the very rows the run had logged when it saved
   the checkpoint (`pipeline.tracking.history.RecordedHistory.problem` against the checkpoint's
   `history_sha256`): the final metrics, the curve and the MLflow run are rendered from it.

`find_resume_point` walks the complete checkpoints newest first and takes the first that has both; those it
passes are named with the reason. `settle` acts on it: the checkpoints passed over are set aside (renamed
`step-NNNNNN.rejected`, kept until the run saves that step again), so every later reader, a data-parallel rank or
a retry, sees the one chosen as the latest; when none is usable, it stops with one line naming each and why
(`UnusableCheckpoints`). Having moved them aside, a second attempt does not fail the same way again: it finds no
checkpoint and trains from step 0 (`train.checkpoints.resume: auto`), unless the person restored what was missing and moved
them back.

A missing or short history stops the resume rather than restarting it: the checkpoints hold hours of training that
a fresh start would delete, while the history may only have been misplaced (a partial copy of `runs/`, a
cleanup); the line says which file to restore. Rebuilding the history from the MLflow run was not chosen: it
holds what the killed attempt logged past the checkpoint too, may live at another tracking URI, and is not the
file the checkpoint's digest vouches for.

Torn checkpoints (a `.tmp` left by a kill while saving, a data-parallel step directory without its manifest) are
no damage: they are named and passed over (`pipeline.training_run.checkpoint`). Which run resumes, and when, is
`pipeline.training_run.plan`'s to decide; it settles once, before anything loads, and every process of the run
loads the checkpoint it chose.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.tracking.history import TRAIN_HISTORY, RecordedHistory, recorded_history
from pipeline.training_run.checkpoint import (REJECTED, TornCheckpoints, is_complete, read_state, torn_checkpoints,
                                         torn_message)
from pipeline.training_run.manifest import MANIFEST
from pipeline.training_run.manifest import problem as files_problem
from pipeline.training_run.folder import CHECKPOINTS, HISTORY


class UnusableCheckpoints(RuntimeError):
    """Checkpoints are there but none can be resumed exactly (each is named with its reason, in one line)."""


@dataclass(frozen=True)
class Rejected:
    checkpoint: Path
    reason: str


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path | None  # the newest usable checkpoint; None when there is none
    rejected: tuple[Rejected, ...]  # complete checkpoints passed over (newer than `checkpoint`), newest first
    torn: tuple[Path, ...]  # incomplete ones, passed over as a kill leaves them


def checkpoint_problem(path: Path, history: RecordedHistory) -> str | None:
    """Why a resume cannot continue exactly from the checkpoint at `path` (None when it can)."""
    reason = files_problem(path)
    if reason is not None:
        return reason
    try:
        state = read_state(path)
    except ValueError as err:
        return str(err)
    return history.problem(state.step, state.history_sha256)


def find_resume_point(root: Path, history: RecordedHistory) -> ResumePoint:
    """The newest checkpoint under `root` a resume can continue from exactly, and those passed over."""
    complete = sorted((p for p in (root / CHECKPOINTS).glob("step-??????") if is_complete(p)), reverse=True)
    rejected: list[Rejected] = []
    for path in complete:
        reason = checkpoint_problem(path, history)
        if reason is None:
            return ResumePoint(path, tuple(rejected), tuple(torn_checkpoints(root)))
        rejected.append(Rejected(path, reason))
    return ResumePoint(None, tuple(rejected), tuple(torn_checkpoints(root)))


def set_aside(checkpoint: Path) -> Path:
    """Rename a checkpoint out of every reader's way (`step-NNNNNN.rejected`), replacing one set aside earlier."""
    target = checkpoint.with_name(checkpoint.name + REJECTED)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(checkpoint, target)
    return target


def _named(rejected: tuple[Rejected, ...]) -> str:
    return "; ".join(f"{r.checkpoint.name}: {' '.join(r.reason.split())}" for r in rejected)  # one line


def settle(root: Path, history: RecordedHistory, *, insisted: bool = False) -> ResumePoint:
    """Find the resume point and act on it (see the module): set aside what it passes over and say so; raise
    `UnusableCheckpoints` when nothing is usable, and (`insisted`: `--resume`) `TornCheckpoints` when there are
    only torn ones."""
    point = find_resume_point(root, history)
    moved = [set_aside(r.checkpoint) for r in point.rejected]
    if point.checkpoint is None and point.rejected:
        raise UnusableCheckpoints(
            f"no checkpoint in {root / CHECKPOINTS} can be resumed exactly: {_named(point.rejected)}. Set aside as "
            f"{', '.join(p.name for p in moved)}: restore what is named and rename them back to resume, or run "
            "again to train from step 0")
    if point.checkpoint is None and point.torn and insisted:
        raise TornCheckpoints(torn_message(root, list(point.torn)))
    if point.rejected and point.checkpoint is not None:  # (no checkpoint with rejected ones raised above)
        print(f"train: resuming from {point.checkpoint.name}, not from the newer {_named(point.rejected)} "
              f"(set aside as {', '.join(p.name for p in moved)})", file=sys.stderr, flush=True)
    if point.checkpoint is not None and point.torn:
        print(f"--resume: skipping torn checkpoints {', '.join(map(str, point.torn))} (killed while saving: no "
              f"{MANIFEST}); resuming from {point.checkpoint}", file=sys.stderr, flush=True)
    return point


def run_history(run_dir: Path, metrics_dir: Path) -> RecordedHistory:
    """The history a resume of the run in `run_dir` reads (its own copy first, else the stage's output)."""
    return recorded_history(metrics_dir / TRAIN_HISTORY, run_dir / HISTORY)
