"""Stage prepare-model: write the base model as a safetensors directory (models/base)."""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("prepare_model")

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.reported import reported_stage
from pipeline.config.model import ModelConfig
from pipeline.model import prepare_base_model


@task(cache_policy=NO_CACHE)
def convert(cfg: ModelConfig) -> str:
    return str(prepare_base_model(cfg.path, cfg.base_dir))


@flow(name="prepare-model", log_prints=True)
def prepare_model_flow(params: str = "params.yaml") -> str:
    return reported_stage(params, "prepare-model", "model", convert)

