"""Resumable checkpoints: model, optimiser, scheduler, RNG states, data cursor and step.

A checkpoint is written to a temporary directory (`step-NNNNNN.tmp`) and renamed into place, so a
crash while saving never leaves a half-written checkpoint that `--resume` would pick up. A resume
takes the latest complete checkpoint; one that finds only torn ones (a `.tmp` left by a kill, a
step directory missing a file) refuses to start over silently and names them (`resume_checkpoint`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_model, save_model

KEEP_LAST = 2
FILES = ("model.safetensors", "trainer.pt", "state.json")  # state.json last: written once the rest is
DEEPSPEED_FILES = ("rng_rank000.pt", "state.json")  # a data-parallel step (pipeline.distributed): state.json last too


class TornCheckpoints(RuntimeError):
    """`--resume` found checkpoint directories but none complete (named in the message)."""


@dataclass(frozen=True)
class TrainerState:
    step: int  # optimiser steps completed
    data_cursor: int  # problems drawn from the stream
    rollout_calls: int  # rollout engine calls so far (seeds its sampling generator)
    mlflow_run_id: str | None = None


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
    (tmp / "state.json").write_text(json.dumps(asdict(state), indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in [*sorted(final.parent.glob("step-??????"))[:-KEEP_LAST], *final.parent.glob("step-??????.tmp")]:
        shutil.rmtree(old, ignore_errors=True)  # older steps, and staging dirs an earlier kill left torn
    return final


def is_complete(path: Path) -> bool:
    """A step directory with everything written, single-process or data-parallel (`DEEPSPEED_FILES`)."""
    return path.is_dir() and any(all((path / name).is_file() for name in files) for files in (FILES, DEEPSPEED_FILES))


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint of the highest step under `root` (None when there is none)."""
    found = [p for p in sorted((root / "checkpoints").glob("step-??????")) if is_complete(p)]
    return found[-1] if found else None


def torn_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories a kill left unfinished: `.tmp` staging dirs and step dirs missing a file."""
    folder = root / "checkpoints"
    return sorted([*folder.glob("step-??????.tmp"), *(p for p in folder.glob("step-??????") if not is_complete(p))])


def resume_checkpoint(root: Path) -> Path | None:
    """The checkpoint `--resume` continues from: the latest complete one; None when `root` holds no checkpoint
    at all (a first run). Only torn ones: raises `TornCheckpoints` naming them, since starting from step 0
    over them would silently redo (and overwrite) the killed run's work."""
    latest, torn = latest_checkpoint(root), torn_checkpoints(root)
    if latest is None and torn:
        raise TornCheckpoints(f"--resume: no complete checkpoint under {root / 'checkpoints'}, only torn ones "
                              f"(killed while saving): {', '.join(map(str, torn))}. Remove them to train from "
                              "step 0, or restore a complete checkpoint")
    if latest is not None and torn:
        print(f"--resume: skipping torn checkpoints {', '.join(map(str, torn))}; resuming from {latest}",
              file=sys.stderr, flush=True)
    return latest


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
    load_model(model, str(path / "model.safetensors"))
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "state.json").read_text()))
