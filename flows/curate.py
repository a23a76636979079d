"""Stage curate: build the train/test problem files from the configured sources (data/curated; an ad-hoc run,
with another params file, a --label or --out, under runs/curate/<label>/, flows.outputs).

Rows whose prompt overruns the rollout's token budget are rejected ("too_long") with the
tokenizer of the model the run trains (`model.base_dir`, written by prepare-model) and the
tools training offers; without a prepared model that filter is skipped and the report says so.
When a fact set must be answerable by search (`curate.wiki_facts.answerable_only`, a source's
`answerable_only`), the stage starts the search service over the built index for the "unanswerable" filter.
A dependency that answers but is broken (a search service finding nothing, a judge boxing no answer, one filter
rejecting a whole source) ends the stage with one line naming it, and nothing is written (`pipeline.data.broken`).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("curate")

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import USER_ERRORS as COMMON_ERRORS
from flows.common import load_or_exit
from flows.outputs import Placement, placed_run
from flows.reported import reported_stage
from flows.services import running_services
from pipeline.config import RunConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.data.answerable import service_probe
from pipeline.data.broken import BrokenDependency
from pipeline.data.curate import run as curate
from pipeline.model import load_prepared_tokenizer
from pipeline.rollout.prompt_budget import PromptBudget

USER_ERRORS = (*COMMON_ERRORS, BrokenDependency)


def prompt_budget(model_dir: str, rollout: RolloutConfig) -> PromptBudget | None:
    """The budget check training applies at load; training offers each problem every tool its type uses and
    every user tool (an MCP server's schemas are read only when training starts it)."""
    tokenizer = load_prepared_tokenizer(model_dir)
    if tokenizer is None:
        print(f"curate: no prepared model at {model_dir}: prompt lengths are not checked")
        return None
    return PromptBudget.before_start(tokenizer, rollout)


@task(cache_policy=NO_CACHE)
def curate_task(run: RunConfig, params: str) -> dict:
    budget = prompt_budget(run.model.base_dir, run.rollout)
    if not run.curate.needs_search():
        return curate(run.curate, prompt_budget=budget).to_dict()
    with running_services(run, ("search",), params) as urls:
        probe = service_probe(run.search, urls["search"], run.rollout.max_tool_output_chars)
        return curate(run.curate, prompt_budget=budget, search=probe).to_dict()


def configured(params: str, label: str | None = None, out: str | None = None) -> tuple[RunConfig, Placement]:
    return placed_run("curate", params, load_or_exit(params), label=label, out=out)


@flow(name="curate", log_prints=True)
def curate_flow(params: str = "params.yaml", label: str | None = None, out: str | None = None) -> dict:
    run, place = configured(params, label, out)
    return reported_stage(params, "curate", "curate", lambda cfg: curate_task(run, params), run, place.label)

