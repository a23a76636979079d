"""What a train run records in MLflow besides metrics: tables of sample trajectories every N steps,
read back from the run's store (and no input hashes of its own: those are DVC's, tagged by the flow)."""

from __future__ import annotations

import typing
import json
from pathlib import Path

import mlflow
import pytest

from pipeline.tracking.history import progress_line
from pipeline.train import run
from pipeline.training_run.folder import run_folder
from pipeline.types import FinishReason
from tests.train.toy_task import QUESTION, build_direct_model, toy_config

pytestmark = pytest.mark.integration  # a tracked training run


def logged_value(run_id: str, key: str, step: int) -> float:
    (value,) = [m.value for m in mlflow.MlflowClient().get_metric_history(run_id, key) if m.step == step]
    return value


def test_progress_line_reads_the_step_metrics_and_projects_the_rest() -> None:
    metrics = {"reward/mean": 0.5, "reward/accuracy": 0.25, "rollout/calls_per_traj/search": 0.4,
               "rollout/calls_per_traj/code": 0.5, "train/loss": 1.0}
    line = progress_line(step=1, total=10, metrics=metrics, seconds_so_far=180.0, steps_done=2)
    assert line == ("train step 2/10 | reward 0.500 | accuracy 0.250 | code 0.50 search 0.40 calls/traj"
                    " | 90.0 s/step | ETA 12 min")  # 8 steps left at 90 s


def test_train_run_is_tagged_with_its_data_and_logs_sample_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's artifact store (./mlruns) goes under tmp_path
    model_dir = build_direct_model(tmp_path / "model")
    cfg = toy_config(tmp_path, model_dir, steps=3, checkpoints__every=3, sample_tables__every=2, sample_tables__trajectories=3)
    run(cfg, {}, metrics_dir=tmp_path / "metrics")
    history = [json.loads(line) for line in (tmp_path / "metrics" / "train_history.jsonl").read_text().splitlines()]
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train step ")]
    assert [line.split(" | ")[:2] for line in progress] == [  # not a terminal: one line a step, from its metrics
        [f"train step {row['step'] + 1}/3", f"reward {row['reward/mean']:.3f}"] for row in history]

    state = run_folder(cfg) / "checkpoints" / "step-000003" / "state.json"
    run_id = json.loads(state.read_text())["mlflow_run_id"]
    mlflow.set_tracking_uri(cfg.run.tracking_uri)
    logged = mlflow.MlflowClient().get_run(run_id)
    assert not [tag for tag in logged.data.tags if tag.startswith("dvc.dep.")]  # DVC's hashes come from the flow only

    for step in range(3):  # where each step's time went, read back from the store
        rollout_s, train_s, sampling_s = (logged_value(run_id, key, step) for key in
                                          ("time/rollout_seconds", "time/train_seconds", "rollout/wall_s"))
        assert 0 < sampling_s <= rollout_s and train_s > 0

    tables = sorted(a.path for a in mlflow.MlflowClient().list_artifacts(run_id, "samples"))
    assert tables == ["samples/step-000000.json", "samples/step-000002.json"]  # every 2nd step
    well_formed = 0
    for step, path in zip((0, 2), tables, strict=True):
        table = mlflow.load_table(path, run_ids=[run_id])
        assert len(table) == 3
        assert set(table["step"]) == {step}
        assert set(table["question"]) == {QUESTION}
        assert set(table["finish_reason"]) <= set(typing.get_args(FinishReason))
        for row in table.to_dict("records"):
            assert row["response"]
            assert json.loads(row["tool_calls"]) == [] and row["n_tool_calls"] == 0  # tool-free run
            if row["format_ok"]:  # the reward terms belong to the logged response
                well_formed += 1
                predicted = str(row["predicted"])  # pandas reads "42" back as a number
                assert f"<answer>{predicted}</answer>" in row["response"]
                assert row["accuracy"] == float(predicted == "42")
                assert row["total"] == pytest.approx(row["accuracy"] + row["length"])
            else:
                assert row["total"] == pytest.approx(row["format"] + row["length"])
    assert well_formed > 0  # the cold-started model mostly answers in format

    traces = mlflow.search_traces(run_id=run_id, return_type="list")  # run.traces: 2 groups a step, turn by turn
    assert sorted(int(t.info.tags["tapo.step"]) for t in traces) == [0, 0, 1, 1, 2, 2]
    assert {t.info.tags["tapo.stage"] for t in traces} == {"train"}
