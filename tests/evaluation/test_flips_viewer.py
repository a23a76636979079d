"""The flip viewer (`python -m pipeline.evaluation.flips`) over two real evaluation folders, written by the
evaluation itself with scripted models: the problems fixed and broken, side by side, and the same sign-test line as
the evaluation table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.evaluation.benchmarks import Benchmark
from pipeline.evaluation.evaluate import evaluate_engine
from pipeline.evaluation.flips import flipped, main, shorten
from pipeline.evaluation.results import load_run
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import Problem
from tests.evaluation.conftest import make_cfg
from tests.evaluation.helpers import ArithmeticTool, PerQuestionLM

REPO = Path(__file__).resolve().parents[2]
GOLD = {"What is 6 * 7?": "42", "What is 2 + 3?": "5", "What is 9 * 9?": "81", "What is 4 + 4?": "8"}
RIGHT = {q: [f"<think>compute</think> <code>print({q[8:-1]})</code>", f"<answer>{a}</answer>"] for q, a in GOLD.items()}
WRONG = {q: ["<think>guess</think> <answer>7</answer>"] for q in GOLD}
# The SFT-like model solves 6 * 7 and 2 + 3; the RL-like one 6 * 7, 9 * 9 and 4 + 4: two fixed, one broken.
BEFORE = {**WRONG, "What is 6 * 7?": RIGHT["What is 6 * 7?"], "What is 2 + 3?": RIGHT["What is 2 + 3?"]}
AFTER = {**RIGHT, "What is 2 + 3?": WRONG["What is 2 + 3?"]}


def evaluate(tok, out_dir: Path, label: str, scripts: dict[str, list[str]], compare: tuple[str, ...] = ()) -> None:
    problems = tuple(Problem(f"calculator-{i}", q, (a,), "calculator", "calculator", "test")
                     for i, (q, a) in enumerate(GOLD.items()))
    cfg = make_cfg(out_dir, label=label, compare_dirs=compare, plots=False)
    model: Any = PerQuestionLM(tok, scripts)  # a scripted double where the engine takes a Hugging Face model
    tools: Any = {"code": ArithmeticTool()}
    engine = RolloutEngine(model, tok, tools, cfg.rollout)
    evaluate_engine(cfg, engine, [Benchmark("calculator", "math", "scripted", problems, 0)], model_name=label,
                    model_id=label)


@pytest.fixture(scope="module")
def folders(tok, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("flips")
    before, after = root / "eval" / "sft", root / "policy"
    evaluate(tok, before, "SFT (tools)", BEFORE)
    evaluate(tok, after, "SFT + DAPO (tools)", AFTER, compare=(str(before),))
    return before, after


def viewer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_fixed_problems_come_first_then_broken_and_the_table_s_flips_line_last(folders, capsys) -> None:
    before, after = folders
    code, out, _ = viewer(["--before", str(before), "--after", str(after)], capsys)
    assert code == 0
    lines = out.rstrip().splitlines()
    table_line = (after / "eval_table.md").read_text().rstrip().splitlines()[-1]
    assert lines[-1] == table_line == ("Flips SFT (tools) -> SFT + DAPO (tools) on the 4 problems both evaluated: "
                                       "2 wrong -> right, 1 right -> wrong (two-sided sign test p = 1).")
    headers = [line for line in lines if line.startswith("== ")]
    assert headers == ["== wrong -> right: 2 problems ==", "== right -> wrong: 1 problem =="]
    problems = [line for line in lines if line.startswith("[")]
    assert problems == ["[calculator/calculator-2] What is 9 * 9?", "[calculator/calculator-3] What is 4 + 4?",
                        "[calculator/calculator-1] What is 2 + 3?"]
    fixed = lines[lines.index(problems[0]):lines.index(problems[1])]
    assert fixed[1] == "  gold: 81"
    assert fixed[2] == "  SFT (tools): wrong, answered '7', 0 tool calls"
    assert fixed[4] == "  SFT + DAPO (tools): right, answered '81', 1 tool call"
    assert fixed[5] == "    1. code(print(9 * 9)) -> '81' [ok]"
    assert fixed[6].startswith("    response: <think>compute</think> <code>print(9 * 9)</code>")
    assert fixed[6].endswith("<answer>81</answer>")


def test_show_and_limit_choose_what_is_printed(folders, capsys) -> None:
    before, after = folders
    _, out, _ = viewer(["--before", str(before), "--after", str(after), "--show", "broken"], capsys)
    assert "== wrong -> right" not in out and "[calculator/calculator-1] What is 2 + 3?" in out
    _, out, _ = viewer(["--before", str(before), "--after", str(after), "--show", "fixed", "--limit", "1"], capsys)
    assert "== wrong -> right: 2 problems, the first 1 shown ==" in out and "== right -> wrong" not in out
    assert out.count("\n[calculator/") + out.startswith("[") == 1
    assert out.rstrip().splitlines()[-1].startswith("Flips SFT (tools) -> SFT + DAPO (tools)")  # counts are all


def test_the_viewer_shows_what_paired_flips_counts(folders) -> None:
    before, after = (load_run(d) for d in folders)
    fixed, broken = flipped(before.records, after.records)
    assert [f.after["id"] for f in fixed] == ["calculator-2", "calculator-3"]
    assert [f.before["id"] for f in broken] == ["calculator-1"]


def test_the_defaults_come_from_params_and_a_missing_folder_names_its_stage(folders, tmp_path, capsys) -> None:
    before, after = folders
    params = tmp_path / "params.yaml"
    section: dict[str, Any] = {"output_dir": str(after), "baselines": {"sft": {"model": "models/sft", "output_dir": str(before)}}}
    params.write_text(yaml.safe_dump({"extends": "defaults", "evaluate": section}))
    code, out, _ = viewer(["--params", str(params)], capsys)
    assert code == 0 and out.rstrip().endswith("1 right -> wrong (two-sided sign test p = 1).")
    section["baselines"]["sft"]["output_dir"] = str(tmp_path / "nowhere")
    params.write_text(yaml.safe_dump({"extends": "defaults", "evaluate": section}))
    code, _, err = viewer(["--params", str(params)], capsys)
    assert code == 1
    assert err.strip() == f"flips: --before {tmp_path / 'nowhere'} does not exist; produce it with `dvc repro evaluate-sft`"
    code, _, err = viewer(["--before", str(before), "--after", str(tmp_path)], capsys)
    assert code == 1 and err.startswith(f"flips: --after {tmp_path} holds no evaluation (no eval_run.json, eval.json")
    assert "python -m flows.evaluate" in err


def test_a_long_response_keeps_its_start_and_its_end() -> None:
    text = "start " + "x " * 500 + "<answer>42</answer>"
    short = shorten(text, 60)
    assert len(short) <= 60 and short.startswith("start x") and short.endswith("<answer>42</answer>")
    assert shorten("a\n  b", 60) == "a b"


def test_the_command_runs_as_a_module(folders) -> None:
    before, after = folders
    done = subprocess.run([sys.executable, "-m", "pipeline.evaluation.flips", "--before", str(before), "--after",
                           str(after), "--limit", "1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith("Flips SFT (tools) -> SFT + DAPO (tools)")
