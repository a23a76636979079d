"""Stage prepare-model: write the base model as a safetensors directory (models/base)."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, run_stage
from pipeline.model import prepare_base_model


@task(cache_policy=NO_CACHE)
def convert(path: str, out_dir: str) -> str:
    return str(prepare_base_model(path, out_dir))


@flow(name="prepare-model", log_prints=True)
def prepare_model_flow(params: str = "params.yaml") -> str:
    cfg = load_or_exit(params)
    out = convert(cfg.model.path, cfg.model.base_dir)
    print(f"base model ready at {out}")
    return out


if __name__ == "__main__":
    run_stage(prepare_model_flow, "Prepare the base model.")
