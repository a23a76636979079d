"""The evaluation loop with scripted models and a scripted code tool: records, metrics, modes,
resume after a crash, determinism, reports."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlflow
import pytest

from pipeline.config import RunConfig
from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.evaluation.benchmarks import Benchmark
from pipeline.evaluation.evaluate import EvaluationError, evaluate_engine, run
from pipeline.tracking.model_source import ModelSourceError
from pipeline.jsonl import iter_json_lines, write_problems
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import Problem
from tests.evaluation.conftest import make_cfg
from tests.evaluation.helpers import ArithmeticTool, PerQuestionLM

SCRIPTS = {
    "What is 6 * 7?": ["<think>compute</think> <code>print(6 * 7)</code>", "<answer>42</answer>"],  # right, 1 call
    "What is 2 + 3?": ["<think>easy</think> <answer>6</answer>"],  # wrong, no call
    "What is 5 * 5?": ["twenty five"],  # format error
    "What is 9 * 9?": ["<think>x</think> <code>print(x)</code>", "<think>y</think> <code>print(9 * 9)</code>",
                       "<answer>81</answer>"],  # right after a failed and a good call
}
GOLD = {"What is 6 * 7?": "42", "What is 2 + 3?": "5", "What is 5 * 5?": "25", "What is 9 * 9?": "81"}


def calculator(questions=tuple(GOLD)) -> Benchmark:
    problems = tuple(Problem(f"calculator-{i}", q, (GOLD[q],), "calculator", "calculator", "test")
                     for i, q in enumerate(questions))
    return Benchmark("calculator", "math", "scripted", problems, 0)


def scripted_run(tok, cfg: RunConfig, benchmarks, *, tools=None, crash_on=frozenset()):
    model = PerQuestionLM(tok, SCRIPTS, crash_on=crash_on)
    tool = ArithmeticTool()
    engine = RolloutEngine(model, tok, {"code": tool} if tools is None else tools, cfg.rollout)
    metrics = evaluate_engine(cfg, engine, benchmarks, model_name="scripted", model_id="scripted-v1")
    return metrics, model, tool


def samples(out_dir: Path) -> list[dict]:
    return [r for _, r in iter_json_lines(out_dir / "eval_samples.jsonl")]


def test_metrics_and_records_match_the_script(tok, tmp_path) -> None:
    metrics, _, tool = scripted_run(tok, make_cfg(tmp_path), [calculator()])
    assert metrics["calculator/accuracy"] == pytest.approx(2 / 4)
    assert metrics["calculator/pass@1"] == pytest.approx(2 / 4)
    assert metrics["calculator/format_error_rate"] == pytest.approx(1 / 4)
    assert metrics["calculator/calls_per_rollout/code"] == pytest.approx(3 / 4)
    assert metrics["calculator/calls_per_rollout/search"] == 0.0
    assert metrics["calculator/tool_failure_rate"] == pytest.approx(1 / 3)
    assert metrics["n_problems"] == 4
    assert sorted(tool.calls) == ["print(6 * 7)", "print(9 * 9)", "print(x)"]
    rows = {r["question"]: r for r in samples(tmp_path)}
    first = rows["What is 6 * 7?"]
    assert first["predicted"] == "42" and first["gold"] == ["42"] and first["score"] == 1.0
    assert first["response"].endswith("<answer>42</answer>") and "<response>\n42\n</response>" in first["response"]
    assert first["tool_calls"][0] | {"latency_s": 0} == {"tool": "code", "input": "print(6 * 7)", "output": "42",
                                                         "ok": True, "status": "ok", "latency_s": 0}
    assert rows["What is 2 + 3?"]["predicted"] == "6" and rows["What is 2 + 3?"]["score"] == 0.0
    assert rows["What is 5 * 5?"]["format_ok"] is False and rows["What is 5 * 5?"]["predicted"] is None
    assert json.loads((tmp_path / "eval.json").read_text()) == metrics


def test_no_tools_mode_offers_no_tools(tok, tmp_path) -> None:
    cfg = make_cfg(tmp_path, mode="no_tools")
    metrics, model, _ = scripted_run(tok, cfg, [calculator(["What is 2 + 3?"])], tools={})
    assert "<code>" not in model.prompts_seen[0] and "Run Python" not in model.prompts_seen[0]
    assert metrics["all/calls_per_rollout/code"] == 0.0
    assert json.loads((tmp_path / "eval_run.json").read_text())["label"] == "scripted (no tools)"


def test_tools_mode_prompt_offers_code(tok, tmp_path) -> None:
    _, model, _ = scripted_run(tok, make_cfg(tmp_path), [calculator(["What is 2 + 3?"])])
    assert "Run Python with <code>" in model.prompts_seen[0]


def test_sampling_reports_avg_and_unbiased_pass_at_k(tok, tmp_path) -> None:
    cfg = make_cfg(tmp_path, samples=3, temperature=1.0, pass_k=(1, 3))
    metrics, _, _ = scripted_run(tok, cfg, [calculator(["What is 6 * 7?", "What is 2 + 3?"])])
    assert metrics["calculator/n_samples"] == 6 and metrics["calculator/n_problems"] == 2
    assert metrics["calculator/accuracy"] == pytest.approx(0.5)  # the script ignores the temperature
    assert metrics["calculator/pass@3"] == pytest.approx(0.5)
    assert sorted((r["id"], r["sample"]) for r in samples(tmp_path)) == [
        ("calculator-0", 0), ("calculator-0", 1), ("calculator-0", 2),
        ("calculator-1", 0), ("calculator-1", 1), ("calculator-1", 2)]


def test_crashed_run_resumes_without_redoing_finished_chunks(tok, tmp_path) -> None:
    crashed, fresh = tmp_path / "crashed", tmp_path / "fresh"
    bench = [calculator()]
    with pytest.raises(RuntimeError, match="simulated decoder crash"):
        scripted_run(tok, make_cfg(crashed, chunk_problems=2), bench, crash_on=frozenset({"What is 5 * 5?"}))
    assert {r["id"] for r in samples(crashed)} == {"calculator-0", "calculator-1"}  # the first chunk was kept
    metrics, model, tool = scripted_run(tok, make_cfg(crashed, chunk_problems=2), bench)
    assert model.questions_seen == {"What is 5 * 5?", "What is 9 * 9?"}  # only the unfinished chunk ran
    assert sorted(tool.calls) == ["print(9 * 9)", "print(x)"]
    assert metrics["resumed_samples"] == 2
    fresh_metrics, _, _ = scripted_run(tok, make_cfg(fresh, chunk_problems=2), bench)
    assert samples(crashed) == samples(fresh)
    assert {k: v for k, v in metrics.items() if k != "resumed_samples"} == \
        {k: v for k, v in fresh_metrics.items() if k != "resumed_samples"}


def test_torn_last_line_and_other_models_samples_are_dropped(tok, tmp_path) -> None:
    scripted_run(tok, make_cfg(tmp_path, chunk_problems=1), [calculator(["What is 6 * 7?"])])
    lines = (tmp_path / "eval_samples.jsonl").read_text()
    foreign = json.dumps({"benchmark": "calculator", "id": "calculator-1", "sample": 0, "run_key": "other"})
    (tmp_path / "eval_samples.jsonl").write_text(lines + foreign + "\n" + '{"benchmark": "calc')
    metrics, model, _ = scripted_run(tok, make_cfg(tmp_path, chunk_problems=1),
                                     [calculator(["What is 6 * 7?", "What is 2 + 3?"])])
    assert metrics["resumed_samples"] == 1 and model.questions_seen == {"What is 2 + 3?"}
    assert [r["id"] for r in samples(tmp_path)] == ["calculator-0", "calculator-1"]


def test_resume_off_redoes_everything(tok, tmp_path) -> None:
    scripted_run(tok, make_cfg(tmp_path), [calculator(["What is 6 * 7?"])])
    _, model, _ = scripted_run(tok, make_cfg(tmp_path, resume=False), [calculator(["What is 6 * 7?"])])
    assert model.questions_seen == {"What is 6 * 7?"}


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_table_and_plots_compare_runs(tok, tmp_path) -> None:
    base, policy = tmp_path / "base", tmp_path / "policy"
    scripted_run(tok, make_cfg(base, label="Base", mode="no_tools"), [calculator(["What is 2 + 3?"])], tools={})
    scripted_run(tok, make_cfg(policy, label="Policy", compare_dirs=(str(base),)), [calculator()])
    table = (policy / "eval_table.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    # one benchmark: no macro average; the overall column is the pooled (micro) one, then the format errors
    assert cells[0] == ["Method", "Math: calculator", "All (micro)", "Format errors"]
    assert cells[2] == ["Base", "0.0", "0.0", "0.0"] and cells[3] == ["Policy", "50.0", "50.0", "25.0"]
    assert len({len(line) for line in lines[:4]}) == 1, "the table's columns are not aligned"
    assert ["Policy", "0.00 / 0.75"] in cells
    assert table.rstrip().splitlines()[-1].startswith("Flips Base -> Policy on the 1 problems both evaluated: 1 wrong -> right")
    for name in ("accuracy", "tool_calls", "response_length"):
        width, height = _png_size(policy / "eval_plots" / f"{name}.png")
        assert width >= 600 and height >= 400
    assert not (policy / "eval_plots" / "accuracy_vs_search.png").exists()  # no fact benchmark: nothing to show
    assert (policy / "eval_accuracy.csv").read_text() == "benchmark,accuracy\ncalculator,0.500000\nall,0.500000\n"
    full = json.loads((policy / "eval.json").read_text())
    headline = json.loads((policy / "headline" / "eval.json").read_text())
    # the DVC headline: the policy's pooled accuracy and right tool, the flips against Base (not a baseline of
    # evaluate.baselines, so no acc_<name> column); the detail stays in eval.json
    assert headline == {"accuracy": full["all/accuracy"], "right_tool": full["all/right_tool"], "to_right": 1.0,
                        "to_wrong": 0.0, "p_value": 1.0}
    # Base read from the folder of evaluate.baselines' "base": its accuracy joins as acc_base
    baselines = {"base": {"model": "scripted", "label": "Base", "output_dir": str(base)}}
    scripted_run(tok, make_cfg(policy, label="Policy", compare_dirs=(str(base),), baselines=baselines), [calculator()])
    assert json.loads((policy / "headline" / "eval.json").read_text()) == headline | {"acc_base": 0.0}


def test_missing_compare_dir_fails_before_any_rollout(tmp_path, tiny_model_dir) -> None:
    cfg = make_cfg(tmp_path / "out", compare_dirs=(str(tmp_path / "nowhere"),), mode="no_tools",
                   split_file=str(_split_file(tmp_path)))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        run(cfg, {}, model_path=str(tiny_model_dir))
    assert not (tmp_path / "out" / "eval_samples.jsonl").exists()


def _split_file(tmp_path: Path) -> Path:
    problems = [Problem(f"calculator-{i}", f"What is {i} * 3?", (str(3 * i),), "calculator", "calculator", "test")
                for i in range(5)]
    path = tmp_path / "test.jsonl"
    write_problems(path, problems)
    return path


def test_real_model_greedy_is_deterministic(tmp_path, tiny_model_dir) -> None:
    split = _split_file(tmp_path)
    outs = []
    for name in ("a", "b"):
        cfg = make_cfg(tmp_path / name, split_file=str(split), mode="no_tools", chunk_problems=2, plots=False)
        metrics = run(cfg, {}, model_path=str(tiny_model_dir))
        assert metrics["n_problems"] == 5
        outs.append([{k: v for k, v in r.items()} for r in samples(tmp_path / name)])
    assert outs[0] == outs[1]
    assert all(r["policy_tokens"] > 0 for r in outs[0])


def test_tools_mode_needs_the_services(tmp_path, tiny_model_dir) -> None:
    cfg = make_cfg(tmp_path, split_file=str(_split_file(tmp_path)))
    with pytest.raises(EvaluationError, match=r"needs running services for \['code'\]"):
        run(cfg, {}, model_path=str(tiny_model_dir))


@pytest.mark.parametrize("model", ["no/such/dir", "./missing-model"])
def test_missing_model_is_named(tmp_path, model: str) -> None:
    cfg = make_cfg(tmp_path, split_file=str(_split_file(tmp_path)), mode="no_tools")
    with pytest.raises(ModelSourceError, match=f"model {model!r}: no such directory"):
        run(cfg, {}, model_path=model)


def test_unreadable_model_is_named(tmp_path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    cfg = make_cfg(tmp_path, split_file=str(_split_file(tmp_path)), mode="no_tools")
    with pytest.raises(EvaluationError, match="broken.*cannot load"):
        run(cfg, {}, model_path=str(broken))


def test_directory_without_config_is_not_a_model(tmp_path) -> None:
    cfg = make_cfg(tmp_path, split_file=str(_split_file(tmp_path)), mode="no_tools")
    with pytest.raises(ModelSourceError, match="no config.json"):
        run(cfg, {}, model_path=str(tmp_path))


def test_default_config_is_the_curated_split() -> None:
    cfg = RunConfig(evaluate=EvaluateConfig(), rollout=RolloutConfig())
    assert cfg.evaluate.split_file == "data/curated/test.jsonl" and cfg.evaluate.benchmarks == ()


def test_metrics_and_reports_are_logged_to_the_active_mlflow_run(tok, tmp_path) -> None:
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    experiment = mlflow.create_experiment("eval", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=experiment) as active:
        scripted_run(tok, make_cfg(tmp_path / "out"), [calculator()])
    run_data = mlflow.get_run(active.info.run_id).data
    assert run_data.metrics["eval/calculator/accuracy"] == 0.5
    client = mlflow.MlflowClient()
    logged = {f.path for f in client.list_artifacts(active.info.run_id, "evaluation")}
    assert {f"evaluation/{n}" for n in ("eval.json", "eval_samples.jsonl", "eval_table.md", "eval_compare.json")} <= logged
    plots = {f.path for f in client.list_artifacts(active.info.run_id, "evaluation/plots")}
    assert plots == {f"evaluation/plots/{n}.png" for n in ("accuracy", "tool_calls", "response_length")}
    assert run_data.metrics["headline/accuracy"] == 0.5 and run_data.tags["eval.setting.samples"] == "1"
    table = json.loads(Path(mlflow.artifacts.download_artifacts(
        run_id=active.info.run_id, artifact_path="evaluation/samples.json", dst_path=str(tmp_path / "dl"))).read_text())
    assert table["columns"][:3] == ["benchmark", "id", "sample"] and len(table["data"]) == 4


@pytest.mark.parametrize("tepo", [{"kind": "sparse"}, {"kind": "dense", "alpha": 2.0}])
def test_how_the_policy_learns_does_not_change_an_evaluation(tok, tmp_path, tepo: dict) -> None:
    """reward.tepo is left out of the baselines' DVC params (tests/orchestration/test_dvc_deps.py): evaluating a
    model must give the same samples and metrics whichever TEPO variant the params name."""
    def evaluated(name: str, cfg: RunConfig) -> tuple[dict, list[dict]]:
        metrics, _, _ = scripted_run(tok, cfg, [calculator()])
        rows = [r | {"tool_calls": [c | {"latency_s": 0} for c in r["tool_calls"]]} for r in samples(tmp_path / name)]
        return metrics, rows
    plain = make_cfg(tmp_path / "off")
    shaped = make_cfg(tmp_path / "tepo")
    shaped = shaped.model_copy(update={"reward": shaped.reward.model_validate(shaped.reward.model_dump() | {"tepo": tepo})})
    assert shaped.reward.tepo.kind == tepo["kind"]
    assert evaluated("off", plain) == evaluated("tepo", shaped)
