"""Stage sft: cold-start supervised fine-tuning on verified, really executed tool-use traces (models/sft,
metrics/sft.json; an ad-hoc run under runs/sft/<label>/, flows.outputs)."""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("sft")

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import USER_ERRORS as COMMON_ERRORS
from flows.common import load_or_exit
from flows.outputs import Placement, placed_run
from flows.summary import markdown_table, publish
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import RunConfig
from pipeline.data.broken import BrokenDependency
from pipeline.sft import run as sft

USER_ERRORS = (*COMMON_ERRORS, BrokenDependency)  # a tool service answering nothing useful: one line naming it


@task(cache_policy=NO_CACHE)
def sft_task(cfg: RunConfig, urls: dict, metrics_dir: Path) -> dict:
    return sft(cfg, urls, metrics_dir=metrics_dir)


def configured(params: str, label: str | None = None, out: str | None = None) -> tuple[RunConfig, Placement]:
    return placed_run("sft", params, load_or_exit(params), label=label, out=out)


@flow(name="sft", log_prints=True)
def sft_flow(params: str = "params.yaml", label: str | None = None, out: str | None = None) -> dict:
    cfg, place = configured(params, label, out)
    tools = ("code", "search") if cfg.sft.enabled else ()  # the teacher's calls really run (pipeline.sft)
    with stage_run(cfg, "sft", place.label) as run_id, running_services(cfg, tools, params) as urls:
        metrics = sft_task(cfg, urls, place.place("metrics"))
    print(f"sft: {metrics}")
    publish("sft", f"sft: {cfg.sft.output_dir}", markdown_table(metrics), cfg.run, run_id)
    return metrics

