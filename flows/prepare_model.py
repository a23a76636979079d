"""Stage prepare-model: write the base model as a safetensors directory (models/base)."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import reported_stage, run_stage
from pipeline.config.model import ModelConfig
from pipeline.model import prepare_base_model


@task(cache_policy=NO_CACHE)
def convert(cfg: ModelConfig) -> str:
    return str(prepare_base_model(cfg.path, cfg.base_dir))


@flow(name="prepare-model", log_prints=True)
def prepare_model_flow(params: str = "params.yaml") -> str:
    return reported_stage(params, "prepare-model", "model", convert)


if __name__ == "__main__":
    run_stage(prepare_model_flow, "Prepare the base model.")
