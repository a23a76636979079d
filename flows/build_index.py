"""Stage build-index: the BM25 index over the search corpus (data/search/index)."""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("build_index")

import dataclasses

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.reported import reported_stage
from pipeline.config.search import SearchConfig
from sandbox.search.build_index import build_index


@task(cache_policy=NO_CACHE)
def build_index_task(cfg: SearchConfig) -> dict:
    # numbers stay numbers (MLflow metrics, the summary); paths become strings
    return {k: v if isinstance(v, int | float) else str(v) for k, v in dataclasses.asdict(build_index(cfg)).items()}


@flow(name="build-index", log_prints=True)
def build_index_flow(params: str = "params.yaml") -> dict:
    return reported_stage(params, "build-index", "search", build_index_task)

