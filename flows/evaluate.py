"""Stage evaluate: accuracy and tool use of a model on benchmarks (TAPO Table 1, Figures 3-4).

    python -m flows.evaluate --params params.yaml                     # the DVC stage: metrics/eval*
    python -m flows.evaluate --model runs/step2 [--label NAME]        # ad hoc: runs/evaluate/<label>/

Benchmarks are read (and bad ones rejected) before any service starts; only the services the
benchmarks' problem types need are started, none in mode no_tools. The run is tracked in
MLflow; the library logs its metrics, table and plots into it. An ad-hoc evaluation (another model,
a label or another params file) writes under runs/evaluate/<label>/, never into DVC's outputs
(flows.outputs).
"""

from __future__ import annotations

if __name__ == "__main__":  # the command line is parsed (flows.cli) before the imports below, which take seconds
    from flows.cli import main

    main("evaluate")

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import USER_ERRORS as COMMON_ERRORS
from flows.common import load_or_exit
from flows.summary import publish
from flows.outputs import Placement, placement
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import RunConfig
from pipeline.evaluation.benchmarks import BenchmarkError, load_benchmarks
from pipeline.evaluation.evaluate import EvaluationError, tools_needed
from pipeline.evaluation.evaluate import run as evaluate
from pipeline.evaluation.evaluate import run_label
from pipeline.evaluation.report import TABLE_FILE
from pipeline.evaluation.setting import evaluation_setting
from pipeline.tracking.model_source import ModelSourceError, resolve_model
from pipeline.tracking.registry import update_champion
from pipeline.tracking.runs import tracked_run

USER_ERRORS = (*COMMON_ERRORS, BenchmarkError, EvaluationError, ModelSourceError)


@task(cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, urls: dict, model: str | None) -> dict:
    with tracked_run(cfg.run, "evaluate", cfg.model_dump()):
        return evaluate(cfg, urls, model_path=model)


def with_overrides(cfg: RunConfig, label: str | None, place: Placement) -> RunConfig:
    """The row label given, and the output folder where this run writes (ad hoc: under runs/evaluate/<label>/)."""
    update = {"output_dir": str(place.place(cfg.evaluate.output_dir))} | ({"label": label} if label else {})
    return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update=update)})


def preflight(params: str, model: str | None = None, label: str | None = None, out: str | None = None) -> None:
    """Bad benchmarks or a missing model, found before Prefect starts (the flow checks again)."""
    cfg = load_or_exit(params)
    load_benchmarks(cfg.evaluate)
    resolve_model(model or cfg.evaluate.model, cfg.run.tracking_uri)


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: str = "params.yaml", model: str | None = None, label: str | None = None,
                  out: str | None = None) -> dict:
    place = placement("evaluate", params, label=label or model, out=out, ad_hoc=model is not None)
    cfg = with_overrides(load_or_exit(params), label, place)
    # Bad benchmarks or a missing model fail here, before any service starts.
    benchmarks = load_benchmarks(cfg.evaluate)
    resolve_model(model or cfg.evaluate.model, cfg.run.tracking_uri)
    tools = () if cfg.evaluate.mode == "no_tools" else tools_needed(benchmarks)
    with stage_run(cfg, "evaluate") as run_id:
        with running_services(cfg, tools, params) as urls:
            metrics = evaluate_task(cfg, urls, model)
        print(f"accuracy {metrics['all/accuracy']:.3f} over {metrics['n_problems']:.0f} problems")
        decision = update_champion(cfg.run, model or cfg.evaluate.model, metrics["all/accuracy"],
                                   setting=evaluation_setting(cfg, benchmarks), eval_run_id=run_id)
    champion = f"champion: {'moved to v' + decision.version if decision.promoted else 'unchanged'} ({decision.reason})"
    print(f"{champion}\noutputs in {cfg.evaluate.output_dir}")
    table = (Path(cfg.evaluate.output_dir) / TABLE_FILE).read_text(encoding="utf-8").removeprefix("# Evaluation\n")
    publish("evaluate", f"evaluate: {run_label(cfg, model or cfg.evaluate.model)}",
            f"{table}\n{champion}\n\nOutputs: `{cfg.evaluate.output_dir}`", cfg.run, run_id)
    return metrics
