"""Stage train: RL with tools (DAPO by default) from the base or SFT model."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, run_stage, tools_needed
from flows.services import running_services
from pipeline.config import RunConfig
from pipeline.train import run as train


@task(cache_policy=NO_CACHE)
def train_task(cfg: RunConfig, urls: dict, resume: bool) -> dict:
    return train(cfg, urls, resume=resume)


@flow(name="train", log_prints=True)
def train_flow(params: str = "params.yaml", resume: bool = False) -> dict:
    cfg = load_or_exit(params)
    with running_services(cfg, tools_needed(cfg.train.train_file), params) as urls:
        metrics = train_task(cfg, urls, resume)
    print(f"final step: reward {metrics.get('reward/mean')}, accuracy {metrics.get('reward/accuracy')}")
    return metrics


if __name__ == "__main__":
    run_stage(train_flow, "Train the policy with tools.", resume=True)
