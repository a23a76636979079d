"""Every benchmark script still imports: a module it names that moved or went away fails here, not in the hands
of whoever next wants the number (shared_prefix_update imported a removed module for a while, unseen).

One child interpreter imports them all, so no script's import-time settings reach the test process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

IMPORT_ALL = """
import importlib, json, pathlib, sys
failed = {}
for path in sorted(pathlib.Path("benchmarks").glob("*.py")):
    try:
        importlib.import_module(f"benchmarks.{path.stem}")
    except BaseException as err:  # SystemExit too: a script must not act on import
        failed[path.stem] = repr(err)
print(json.dumps(failed))
"""


def test_every_benchmark_script_imports(repo_root: Path, tmp_path: Path) -> None:
    scripts = sorted((repo_root / "benchmarks").glob("*.py"))
    assert len(scripts) > 10
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=repo_root, capture_output=True, text=True,
                          env={"PYTHONPATH": str(repo_root), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}
