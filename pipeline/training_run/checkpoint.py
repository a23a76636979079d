"""Resumable checkpoints: model, optimiser, scheduler, RNG states, data cursor and step.

A checkpoint is written to a temporary directory (`step-NNNNNN.tmp`), every file fsynced, then its manifest
(`pipeline.training_run.manifest`: each file's size and SHA-256) written last, and the directory renamed into place
and its parent fsynced: a crash while saving never leaves a half-written checkpoint under a step's name, and a
power cut after the rename never leaves one whose files were not on the disk. A checkpoint is complete when its
manifest is there (`is_complete`); whether it is whole, and whether the run's history lets a resume continue from
it, is `pipeline.training_run.resume_point`'s to decide. A resume loads the checkpoint its plan chose
(`pipeline.training_run.plan`: the newest complete one once the resume point set aside every newer one that is not
usable); `--resume` over only torn ones (a `.tmp` left by a kill, a step directory without a manifest) refuses to
start over silently and names them (`TornCheckpoints`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

from pipeline.outputs import fsync_path, fsync_tree
from pipeline.training_run.manifest import MANIFEST, write_manifest

KEEP_LAST = 2
FILES = ("model.safetensors", "trainer.pt", "state.json")  # and the manifest, written last
STATE = "state.json"
REJECTED = ".rejected"  # the suffix of a checkpoint a resume set aside (pipeline.training_run.resume_point)


class TornCheckpoints(RuntimeError):
    """`--resume` found checkpoint directories but none complete (named in the message)."""


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimiser steps completed
    data_cursor: int  # problems drawn from the stream
    rollout_calls: int  # rollout engine calls so far (seeds its sampling generator)
    mlflow_run_id: str | None = None
    history_sha256: str | None = None  # digest of the history rows of steps 0..step-1 (tracking.history)


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / "checkpoints" / f"step-{step:06d}"


def save_checkpoint(root: Path, state: TrainerState, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler) -> Path:
    final = checkpoint_dir(root, state.step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()},
               tmp / "trainer.pt")
    (tmp / STATE).write_text(json.dumps(asdict(state), indent=2) + "\n")
    fsync_tree(tmp)  # on the disk before the manifest vouches for them
    write_manifest(tmp)  # last: the checkpoint is complete
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    fsync_path(final.parent)
    prune(final.parent, state.step)
    return final


def step_of(path: Path) -> int:
    """`step-000012`, `step-000012.tmp`, `step-000012.rejected` -> 12."""
    return int(path.name[len("step-"):len("step-") + 6])


def prune(folder: Path, saved: int) -> None:
    """After saving step `saved`: keep the last `KEEP_LAST` steps; remove staging dirs an earlier kill left torn,
    and checkpoints a resume set aside at or before this step (the run has redone their steps)."""
    rejected = [p for p in folder.glob(f"step-??????{REJECTED}") if step_of(p) <= saved]
    for old in [*sorted(folder.glob("step-??????"))[:-KEEP_LAST], *folder.glob("step-??????.tmp"), *rejected]:
        shutil.rmtree(old, ignore_errors=True)


def is_complete(path: Path) -> bool:
    """A step directory whose save finished (its manifest, written last), single-process or data-parallel."""
    return path.is_dir() and (path / MANIFEST).is_file()


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint of the highest step under `root` (None when there is none)."""
    found = [p for p in sorted((root / "checkpoints").glob("step-??????")) if is_complete(p)]
    return found[-1] if found else None


def torn_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories a kill left unfinished: `.tmp` staging dirs and step dirs without a manifest."""
    folder = root / "checkpoints"
    return sorted([*folder.glob("step-??????.tmp"), *(p for p in folder.glob("step-??????") if not is_complete(p))])


def torn_message(root: Path, torn: list[Path]) -> str:
    return (f"--resume: no complete checkpoint under {root / 'checkpoints'}, only torn ones (killed while saving, "
            f"or saved by a version that wrote no {MANIFEST}): {', '.join(map(str, torn))}. Remove them to train "
            "from step 0, or restore a complete checkpoint")


def read_state(path: Path) -> TrainerState:
    """The trainer state a checkpoint holds; ValueError naming the file when it is no such record."""
    try:
        return TrainerState(**json.loads((path / STATE).read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path / STATE}: not a trainer state ({type(err).__name__}: {err})") from None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
    state = read_state(path)
    load_model(model, str(path / "model.safetensors"))
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return state
