"""Stage sft: cold-start supervised fine-tuning on verified, really executed tool-use traces."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, run_stage
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import RunConfig
from pipeline.sft import run as sft


@task(cache_policy=NO_CACHE)
def sft_task(cfg: RunConfig, urls: dict) -> dict:
    return sft(cfg, urls)


@flow(name="sft", log_prints=True)
def sft_flow(params: str = "params.yaml") -> dict:
    cfg = load_or_exit(params)
    tools = ("code", "search") if cfg.sft.enabled else ()  # the teacher's calls really run (pipeline.sft)
    with stage_run(cfg, "sft"), running_services(cfg, tools, params) as urls:
        metrics = sft_task(cfg, urls)
    print(f"sft: {metrics}")
    return metrics


if __name__ == "__main__":
    run_stage(sft_flow, "Fine-tune the base model on tool-use traces.")
