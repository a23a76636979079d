"""What a registered model version records about the training that made it: a one-paragraph description
and tags (the algorithm and its main settings, the data it trained on with a content hash, the run's folder),
so a version in the registry says what it is without opening its run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.config.rollout import RolloutConfig
from pipeline.config.train import TrainConfig
from pipeline.paths import file_sha256


def training_record(tc: TrainConfig, rc: RolloutConfig, dtype: str, run_dir: Path) -> dict[str, Any]:
    """`description` and `tags` for `pipeline.tracking.registry.log_and_register`: what trained (`tc`), how it
    sampled (`rc`), the weights' `dtype` (`model.dtype`) and the run's folder."""
    data_sha = file_sha256(tc.train_file)
    tags = {"train.algorithm": tc.algorithm.kind, "train.finetune": tc.finetune.kind, "train.steps": str(tc.steps),
            "train.optimizer.lr": repr(tc.optimizer.lr), "train.init_model": tc.init_model, "train.train_file": tc.train_file,
            "data.train_file_sha256": data_sha, "rollout.protocol": rc.protocol, "rollout.group_size": str(rc.group_size),
            "model.dtype": dtype, "run_folder": str(run_dir)}
    description = (f"{tc.algorithm.kind.upper()} ({tc.finetune.kind} weights) for {tc.steps} steps of "
                   f"{tc.sampling.prompts_per_step} prompts x {rc.group_size} samples, lr {tc.optimizer.lr:g}, protocol {rc.protocol}, "
                   f"from {tc.init_model} on {tc.train_file} (sha256 {data_sha[:12]}); weights in {dtype}; "
                   f"checkpoints in {run_dir}.")
    return {"description": description, "tags": tags}
