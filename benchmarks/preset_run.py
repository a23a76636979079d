"""The files of a workspace where the learning-cpu preset ran, for the benchmarks that start from its cold start.

`python -m flows.experiment configs/experiments/learning-cpu.yaml --seeds 0` runs the preset as the DVC experiment
learning-cpu-s0, and `dvc exp apply learning-cpu-s0` puts its params and outputs in the workspace: the SFT model
(`sft.output_dir`), the curated training mix (`train.train_file`) and the held-out problems (`evaluate.split_file`),
at the paths the preset's params name under the workspace root. `preset_config` configures a benchmark's run from
the preset with those files, writing its own checkpoints and tracking under a work dir.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from pipeline.config import RunConfig, load_config
from pipeline.paths import REPO_ROOT

PRESET = Path("configs/experiments/learning-cpu.yaml")
RUN_IT = f"python -m flows.experiment {PRESET} --seeds 0, then dvc exp apply learning-cpu-s0"


@dataclasses.dataclass(frozen=True)
class PresetRun:
    root: Path
    preset: Path  # the workspace's preset file (it extends the workspace's params.yaml)
    sft: Path  # the SFT model dir
    train: Path  # the training mix (jsonl)
    test: Path  # the held-out problems (jsonl)


def preset_run(root: str | Path = REPO_ROOT) -> PresetRun:
    """The workspace's preset files; FileNotFoundError naming the first one missing and how to make it."""
    root = Path(root).resolve()
    preset = root / PRESET
    if not preset.is_file():
        raise FileNotFoundError(f"{preset} is missing: {root} is not a checkout of this project")
    cfg = load_config(preset)
    run = PresetRun(root, preset, sft=root / cfg.sft.output_dir, train=root / cfg.train.train_file,
                    test=root / cfg.evaluate.split_file)
    for path in (run.sft / "config.json", run.train, run.test):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {root} is not a workspace where the learning-cpu preset "
                                    f"ran (run it there: {RUN_IT})")
    return run


def preset_run_or_exit(root: str | Path = REPO_ROOT) -> PresetRun:
    try:
        return preset_run(root)
    except FileNotFoundError as err:
        sys.exit(str(err))


def preset_config(root: str | Path, work_dir: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The preset's config on the workspace's files: RL from its SFT model on its training mix, evaluation on its
    held-out problems; tracking, checkpoints, the trained policy and evaluation output under `work_dir`;
    `overrides` (dotted keys) last."""
    run, work = preset_run(root), Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    return load_config(run.preset, overrides={
        "run.tracking_uri": f"sqlite:///{work / 'mlruns.db'}",
        "train.init_model": str(run.sft), "train.train_file": str(run.train),
        "train.checkpoint_dir": str(work / "rl"), "train.output_dir": str(work / "policy"),
        "evaluate.split_file": str(run.test), "evaluate.output_dir": str(work / "eval"),
        **(overrides or {})})
