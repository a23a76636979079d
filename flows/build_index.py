"""Stage build-index: the BM25 index over the search corpus (data/search/index; ad hoc: under
runs/build_index/<label>/, flows.outputs)."""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("build_index")

import dataclasses
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit
from flows.outputs import Placement, placed_run
from flows.reported import reported_stage
from pipeline.config import RunConfig
from pipeline.config.search import SearchConfig
from sandbox.search.build_index import build_index


@task(cache_policy=NO_CACHE)
def build_index_task(cfg: SearchConfig) -> dict:
    # numbers stay numbers (MLflow metrics, the summary); paths become strings
    return {k: v if isinstance(v, int | float) else str(v) for k, v in dataclasses.asdict(build_index(cfg)).items()}


def configured(params: str, label: str | None = None, out: str | None = None) -> tuple[RunConfig, Placement]:
    """The index where this run writes it; an ad-hoc one absolute, since the builder reads a relative
    `index_dir` from the checkout, not from where the run started."""
    cfg, place = placed_run("build_index", params, load_or_exit(params), label=label, out=out)
    if place.root is not None:
        index_dir = str(Path(cfg.search.index_dir).absolute())
        cfg = cfg.model_copy(update={"search": cfg.search.model_copy(update={"index_dir": index_dir})})
    return cfg, place


@flow(name="build-index", log_prints=True)
def build_index_flow(params: str = "params.yaml", label: str | None = None, out: str | None = None) -> dict:
    cfg, place = configured(params, label, out)
    return reported_stage(params, "build-index", "search", build_index_task, cfg, place.label)

