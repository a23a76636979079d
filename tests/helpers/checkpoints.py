"""A run folder as a killed training leaves it, built in milliseconds: real checkpoints (`save_checkpoint` of a
tiny module: safetensors, torch state, trainer state, manifest) and the per-step history beside them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from pipeline.tracking.history import history_sha256
from pipeline.training_run.checkpoint import TrainerState, save_checkpoint
from pipeline.training_run.folder import HISTORY


def history_rows(steps: int, offset: float = 0.0) -> list[dict]:
    """What a run logs for steps 0..steps-1 (another `offset`: another run's numbers for the same steps)."""
    return [{"step": s, "reward/mean": s / 8 + offset, "train/loss": 1.0 / (s + 1) + offset} for s in range(steps)]


def history_text(rows: Sequence[dict]) -> str:
    return "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)


def write_checkpoints(folder: Path, steps: Sequence[int], run_id: str = "run-a") -> list[Path]:
    """Checkpoints at `steps` (each recording the digest of the history rows before it), as one run saves them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    rows = history_rows(max(steps))
    saved = []
    for step in steps:
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        state = TrainerState(step, 2 * step, step, run_id, history_sha256(rows[:step]))
        saved.append(save_checkpoint(folder, state, model, optimizer, scheduler))
    return saved


def write_history(folder: Path, rows: Sequence[dict]) -> Path:
    """The run's own copy of its history."""
    path = folder / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(history_text(rows))
    return path
