"""What a training run read besides its config, recorded beside its checkpoints (`INPUTS`, `run_inputs.json`).

Equal params do not make two runs the same: DVC also re-runs the train stage when the code, the problems or the
initial model changed, and checkpoints from before such a change would carry the old computation into the new
run. So a run records, beside its config (`folder.RUN_CONFIG`), a digest of the training code (the `.py` files of
`pipeline`, `sandbox`, `flows`), of the problems file, the initial model's and the search index's files (name,
size and modification time: a rewrite changes them; a copy that happens to hold the same bytes counts as changed,
which costs a fresh start, never a wrong resume) and the versions of torch and transformers. `train.checkpoints.resume: auto`
resumes a folder only when they equal today's; `--resume` resumes whatever they are, naming those that changed
(`pipeline.training_run.plan`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.outputs import write_json_durably
from pipeline.paths import REPO_ROOT
from pipeline.training_run.folder import INPUTS, differences

CODE_PACKAGES = ("pipeline", "sandbox", "flows")
LIBRARIES = ("torch", "transformers")


def _digest_files(root: Path, paths: list[Path], *, content: bool) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        if content:
            digest.update(path.read_bytes())
        else:
            stat = path.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def code_digest(root: Path = REPO_ROOT) -> str:
    """The training code as it is on disk: every `.py` file of the packages the train stage runs."""
    files = sorted(p for package in CODE_PACKAGES if (root / package).is_dir()
                   for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return _digest_files(root, files, content=True)


def tree_digest(path: Path) -> str:
    """A file by content; a folder by its files' names, sizes and times; `absent` when there is nothing."""
    if path.is_file():
        return _digest_files(path.parent, [path], content=True)
    if path.is_dir():
        return _digest_files(path, sorted(p for p in path.rglob("*") if p.is_file()), content=False)
    return "absent"  # a hub id (the config names it) or a service that is not local


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def run_inputs(cfg: RunConfig) -> dict[str, str]:
    """{input: digest} of everything a run reads besides its config."""
    return {"code": code_digest(), "train_file": tree_digest(Path(cfg.train.train_file)),
            "init_model": tree_digest(Path(cfg.train.init_model)),
            "search_index": tree_digest(Path(cfg.search.index_dir)),
            **{f"library.{name}": _version(name) for name in LIBRARIES}}


def record_inputs(folder: Path, inputs: Mapping[str, str]) -> None:
    """Written by a run that takes its folder (fresh or resumed): the inputs its checkpoints are trained on."""
    write_json_durably(folder / INPUTS, dict(inputs))


def recorded_inputs(folder: Path) -> dict[str, str] | None:
    try:
        return json.loads((folder / INPUTS).read_text())
    except (OSError, ValueError):
        return None


def changed_inputs(folder: Path, inputs: Mapping[str, str]) -> list[str]:
    """The inputs that differ from those the folder's checkpoints were trained on (all, when none are recorded)."""
    recorded = recorded_inputs(folder)
    if recorded is None:
        return [f"{INPUTS}: not recorded"]
    return [line.replace(" in the checkpoints", " then") for line in differences(recorded, inputs)]


def note_inputs(folder: Path, inputs: Mapping[str, str], *, resume: bool) -> None:
    """Record what this run trains on; a resume of checkpoints trained on other inputs (`--resume` insists;
    `train.checkpoints.resume: auto` never does this) says which changed."""
    changed = changed_inputs(folder, inputs) if resume else []
    if changed:
        print(f"train: --resume continues checkpoints trained on other inputs: {'; '.join(changed)}",
              file=sys.stderr, flush=True)
    record_inputs(folder, inputs)
