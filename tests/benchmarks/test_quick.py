"""Every benchmark's quick mode runs and ends with its figures: one JSON object, with "ratio" where the benchmark's
docstring names one. A benchmark that no longer starts against today's config or code fails here, not in the hands
of whoever next wants its figure (on 2026-12-07 two no longer started: trainer_vs_trl's overrides were refused by
params.yaml's cross-section checks, and rollout_overlap's search service refused the partial params file it wrote).

The benchmarks are the scripts of benchmarks/ (a module with `if __name__ == "__main__":`), found, not listed, so a
new one is covered as soon as it exists; the modules they share must each be used by one of them. Each runs as
`python -m benchmarks.<name> --quick` in a fresh interpreter (benchmarks set threads, swap functions, install event
loops), from an empty folder (a quick run writes nothing into the checkout). They share one quick workspace (the tiny
cold-started model, the toy problems: `benchmarks.harness.quick_workspace`) and the session's code sandbox, search
service and Redis, which its params name, so no quick run trains a model or starts a tool service of its own.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import WORKSPACE_ENV
from benchmarks.preset_run import quick_workspace
from pipeline.paths import REPO_ROOT
from pipeline.services.processes import ServiceProcess
from tests.helpers.source_imports import imports

MAIN_GUARD = 'if __name__ == "__main__":'
SCRIPTS = sorted(p.stem for p in (REPO_ROOT / "benchmarks").glob("*.py") if MAIN_GUARD in p.read_text())
NEEDS = {  # benchmark -> (a module only another environment has, why skipped without it)
    "trainer_vs_trl": ("trl", "needs TRL, the optional extra (pip install -e .[bench])"),
    "inference_servers": ("vllm", "needs the vLLM environment (.venv-vllm, scripts/setup_vllm.sh)"),
}
# benchmark -> what breaks it outside benchmarks/: strict, so the run that passes again fails until this entry goes
BROKEN_ELSEWHERE = {
    "curation": "configs/curate-tapo-mix.yaml lists sample files of other sources (hotpotqa-distractor's 100 rows are "
                "all in hotpotqa-dev, bamboogle's FlashRAG copy is bamboogle's CSV), and since 1385cbc curation stops "
                "when one filter rejects all of a source (pipeline/data/broken.py), so the mix no longer curates",
}
# benchmark -> the test that runs its quick mode itself and checks more of its figures (run once, not twice)
OWN_TEST = {"gpu_check": "tests/distributed/test_gpu_check.py"}
NAMES_RATIO = re.compile(r'["`]ratio["`]|\bratio\s*=')  # the docstring names the "ratio" its last line carries
QUICK_TIMEOUT_S = 600  # generous: a loaded 2-core machine runs a quick mode 3-5x slower than an idle one


def docstring(name: str) -> str:
    return ast.get_docstring(ast.parse((REPO_ROOT / "benchmarks" / f"{name}.py").read_text())) or ""


@pytest.fixture(scope="module")
def quick_env(tmp_path_factory: pytest.TempPathFactory, code_sandbox_url: str, wiki_search_url: str,
              redis_server: ServiceProcess) -> dict[str, str]:
    workspace = quick_workspace(tmp_path_factory.mktemp("quick-workspace"), {
        "sandbox.url": code_sandbox_url, "search.url": wiki_search_url, "search.redis_url": redis_server.url})
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | {WORKSPACE_ENV: str(workspace), "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def quick_params() -> list:
    return [pytest.param(name, marks=pytest.mark.xfail(reason=BROKEN_ELSEWHERE[name], strict=True))
            if name in BROKEN_ELSEWHERE else name for name in SCRIPTS if name not in OWN_TEST]


def test_a_benchmark_left_to_its_own_test_is_run_there_in_quick_mode() -> None:
    for name, test in OWN_TEST.items():
        assert name in SCRIPTS and f'"benchmarks/{name}.py", "--quick"' in (REPO_ROOT / test).read_text(), (name, test)


@pytest.mark.timeout(QUICK_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", quick_params())
def test_quick_mode_ends_with_its_figures(name: str, quick_env: dict[str, str], tmp_path: Path) -> None:
    if name in NEEDS and importlib.util.find_spec(NEEDS[name][0]) is None:
        pytest.skip(NEEDS[name][1])
    done = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--quick"], cwd=tmp_path, env=quick_env,
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output\n{done.stderr[-2000:]}"
    last = json.loads(lines[-1])
    assert isinstance(last, dict) and last.get("quick") is True, lines[-1][:500]
    if NAMES_RATIO.search(docstring(name)):
        ratio = last.get("ratio")
        assert isinstance(ratio, (int, float)) and math.isfinite(ratio), f"ratio {ratio!r}: {lines[-1][:500]}"
    assert not list(tmp_path.iterdir()) or all(p.name.startswith(".") for p in tmp_path.iterdir()), \
        f"the quick run wrote into its working folder: {sorted(p.name for p in tmp_path.iterdir())}"


def test_every_benchmark_has_a_quick_mode_and_every_module_is_used() -> None:
    """A script without `--quick` would fail above; a module of benchmarks/ that is no script is a library one of
    them imports (a script without its main guard would otherwise escape the quick runs unseen)."""
    assert len(SCRIPTS) > 20
    modules = {p.stem for p in (REPO_ROOT / "benchmarks").glob("*.py")} - {"__init__"}
    used = {name.split(".")[1] for p in (REPO_ROOT / "benchmarks").glob("*.py")
            for name, _, _ in imports(p, with_names=True) if name.startswith("benchmarks.")}
    assert sorted(modules - set(SCRIPTS) - used) == []
    assert all("--quick" in (REPO_ROOT / "benchmarks" / f"{name}.py").read_text() for name in SCRIPTS)


def test_no_test_outside_tests_benchmarks_imports_benchmarks() -> None:
    """Benchmarks are measurements, not library code: what a test needs lives in pipeline/ or tests/helpers/."""
    tests = REPO_ROOT / "tests"
    found = [f"{p.relative_to(REPO_ROOT)}:{line}: {name}" for p in sorted(tests.rglob("*.py"))
             if tests / "benchmarks" not in p.parents for name, line, _ in imports(p)
             if name == "benchmarks" or name.startswith("benchmarks.")]
    assert found == []
