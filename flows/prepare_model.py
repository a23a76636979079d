"""Stage prepare-model: write the base model as a safetensors directory (models/base; ad hoc: under
runs/prepare_model/<label>/, flows.outputs)."""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("prepare_model")

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit
from flows.outputs import Placement, placed_run
from flows.reported import reported_stage
from pipeline.config import RunConfig
from pipeline.config.model import ModelConfig
from pipeline.model import prepare_base_model


@task(cache_policy=NO_CACHE)
def convert(cfg: ModelConfig) -> str:
    return str(prepare_base_model(cfg.path, cfg.base_dir))


def configured(params: str, label: str | None = None, out: str | None = None) -> tuple[RunConfig, Placement]:
    return placed_run("prepare_model", params, load_or_exit(params), label=label, out=out)


@flow(name="prepare-model", log_prints=True)
def prepare_model_flow(params: str = "params.yaml", label: str | None = None, out: str | None = None) -> str:
    cfg, place = configured(params, label, out)
    return reported_stage(params, "prepare-model", "model", convert, cfg, place.label)

