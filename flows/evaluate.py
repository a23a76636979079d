"""Stage evaluate: accuracy and tool use of a model on benchmarks (TAPO Table 1, Figures 3-4).

    python -m flows.evaluate --params params.yaml                     # the DVC stage: metrics/eval*
    python -m flows.evaluate --params params.yaml --baseline sft      # the DVC stage evaluate-sft
    python -m flows.evaluate --model runs/step2 [--label NAME]        # ad hoc: runs/evaluate/<label>/

The main job evaluates the prompted base model and the SFT model (`evaluate.baselines`, each its own DVC stage,
`evaluate-<name>`, writing its baseline's output_dir) on the same held-out problems as the policy; the policy's
stage then puts them beside it in its report (`evaluate.compare_dirs` are added after them) and compares the last
two problem by problem. A baseline moves no champion: it is not a version of the policy.

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
from flows.outputs import STAGE_OUTPUTS, Placement, placed, placement
from flows.services import running_services
from flows.tracking import stage_run
from pipeline.config import RunConfig
from pipeline.data.answerable import search_probes
from pipeline.data.broken import BrokenDependency
from pipeline.evaluation.benchmarks import BenchmarkError, load_benchmarks
from pipeline.evaluation.evaluate import EvaluationError, tools_needed
from pipeline.evaluation.evaluate import run as evaluate
from pipeline.evaluation.labels import run_label
from pipeline.evaluation.report import TABLE_FILE
from pipeline.evaluation.setting import evaluation_setting
from pipeline.tracking.comparable import comparable_evaluations
from pipeline.tracking.model_source import ModelSourceError, resolve_model
from pipeline.tracking.registry import update_champion
from pipeline.tracking.runs import tracked_run

USER_ERRORS = (*COMMON_ERRORS, BenchmarkError, EvaluationError, ModelSourceError, BrokenDependency)


@task(cache_policy=NO_CACHE)
def evaluate_task(cfg: RunConfig, urls: dict, model: str | None, stage: str) -> dict:
    with tracked_run(cfg.run, stage, cfg.model_dump()):
        return evaluate(cfg, urls, model_path=model)


def with_overrides(cfg: RunConfig, label: str | None, place: Placement, model: str | None = None) -> RunConfig:
    """The model given (its run records what it evaluated: `evaluate.model`), the row label given (a model given
    without one: named after it), and the output folder where this run writes (ad hoc: under
    runs/evaluate/<label>/). The DVC stage (written in place) compares with the baselines' evaluations first."""
    update: dict[str, object] = {"output_dir": str(place.place(cfg.evaluate.output_dir))}
    if model:
        update["model"] = model
    if label or model:  # params' evaluate.label names the policy, not a model given by hand
        update["label"] = label or ""
    if place.root is None:
        baselines = tuple(b.output_dir for b in cfg.evaluate.baselines.values())
        update["compare_dirs"] = baselines + tuple(d for d in cfg.evaluate.compare_dirs if d not in baselines)
    return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update=update)})


def as_baseline(cfg: RunConfig, name: str) -> RunConfig:
    """The evaluate section for baseline `name`: its model, label and output folder, compared with nothing."""
    if name not in cfg.evaluate.baselines:
        raise EvaluationError(f"--baseline {name!r}: not one of evaluate.baselines {sorted(cfg.evaluate.baselines)}")
    baseline = cfg.evaluate.baselines[name]
    update = {"model": baseline.model, "label": baseline.label, "output_dir": baseline.output_dir, "compare_dirs": ()}
    return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update=update)})


def preflight(params: str, model: str | None = None, label: str | None = None, out: str | None = None,
              baseline: str | None = None) -> None:
    """Bad benchmarks, an unknown baseline or a missing model, found before Prefect starts (the flow checks
    again)."""
    cfg = load_or_exit(params)
    cfg = as_baseline(cfg, baseline) if baseline else cfg
    load_benchmarks(cfg.evaluate)
    resolve_model(model or cfg.evaluate.model, cfg.run.tracking_uri)


