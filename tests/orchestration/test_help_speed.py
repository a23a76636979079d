"""Every command a user is shown answers `--help` at once: each `python -m <module>` of this repository that the
README or docs/ name, every stage flow, and the library's own commands. `python -m pipeline.export --help` took
17 s: it imported torch before it read its command line.

The property is what a `--help` imports (none of torch, transformers, MLflow, Prefect, DVC: seconds each), checked
in a child process's `sys.modules`, plus the CPU time the child used, its own resource usage (not the wall clock,
which a loaded machine stretches), bounded by the 2 s a user may wait.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("prefect", "mlflow", "torch", "transformers", "deepspeed", "dvc", "peft", "vllm")
CPU_LIMIT_S = 2.0
OWN_TREES = ("flows", "pipeline", "benchmarks", "sandbox")
# Started by a stage with its arguments (the train stage's ranks, the services, the reaper): no user types these.
NOT_USER_COMMANDS = {"pipeline.train": "one rank of the train stage, started by flows.train (docs/scale-out.md)"}
# Commands no document names yet, which a user meets in --help texts and module docstrings.
LIBRARY_COMMANDS = ("pipeline.data", "pipeline.tracking.compare", "pipeline.config",
                    "pipeline.export")
DRIVER = r"""
import json, resource, runpy, sys
module, heavy = sys.argv[1], set(sys.argv[2].split(","))
sys.argv = [module, "--help"]
code = None
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
except SystemExit as done:
    code = done.code
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "heavy": sorted({m.split(".")[0] for m in sys.modules} & heavy)}))
"""


def documented_commands() -> set[str]:
    """Every `python -m <module>` in README.md and docs/*.md whose module is this repository's."""
    text = "\n".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    found = set(re.findall(r"python -m ([A-Za-z_][\w.]*\w)", text))
    return {m for m in found if m.split(".")[0] in OWN_TREES and _module_file(m) is not None}


def _module_file(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__main__.py") if p.is_file()), None)


COMMANDS_SHOWN = sorted((documented_commands() | {f"flows.{m}" for m in COMMANDS} | set(LIBRARY_COMMANDS))
                        - set(NOT_USER_COMMANDS))


def test_the_documents_name_the_commands_checked_here() -> None:
    documented = documented_commands()
    assert {"pipeline.export", "pipeline.tracking.compare", "flows.experiment", "benchmarks.claims"} <= documented
    assert all(_module_file(m) is not None for m in COMMANDS_SHOWN), COMMANDS_SHOWN


@pytest.mark.parametrize("module", COMMANDS_SHOWN)
def test_help_answers_at_once(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    done = subprocess.run([sys.executable, "-c", DRIVER, module, ",".join(HEAVY)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 0 and result["heavy"] == [], result
    assert "usage:" in done.stdout and f"python -m {module}" in done.stdout, done.stdout[:500]
    assert result["cpu_s"] < CPU_LIMIT_S, result
