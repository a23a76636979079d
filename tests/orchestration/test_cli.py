"""The stage command lines: `--help` answers before anything heavy is imported (so in well under 2 s on any
machine: the property is what is imported, not a timing), and a user's mistake ends with one line on stderr and
exit 1, not a traceback."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.cli import COMMANDS
from pipeline.jsonl import write_problems
from pipeline.config import load_config
from pipeline.training_run.folder import RUN_CONFIG, training_identity
from pipeline.types import Problem

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("prefect", "mlflow", "torch", "transformers", "deepspeed", "dvc", "peft")
HELP_DRIVER = r"""
import json, runpy, sys
sys.argv = [MODULE, "--help"]
code = None
try:
    runpy.run_module(MODULE, run_name="__main__")
except SystemExit as done:
    code = done.code
print(json.dumps({"code": code, "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))}))
"""


def run_module(args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_imports_nothing_heavy(module: str) -> None:
    driver = f"MODULE = 'flows.{module}'\nHEAVY = {HEAVY!r}\n" + HELP_DRIVER
    done = run_module(["-c", driver])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"code": 0, "heavy": []}
    assert f"usage: python -m flows.{module} " in done.stdout  # not "train.py"


def one_line_error(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{command}: "), done.stderr[-3000:]
    return lines[0]


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.jsonl"
    write_problems(path, [Problem("p1", "What is 1 + 1?", ("2",), "calculator", "calculator", "test")])
    return path


def test_a_missing_benchmark_file_or_model_is_one_line(tmp_path: Path) -> None:
    params = tmp_path / "eval.yaml"
    params.write_text(yaml.safe_dump({"extends": str(REPO / "params.yaml"),
                                      "evaluate": {"split_file": str(tmp_path / "nowhere.jsonl")}}))
    done = run_module(["-m", "flows.evaluate", "--params", str(params)])
    assert "nowhere.jsonl: no such file" in one_line_error(done, "evaluate")
    params.write_text(yaml.safe_dump({"extends": str(REPO / "params.yaml"),
                                      "evaluate": {"split_file": str(problems_file(tmp_path))}}))
    done = run_module(["-m", "flows.evaluate", "--params", str(params), "--model", str(tmp_path / "no-such-model")])
    assert "no-such-model': no such directory" in one_line_error(done, "evaluate")


def test_a_bad_params_file_names_the_key(tmp_path: Path) -> None:
    params = tmp_path / "bad.yaml"
    params.write_text("extends: defaults\ntrain:\n  steps: '4'\n")
    done = run_module(["-m", "flows.train", "--params", str(params)])
    assert done.returncode == 1 and "Traceback" not in done.stderr and "train.steps" in done.stderr


def test_a_resume_under_another_config_is_one_line_naming_the_key(tmp_path: Path) -> None:
    problems = problems_file(tmp_path)
    params = tmp_path / "mine.yaml"
    params.write_text(yaml.safe_dump({"extends": str(REPO / "params.yaml"), "train": {
        "train_file": str(problems), "checkpoints": {"dir": str(tmp_path / "runs")}, "steps": 3}}))
    folder = tmp_path / "runs" / "mine"  # an ad-hoc run is named by its label (the params file's name)
    (folder / "checkpoints" / "step-000002").mkdir(parents=True)
    written = training_identity(load_config(params, overrides={"train.steps": 4}))
    (folder / RUN_CONFIG).write_text(json.dumps(written))
    done = run_module(["-m", "flows.train", "--params", str(params), "--resume"])
    line = one_line_error(done, "train")
    assert "train.steps: 4 in the checkpoints, 3 now" in line and str(folder / "checkpoints") in line


QUIET_DRIVER = r"""
import logging, sys
from flows.quiet import quiet_libraries
quiet_libraries()
import deepspeed  # noqa: F401  (on a CPU machine it announces its CPU fallback)
from tests.helpers.tiny import tiny_llama, tiny_tokenizer
tok = tiny_tokenizer()
model = tiny_llama(len(tok), seed=0)
from pipeline.model import enable_activation_checkpointing
enable_activation_checkpointing(model)  # the pipeline's call: not the deprecated name
model.is_gradient_checkpointing  # deprecated in the pinned transformers; peft still reads it
model.save_pretrained(sys.argv[1])  # transformers draws a "Writing model shards" bar unless told not to
from sandbox.search import bm25  # noqa: F401
print("bm25s level", logging.getLogger("bm25s").getEffectiveLevel())
"""


def test_library_noise_is_silenced_at_the_source(tmp_path: Path) -> None:
    done = run_module(["-c", QUIET_DRIVER, str(tmp_path / "model")])
    assert done.returncode == 0, done.stderr[-3000:]
    noise = ("Setting accelerator to CPU", "Writing model shards", "is_gradient_checkpointing",
             "gradient_checkpointing_enable")
    assert not [n for n in noise if n in done.stdout + done.stderr], done.stdout + done.stderr
    assert f"bm25s level {logging.WARNING}" in done.stdout


def test_a_stage_started_outside_the_checkout_gets_the_projects_prefect_settings(tmp_path: Path, monkeypatch) -> None:
    """Prefect reads prefect.toml from the working directory only: a stage started elsewhere ran with Prefect's
    20 s limit on its temporary server's start, which a loaded machine overran ("Timed out while attempting to
    connect to ephemeral Prefect API server"). Every key of the checkout's prefect.toml reaches such a stage, as the
    setting Prefect reads; a variable the user set wins, and in the checkout prefect.toml itself is read."""
    import tomllib

    from prefect.settings import Settings

    from flows.cli import project_prefect_settings

    table = tomllib.loads((REPO / "prefect.toml").read_text())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    monkeypatch.setattr(os, "environ", environ | {"PREFECT_LOGGING_LEVEL": "DEBUG"})  # the user's own choice
    assert project_prefect_settings(REPO) == {}
    monkeypatch.chdir(tmp_path)
    added = project_prefect_settings()
    assert added["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "120" and "PREFECT_LOGGING_LEVEL" not in added
    settings = Settings()
    assert settings.logging.level == "DEBUG"

    def leaves(node: dict, path: tuple[str, ...] = ()):
        for key, value in node.items():
            yield from leaves(value, (*path, key)) if isinstance(value, dict) else [((*path, key), value)]

    for path, value in leaves(table):
        if path == ("logging", "level"):
            continue
        got = settings
        for part in path:
            got = getattr(got, part)
        assert got == value, (path, got, value)
