"""Stage evaluate: accuracy and tool use of a model on benchmarks (TAPO Table 1, Figures 3-4).

    python -m flows.evaluate --params params.yaml [--model PATH_OR_URI] [--label NAME] [--output-dir DIR]
                             [--stage NAME]

The main job runs it three times on the same held-out problems (dvc.yaml): the prompted base model
(`evaluate-base`) and the SFT model (`evaluate-sft`), each into its own directory, then the RL policy
(`evaluate`), whose report puts the other two beside it (`evaluate.compare_dirs`) and compares the last two
problem by problem. `--stage` names the DVC stage (its MLflow run and input hashes).

Benchmarks are read (and bad ones rejected) before any service starts; only the services the
benchmarks' problem types need are started, none in mode no_tools. The run is tracked in
MLflow; the library logs its metrics, table and plots into it.
"""

from __future__ import annotations

import argparse
import sys

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import load_or_exit
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import DEFAULT_PARAMS, RunConfig
from pipeline.evaluation.benchmarks import BenchmarkError, load_benchmarks
from pipeline.evaluation.evaluate import EvaluationError, tools_needed
from pipeline.evaluation.evaluate import run as evaluate
from pipeline.tracking.model_source import ModelSourceError, resolve_model
from pipeline.tracking.registry import update_champion
from pipeline.tracking.runs import tracked_run

BAD_INPUT = (BenchmarkError, EvaluationError, ModelSourceError, FileNotFoundError)


@task(cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, urls: dict, model: str | None, stage: str = "evaluate") -> dict:
    with tracked_run(cfg.run, stage, cfg.model_dump()):
        return evaluate(cfg, urls, model_path=model)


def with_overrides(cfg: RunConfig, label: str | None, output_dir: str | None = None) -> RunConfig:
    """The evaluate section with the command line's label and output directory; a baseline written elsewhere
    compares against nothing (its own report is one row)."""
    update = {"label": label} if label else {}
    if output_dir:
        update |= {"output_dir": output_dir, "compare_dirs": ()}
    return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update=update)}) if update else cfg


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: str = "params.yaml", model: str | None = None, label: str | None = None,
                  output_dir: str | None = None, stage: str = "evaluate") -> dict:
    cfg = with_overrides(load_or_exit(params), label, output_dir)
    # Bad benchmarks or a missing model fail here, before any service starts.
    benchmarks = load_benchmarks(cfg.evaluate)
    resolve_model(model or cfg.evaluate.model, cfg.run.tracking_uri)
    tools = () if cfg.evaluate.mode == "no_tools" else tools_needed(benchmarks)
    with stage_run(cfg, stage) as run_id:
        with running_services(cfg, tools, params) as urls:
            metrics = evaluate_task(cfg, urls, model, stage)
        print(f"accuracy {metrics['all/accuracy']:.3f} over {metrics['n_problems']:.0f} problems")
        decision = update_champion(cfg.run, model or cfg.evaluate.model, metrics["all/accuracy"], eval_run_id=run_id)
    print(f"champion: {'moved to v' + decision.version if decision.promoted else 'unchanged'} ({decision.reason})")
    return metrics


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Evaluate a model on the configured benchmarks.")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)")
    parser.add_argument("--model", default=None, help="model to evaluate instead of evaluate.model "
                        "(directory, hub id, or MLflow URI such as models:/tapo-policy@champion)")
    parser.add_argument("--label", default=None, help="row name in the comparison table")
    parser.add_argument("--output-dir", default=None, help="write the evaluation here instead of evaluate.output_dir "
                        "(and compare it with nothing)")
    parser.add_argument("--stage", default="evaluate", help="the DVC stage this run is (its MLflow run's name)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        evaluate_flow(args.params, args.model, args.label, args.output_dir, args.stage)
    except BAD_INPUT as err:
        print(f"evaluate: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
