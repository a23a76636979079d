"""Whether a training run picks up where an interrupted attempt of it stopped (`train.resume: auto`).

A run that is killed (an OOM kill, a pre-empted node, Ctrl-C on `dvc repro`) and started again with the same
params used to train from step 0: its checkpoints were removed by the fresh start. Now the train stage resumes
it, but only when the checkpoints are certainly this run's own unfinished work. Equal params are not enough,
since DVC also re-runs the stage when the code, the problems or the initial model changed, and checkpoints
from before such a change would carry the old computation into the new run. So a run records, beside its
config (`folder.RUN_CONFIG`), the inputs it read (`INPUTS`): a digest of the training code (the `.py`
files of `pipeline`, `sandbox`, `flows`), of the problems file, the initial model's and the search index's
files (name, size and modification time: a rewrite changes them; a copy that happens to hold the same bytes
counts as changed, which costs a fresh start, never a wrong resume) and the versions of torch and
transformers. It resumes when

- the folder holds a complete checkpoint, written under the same config (`folder.training_identity`),
- the recorded inputs equal today's, and
- the run did not finish (`FINISHED`, written once the final model is saved and registered): a forced
  re-run of a finished run (`dvc repro -f`) trains again, as asked, and
- a checkpoint's state verifies (`pipeline.training_run.resume_point.settle`: its files, and the run's history of
  the steps before it): it resumes from the newest that does, naming those it passes over; when none does it
  stops (`UnusableCheckpoints`) instead of silently continuing without that state or silently deleting hours
  of training.

Otherwise it trains afresh and says why. `--resume` (the command line) still insists: it resumes whatever the
inputs, naming those that changed. verl's `trainer.resume_mode: auto` resumes whatever is latest in its checkpoint
folder, with no check that the config or the code still match; TRL resumes only when told
(`resume_from_checkpoint`). Ours is re-run by DVC with the same command, after changes DVC itself detected.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import RunConfig
from pipeline.outputs import write_json_durably
from pipeline.paths import REPO_ROOT
from pipeline.tracking.history import RecordedHistory
from pipeline.training_run.checkpoint import REJECTED, latest_checkpoint
from pipeline.training_run.resume_point import settle
from pipeline.training_run.folder import CHECKPOINTS, FINISHED, INPUTS, RUN_CONFIG, differences, recorded_identity

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
            "init_model": tree_digest(Path(cfg.train.init_model)), "search_index": tree_digest(Path(cfg.search.index_dir)),
            **{f"library.{name}": _version(name) for name in LIBRARIES}}


def record_inputs(folder: Path, inputs: Mapping[str, str]) -> None:
    """Written by a run that takes its folder (fresh or resumed): the inputs its checkpoints are trained on."""
    write_json_durably(folder / INPUTS, dict(inputs))


def recorded_inputs(folder: Path) -> dict[str, str] | None:
    try:
        return json.loads((folder / INPUTS).read_text())
    except (OSError, ValueError):
        return None


def mark_finished(folder: Path, step: int) -> None:
    write_json_durably(folder / FINISHED, {"step": step})


def changed_inputs(folder: Path, inputs: Mapping[str, str]) -> list[str]:
    """The inputs that differ from those the folder's checkpoints were trained on (all, when none are recorded)."""
    recorded = recorded_inputs(folder)
    if recorded is None:
        return [f"{INPUTS}: not recorded"]
    return [line.replace(" in the checkpoints", " then") for line in differences(recorded, inputs)]


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    reason: str  # one line for the log: what was found, and so what happens


def _set_aside_note(folder: Path) -> str:
    rejected = sorted(p.name for p in (folder / CHECKPOINTS).glob(f"step-??????{REJECTED}"))
    return f" (checkpoints set aside by an earlier resume: {', '.join(rejected)})" if rejected else ""


def decide_resume(folder: Path, identity: Mapping[str, object], inputs: Mapping[str, str],
                  history: RecordedHistory) -> ResumeDecision:
    """`train.resume: auto`: resume the folder's interrupted attempt only when it is certainly this run's, from
    the newest checkpoint whose state verifies (checkpoints passed over are set aside; raises
    `UnusableCheckpoints` when none verifies)."""
    latest = latest_checkpoint(folder)
    if latest is None:
        return ResumeDecision(False, f"no complete checkpoint in {folder}{_set_aside_note(folder)}: training from "
                                     "step 0")
    if (folder / FINISHED).is_file():
        return ResumeDecision(False, f"the run in {folder} finished; training it again from step 0")
    try:
        recorded = recorded_identity(folder)
    except ValueError as err:
        return ResumeDecision(False, f"{err}: training from step 0")
    if recorded is None or differences(recorded, identity):
        return ResumeDecision(False, f"the checkpoints in {folder} were written under another config ({RUN_CONFIG}): "
                                     "training from step 0")
    changed = changed_inputs(folder, inputs)
    if changed:
        return ResumeDecision(False, f"the checkpoints in {folder} were trained on other inputs ("
                                     + "; ".join(changed) + "): training from step 0")
    point = settle(folder, history)
    assert point.checkpoint is not None  # a complete checkpoint is there, and settle raises when none verifies
    return ResumeDecision(True, f"resuming the interrupted run in {folder} from {point.checkpoint.name} "
                                "(same config, code, problems and initial model; train.resume: never trains afresh)")
