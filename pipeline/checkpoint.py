"""Resumable checkpoints: model, optimiser, scheduler, RNG states, data cursor and step.

A checkpoint is written to a temporary directory and renamed into place, so a crash while
saving never leaves a half-written checkpoint that `--resume` would pick up.
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

KEEP_LAST = 2


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
    for old in sorted(final.parent.glob("step-??????"))[:-KEEP_LAST]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    found = sorted((root / "checkpoints").glob("step-??????"))
    return found[-1] if found else None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
    load_model(model, str(path / "model.safetensors"))
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return TrainerState(**json.loads((path / "state.json").read_text()))
