"""`python -m pipeline.tracking.compare`: one row per top-level run, nested stage metrics gathered into it, the
setting its evaluation ran on, and below the table the params that differ between the rows."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest

from pipeline.tracking.compare import main
from pipeline.config.run import RunSection
from pipeline.tracking.runs import PARENT_ENV, flatten, tracked_run


@pytest.fixture()
def run_cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunSection:
    monkeypatch.chdir(tmp_path)
    return RunSection(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}", experiment="compare-test")


SETTING = {"eval.setting.split": "calculator,wiki_facts", "eval.setting.problems": "111",
           "eval.setting.samples": "1", "eval.setting.temperature": "0.0"}  # as pipeline.evaluation tags the run


def _pipeline_run(run_cfg: RunSection, lr: float, train_acc: float, eval_acc: float,
                  monkeypatch: pytest.MonkeyPatch, seed: int = 0) -> str:
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    config = {"train": {"optimizer": {"lr": lr}}, "run": {"seed": seed}, "evaluate": {"limit": 0, "model": "models/policy"}}
    with mlflow.start_run(run_name="pipeline", tags={"stage": "pipeline", "git_commit": "abcdef1234"}) as parent:
        mlflow.log_params(flatten(config))  # the parent logs the whole config, as flows.pipeline does
    monkeypatch.setenv(PARENT_ENV, parent.info.run_id)
    with tracked_run(run_cfg, "curate", {}):
        mlflow.log_params({"n_rejected": int(lr * 1e7)})  # a stage's own figure, not config: never "differs"
    with tracked_run(run_cfg, "train", config):
        mlflow.log_metrics({"reward/mean": 0.1, "reward/accuracy": train_acc})
    with tracked_run(run_cfg, "evaluate-sft", {"evaluate": {"model": "models/sft"}},
                     tags={**SETTING, "eval.setting.problems": "7"}):  # a baseline's evaluation: not the row's
        mlflow.log_metrics({"eval/all/accuracy": 0.0})
    with tracked_run(run_cfg, "evaluate", config, tags=SETTING):
        mlflow.log_metrics({"eval/all/accuracy": eval_acc})  # the key pipeline.evaluation logs
    monkeypatch.delenv(PARENT_ENV)
    return parent.info.run_id


def test_table_of_last_runs(run_cfg: RunSection, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    first = _pipeline_run(run_cfg, 1e-6, 0.25, 0.5, monkeypatch)
    second = _pipeline_run(run_cfg, 3e-6, 0.375, 0.625, monkeypatch)
    with tracked_run(run_cfg, "evaluate", {}):  # a stand-alone evaluation is a row of its own
        mlflow.log_metrics({"eval/all/accuracy": 0.75})

    assert main(["--last", "2", "--experiment", run_cfg.experiment, "--tracking-uri", run_cfg.tracking_uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert {"lr", "reward", "train", "acc", "eval"} <= set(header)
    assert {"split", "problems", "samples", "temp", "model"} <= set(header)
    assert lines[4] == "" and lines[5].startswith("params that differ between these 2 runs")
    lines = lines[:4]  # header, rule, two rows: the newest two top-level runs
    assert lines[2].split()[1] == "evaluate"
    assert "0.75" in lines[2]
    assert lines[3].startswith(second[:8]) and "3e-06" in lines[3] and "0.375" in lines[3] and "0.625" in lines[3]
    assert "abcdef12" in lines[3]
    assert "calculator,wiki_facts  111" in lines[3] and "models/policy" in lines[3]  # the policy's evaluation
    assert first[:8] not in "\n".join(lines)


def test_the_params_that_differ_are_listed(run_cfg: RunSection, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    runs = [_pipeline_run(run_cfg, 1e-6, 0.25, 0.5, monkeypatch, seed=0),
            _pipeline_run(run_cfg, 1e-6, 0.25, 0.5, monkeypatch, seed=1),
            _pipeline_run(run_cfg, 3e-6, 0.25, 0.5, monkeypatch, seed=1)]
    args = ["--experiment", run_cfg.experiment, "--tracking-uri", run_cfg.tracking_uri]
    assert main(["--last", "3", *args]) == 0
    out = capsys.readouterr().out
    listed = out.split("params that differ between these 3 runs (2):\n")[1].splitlines()
    assert listed[0].split() == ["param", *(r[:8] for r in reversed(runs))]
    assert [line.split() for line in listed[2:]] == [["run.seed", "1", "1", "0"], ["train.optimizer.lr", "3e-06", "1e-06", "1e-06"]]
    assert main(["--last", "1", *args]) == 0 and "differ" not in capsys.readouterr().out  # one row: nothing to compare
    assert main(["--last", "2", *args]) == 0
    assert "params that differ between these 2 runs (1):" in capsys.readouterr().out  # train.optimizer.lr only


def test_a_long_or_multi_line_value_stays_in_its_cell(run_cfg: RunSection, capsys: pytest.CaptureFixture[str]) -> None:
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    for prompt in ("short", "line one\nline two\r\n" + "x" * 200):
        with mlflow.start_run(run_name="pipeline", tags={"stage": "pipeline"}):
            mlflow.log_params({"judge.prompt": prompt})
    assert main(["--last", "2", "--experiment", run_cfg.experiment, "--tracking-uri", run_cfg.tracking_uri]) == 0
    listed = capsys.readouterr().out.split("params that differ between these 2 runs (1):\n")[1].splitlines()
    assert len(listed) == 3  # header, rule, one line for the one key
    assert listed[2].split()[:3] == ["judge.prompt", "line", "one\\nline"] and listed[2].rstrip().endswith("...  short")


def test_bad_input_is_a_clear_error(run_cfg: RunSection, capsys: pytest.CaptureFixture[str]) -> None:
    _ = mlflow.set_tracking_uri(run_cfg.tracking_uri)
    assert main(["--experiment", "nope", "--tracking-uri", run_cfg.tracking_uri]) == 1
    assert "no MLflow experiment 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--last", "0"])
    assert main(["--params", "missing.yaml"]) == 1
    assert "missing.yaml" in capsys.readouterr().err


def test_training_and_evaluation_show_their_headline_not_their_last_step(
        run_cfg: RunSection, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """"Final" is one number: the train stage's headline (the last quarter's mean, a tag on its run) wins over the
    last step's `reward/mean`, which the row showed (0.625 beside a headline of 0.439). An ad-hoc evaluation is a row
    of its own, named and parametrised after the model it evaluated."""
    mlflow.set_tracking_uri(run_cfg.tracking_uri)
    mlflow.set_experiment(run_cfg.experiment)
    with mlflow.start_run(run_name="pipeline", tags={"stage": "pipeline"}) as parent:
        pass
    monkeypatch.setenv(PARENT_ENV, parent.info.run_id)
    with tracked_run(run_cfg, "train", {}, tags={"headline.reward": "0.439", "headline.accuracy": "0.25"}):
        mlflow.log_metrics({"reward/mean": 0.625, "reward/accuracy": 0.5})
    monkeypatch.delenv(PARENT_ENV)
    with tracked_run(run_cfg, "evaluate", {"evaluate": {"model": "runs/step12"}}, tags=SETTING):
        mlflow.log_metrics({"headline/accuracy": 0.5179, "eval/all/accuracy": 0.5179})
    assert main(["--last", "2", "--experiment", run_cfg.experiment, "--tracking-uri", run_cfg.tracking_uri]) == 0
    header, _, adhoc, pipeline = capsys.readouterr().out.splitlines()[:4]
    assert "0.439" in pipeline and "0.25" in pipeline and "0.625" not in pipeline
    assert "runs/step12" in adhoc and "0.5179" in adhoc
