"""Stage curate: build the train/test problem files from the configured sources."""

from __future__ import annotations

import dataclasses

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, stage_args
from pipeline.config.curate import CurateConfig
from pipeline.data.curate import run as curate


@task(cache_policy=NO_CACHE)
def curate_task(cfg: CurateConfig) -> dict:
    report = curate(cfg)
    return dataclasses.asdict(report) if dataclasses.is_dataclass(report) else dict(report)


@flow(name="curate", log_prints=True)
def curate_flow(params: str = "params.yaml") -> dict:
    cfg = load_or_exit(params)
    report = curate_task(cfg.curate)
    print(f"curated: {report.get('counts', report)}")
    return report


if __name__ == "__main__":
    curate_flow(stage_args("Curate the training and test problems.").params)
