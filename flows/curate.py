"""Stage curate: build the train/test problem files from the configured sources."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import reported_stage, run_stage
from pipeline.config.curate import CurateConfig
from pipeline.data.curate import run as curate


@task(cache_policy=NO_CACHE)
def curate_task(cfg: CurateConfig) -> dict:
    return curate(cfg).to_dict()


@flow(name="curate", log_prints=True)
def curate_flow(params: str = "params.yaml") -> dict:
    return reported_stage(params, "curate", "curate", curate_task)


if __name__ == "__main__":
    run_stage(curate_flow, "Curate the training and test problems.")
