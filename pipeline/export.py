"""Command line: a training checkpoint, single-process or DeepSpeed, as a plain Hugging Face directory.

    python -m pipeline.export --params params.yaml runs/train/<run>/checkpoints/step-000002 runs/step2
    python -m pipeline.export runs/train/<run>/checkpoints runs/latest      # DeepSpeed: the latest step

The directory is what training's final model is (tokenizer included; a LoRA adapter merged), so
`python -m flows.evaluate --model runs/step2` evaluates an intermediate policy. A checkpoint that is not
there is named, with the checkpoints that are (`CheckpointNotFound`). Which kind of
checkpoint it is is read from its files: a single-process one holds `model.safetensors`, a DeepSpeed
one per-rank shards (merged offline, in one process) and its parent a `latest` marker.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipeline.config import ConfigError, load_config
from pipeline.config.train import TrainConfig


def parser() -> argparse.ArgumentParser:
    """The command line, built before torch is imported (seconds), so `--help` answers at once."""
    built = argparse.ArgumentParser(prog="python -m pipeline.export", description=__doc__.splitlines()[0])
    built.add_argument("--params", default=None, help="the params the run trained with (train.init_model, "
                                                       "train.finetune, model.dtype); single-process checkpoints")
    built.add_argument("checkpoint", type=Path, help="a step-NNNNNN directory under <train.checkpoints.dir>/<run>/"
                       "checkpoints (DeepSpeed: or that checkpoints directory itself, for the latest step)")
    built.add_argument("out", type=Path, help="the Hugging Face directory to write")
    return built


if __name__ == "__main__":
    parser().parse_args()

# After the command line (see `parser`): these import torch.
from safetensors.torch import load_model  # noqa: E402

from pipeline.distributed.checkpointing import LATEST, export_from_checkpoint, is_deepspeed_checkpoint  # noqa: E402
from pipeline.model import load_policy  # noqa: E402
from pipeline.outputs import publish_dir, staging_dir  # noqa: E402
from pipeline.training_run.checkpoint import FILES as CHECKPOINT_FILES  # noqa: E402
from pipeline.trainer.replicas import save_policy  # noqa: E402
from pipeline.training_run.folder import CHECKPOINTS  # noqa: E402
from pipeline.trainer.weights import policy_weights  # noqa: E402

STEP_GLOBS = ("step-??????", f"{CHECKPOINTS}/step-??????", f"*/{CHECKPOINTS}/step-??????")


class CheckpointNotFound(FileNotFoundError):
    """The checkpoint to export is not there; the message lists the checkpoints that are."""


def existing_checkpoints(checkpoints_dir: str | None, missing: Path) -> list[Path]:
    """Checkpoints near a missing one: in the closest folder of its path that exists, and in every run folder
    under `checkpoints_dir` (train.checkpoints.dir, with --params)."""
    near = next((p for p in missing.parents if p.is_dir()), Path("."))
    roots = [near] + ([Path(checkpoints_dir)] if checkpoints_dir is not None else [])
    return sorted({p for root in roots for pattern in STEP_GLOBS for p in root.glob(pattern) if p.is_dir()})


def require_checkpoint(checkpoints_dir: str | None, checkpoint: Path) -> None:
    """Refuse a checkpoint that is not there, naming those that are (`existing_checkpoints`)."""
    if checkpoint.exists():
        return
    found = existing_checkpoints(checkpoints_dir, checkpoint)
    listed = ", ".join(map(str, found)) if found else "none (has the run saved one? train.checkpoints.every)"
    raise CheckpointNotFound(f"{checkpoint}: no such checkpoint; checkpoints there are: {listed}")


def export_checkpoint(checkpoint: Path, out: Path, train: TrainConfig | None = None, dtype: str | None = None
                      ) -> Path:
    """`checkpoint` written as the final model is, whole or absent (renamed into place). A DeepSpeed step
    directory, or a directory of them holding `latest`, needs no config; a single-process one needs the
    run's train section (train.init_model, train.finetune) and model.dtype to rebuild the model it loads into.
    With the train section, a missing checkpoint's message lists those under train.checkpoints.dir too."""
    require_checkpoint(train.checkpoints.dir if train is not None else None, checkpoint)
    if (checkpoint / LATEST).is_file() or is_deepspeed_checkpoint(checkpoint):
        root, tag = (checkpoint, None) if (checkpoint / LATEST).is_file() else (checkpoint.parent, checkpoint.name)
        staging = staging_dir(out)
        export_from_checkpoint(root, staging, tag)
        return publish_dir(staging, out)
    if train is None or dtype is None:
        raise ValueError(f"{checkpoint}: a single-process checkpoint; pass --params (the run's params file)")
    return export_single_process(train, dtype, checkpoint, out)


def export_single_process(train: TrainConfig, dtype: str, checkpoint: Path, out: Path) -> Path:
    """The model rebuilt as training's set-up builds it (train.init_model, then the finetune variant, so a
    LoRA adapter is merged on export) with the checkpoint's weights loaded into it; a mismatch raises."""
    missing = [name for name in CHECKPOINT_FILES if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{checkpoint}: no {', '.join(missing)} (not a complete training checkpoint; a "
                                "`.tmp` one was torn by a kill while saving)")
    weights = policy_weights(train.finetune)
    model, tokenizer = load_policy(train.init_model, weights.held_dtype(dtype, deepspeed=False), "cpu")
    model = weights.prepare(model)
    load_model(model, str(checkpoint / "model.safetensors"))
    staging = staging_dir(out)
    save_policy(weights, model, tokenizer, staging)
    return publish_dir(staging, out)


def main() -> None:
    args = parser().parse_args()
    try:
        cfg = load_config(Path(args.params)) if args.params else None
        if cfg is None:
            print(export_checkpoint(args.checkpoint, args.out))
        else:
            print(export_checkpoint(args.checkpoint, args.out, cfg.train, cfg.model.dtype))
    except (ConfigError, FileNotFoundError, ValueError) as err:  # a user's mistake: one line, not a traceback
        print(f"export: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