def configured(params: str, model: str | None, label: str | None, out: str | None,
               baseline: str | None) -> tuple[RunConfig, str, str | None]:
    """This run's config, the stage it is (a baseline's DVC stage, the policy's) and, for an ad-hoc run, its label
    (a baseline's too: with another params file, a label or --out it writes under runs/evaluate/<label>/)."""
    if baseline is not None:
        place = placement("evaluate", params, label=label, out=out, ad_hoc=False)
        cfg = placed(as_baseline(load_or_exit(params), baseline), STAGE_OUTPUTS["evaluate"], place)
        return cfg, f"evaluate-{baseline}", place.label
    place = placement("evaluate", params, label=label or model, out=out, ad_hoc=model is not None)
    return with_overrides(load_or_exit(params), label, place, model), "evaluate", place.label


def beside_the_pipeline(cfg: RunConfig, benchmarks: list) -> RunConfig:
    """An ad-hoc evaluation of a policy compares with the base, SFT and current policy evaluations the tracking
    store holds under its setting (`pipeline.tracking.comparable`), downloaded beside its outputs, before the
    evaluations `evaluate.compare_dirs` names."""
    setting = evaluation_setting(cfg.evaluate, cfg.rollout.protocol, benchmarks)
    found = comparable_evaluations(cfg.run, setting, list(cfg.evaluate.baselines),
                                   Path(cfg.evaluate.output_dir) / "compared")
    print(f"compared with {len(found)} evaluation(s) under the same setting: {', '.join(map(str, found)) or 'none'}")
    dirs = tuple(str(d) for d in found) + cfg.evaluate.compare_dirs
    return cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"compare_dirs": dirs})})


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: str = "params.yaml", model: str | None = None, label: str | None = None,
                  out: str | None = None, baseline: str | None = None) -> dict:
    cfg, stage, ad_hoc = configured(params, model, label, out, baseline)
    # Bad benchmarks or a missing model fail here, before any service starts.
    benchmarks = load_benchmarks(cfg.evaluate)
    resolve_model(model or cfg.evaluate.model, cfg.run.tracking_uri)
    if ad_hoc and baseline is None:
        cfg = beside_the_pipeline(cfg, benchmarks)
    tools = () if cfg.evaluate.mode == "no_tools" else tools_needed(benchmarks)
    with stage_run(cfg, stage, ad_hoc) as run_id:
        probe = search_probes([p for b in benchmarks for p in b.problems])
        with running_services(cfg, tools, params, search_probe=probe, stage=stage) as urls:
            metrics = evaluate_task(cfg, urls, model, stage)
        print(f"accuracy {metrics['all/accuracy']:.3f} over {metrics['n_problems']:.0f} problems")
        decision = None if baseline else update_champion(
            cfg.run, model or cfg.evaluate.model, metrics["all/accuracy"],
            setting=evaluation_setting(cfg.evaluate, cfg.rollout.protocol, benchmarks), eval_run_id=run_id)
    champion = ("champion: not a policy version (a baseline)" if decision is None else
                f"champion: {f'moved to v{decision.version}' if decision.promoted else 'unchanged'} ({decision.reason})")
    print(f"{champion}\noutputs in {cfg.evaluate.output_dir}")
    table = (Path(cfg.evaluate.output_dir) / TABLE_FILE).read_text(encoding="utf-8").removeprefix("# Evaluation\n")
    row = run_label(model or cfg.evaluate.model, cfg.evaluate, cfg.train, cfg.sft, cfg.reward.tepo)
    publish(stage, f"{stage}: {row}",
            f"{table}\n{champion}\n\nOutputs: `{cfg.evaluate.output_dir}`", cfg.run, run_id)
    print(table.strip())  # the stage's last words: the table, the format notes, the flips and their p-value
    return metrics
