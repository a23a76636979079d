"""Stage evaluate: accuracy and tool use of the trained policy on the test split."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit, stage_args, tools_needed
from flows.services import running_services
from pipeline.config import RunConfig
from pipeline.evaluation.evaluate import run as evaluate


@task(cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, urls: dict) -> dict:
    return evaluate(cfg, urls)


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: str = "params.yaml") -> dict:
    cfg = load_or_exit(params)
    with running_services(cfg, tools_needed(cfg.evaluate.split_file), params) as urls:
        metrics = evaluate_task(cfg, urls)
    print(f"accuracy {metrics['all/accuracy']:.3f} over {metrics['n_problems']:.0f} problems")
    return metrics


if __name__ == "__main__":
    evaluate_flow(stage_args("Evaluate the trained policy.").params)
