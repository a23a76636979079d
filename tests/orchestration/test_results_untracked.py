"""Main carries code, not results (docs/orchestration.md): git tracks neither `dvc.lock` nor anything a stage writes.

A committed `dvc.lock` records the inputs of one machine's run: on a fresh clone `dvc status` then calls every stage
changed, and the next commit made after a `dvc repro` carries the new hashes into an unrelated change (it happened
three times). `dvc exp run` still records each experiment's own `dvc.lock` and metrics in its commit, untracked as
they are on main. Checked on the checkout the suite runs from; skipped where that is not a git work tree.
"""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath

import pytest

from flows.outputs import dvc_tracked

REPO = Path(__file__).resolve().parents[2]


def tracked_files() -> list[PurePosixPath]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git work tree")
    return [PurePosixPath(p) for p in listed.stdout.decode().split("\0") if p]


def test_no_stage_result_is_committed() -> None:
    outputs = dvc_tracked(REPO / "dvc.yaml")
    committed = [p for p in tracked_files()
                 if p == PurePosixPath("dvc.lock")
                 or (p.name != ".gitignore" and any(p == out or out in p.parents for out in outputs))]
    assert not committed, (f"results committed to the code branch: {[str(p) for p in committed]}; "
                           "untrack them with `git rm --cached` (an experiment's commit records its own)")
