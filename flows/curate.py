"""Stage curate: build the train/test problem files from the configured sources.

Rows whose prompt overruns the rollout's token budget are rejected ("too_long") with the
tokenizer of the model the run trains (`model.base_dir`, written by prepare-model) and the
tools training offers; without a prepared model that filter is skipped and the report says so.
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("curate")

from typing import get_args

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit
from flows.reported import reported_stage
from pipeline.config.curate import CurateConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.data.curate import run as curate
from pipeline.model import load_prepared_tokenizer
from pipeline.rollout.prompt_budget import PromptBudget
from pipeline.types import ToolName


def prompt_budget(model_dir: str, rollout: RolloutConfig) -> PromptBudget | None:
    """The budget check training applies at load; training offers each problem every tool its type uses."""
    tokenizer = load_prepared_tokenizer(model_dir)
    if tokenizer is None:
        print(f"curate: no prepared model at {model_dir}: prompt lengths are not checked")
        return None
    return PromptBudget(tokenizer, rollout, get_args(ToolName))


@task(cache_policy=NO_CACHE)
def curate_task(cfg: CurateConfig, model_dir: str, rollout: RolloutConfig) -> dict:
    return curate(cfg, prompt_budget=prompt_budget(model_dir, rollout)).to_dict()


@flow(name="curate", log_prints=True)
def curate_flow(params: str = "params.yaml") -> dict:
    run = load_or_exit(params)
    return reported_stage(params, "curate", "curate",
                          lambda cfg: curate_task(cfg, run.model.base_dir, run.rollout))

