"""A training run's plan: where the run lives, what identifies it, what it read, and whether and from which
checkpoint it continues, decided once, before anything loads (`plan_run`), and handed to the recipe
(`pipeline.train.run`).

The train stage's flow makes the plan before Prefect starts (a mistake the user can fix ends the stage with one
line) and hands it to the recipe in its own process, or to every data-parallel rank on the rank's command line
(`RunPlan.encoded`): every process of the run loads the checkpoint the stage chose and verified, none chooses
again. A library caller that gives no plan trains afresh in the config's folder (`plan_run`'s default).

How a run goes (`mode`):

- `insisted` (`--resume`): the folder's checkpoints must be this config's (`ConfigMismatch` names every key that
  differs); the run continues from the newest checkpoint whose state verifies (`resume_point.settle`), or from
  step 0 when the folder holds no checkpoint, and stops when it holds only torn or unusable ones. Inputs that
  changed since are named when the folder is taken (`inputs.note_inputs`).
- `auto` (`train.checkpoints.resume: auto`): the folder's interrupted attempt is continued only when it is certainly this
  run's own unfinished work (`decide_resume`): a complete checkpoint, written under the same config
  (`folder.training_identity`), on the same inputs (`inputs.run_inputs`), of a run that did not finish (`FINISHED`:
  a forced re-run of a finished run, `dvc repro -f`, trains again, as asked), whose state verifies (its files and
  the run's history of the steps before it): the newest that does, naming those passed over; when none does it
  stops (`UnusableCheckpoints`) instead of silently continuing without that state or silently deleting hours of
  training. Otherwise it trains from step 0 and says why.
- `never` (`train.checkpoints.resume: never`, and the library's default): from step 0.

verl's `trainer.resume_mode: auto` resumes whatever is latest in its checkpoint folder, with no check that the
config or the code still match; TRL resumes only when told (`resume_from_checkpoint`). Ours is re-run by DVC with
the same command, after changes DVC itself detected.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from pipeline.config import RunConfig
from pipeline.tracking.history import RecordedHistory
from pipeline.training_run.checkpoint import REJECTED, latest_checkpoint
from pipeline.training_run.folder import (CHECKPOINTS, FINISHED, HISTORY, RUN_CONFIG, check_resumable, differences,
                                          recorded_identity, run_folder, take, training_identity)
from pipeline.training_run.inputs import changed_inputs, note_inputs, run_inputs
from pipeline.training_run.resume_point import run_history, settle

Mode = Literal["insisted", "auto", "never"]


@dataclass(frozen=True)
class RunPlan:
    """One run's lifecycle as decided before anything loads; the same record in every process of the run."""

    folder: Path  # <train.checkpoints.dir>/<run>: checkpoints/, run_config.json, run_inputs.json, history.jsonl
    identity: Mapping[str, Any]  # {dotted key: value} of what the run computes, recorded as run_config.json
    inputs: Mapping[str, str]  # {input: digest} of what it reads besides the config, recorded as run_inputs.json
    mode: Mode  # who decided: --resume, train.checkpoints.resume auto, or never
    resume: bool  # the run continues its folder (keeps its checkpoints and records) rather than starting afresh
    reason: str  # one line for the log: what was found, and so what happens
    start_from: Path | None  # the checkpoint every process loads; None: step 0

    @property
    def history(self) -> Path:
        """The run's own copy of its per-step history (the stage's copy is an output DVC removes)."""
        return self.folder / HISTORY

    def encoded(self) -> str:
        """The plan as one command-line word: JSON in URL-safe base64, as DeepSpeed passes its world info, since a
        multi-node launcher hands a rank's arguments to a remote shell unquoted."""
        fields = {"folder": str(self.folder), "identity": dict(self.identity), "inputs": dict(self.inputs),
                  "mode": self.mode, "resume": self.resume, "reason": self.reason,
                  "start_from": None if self.start_from is None else str(self.start_from)}
        return base64.urlsafe_b64encode(json.dumps(fields, sort_keys=True).encode()).decode("ascii")

    @classmethod
    def decoded(cls, word: str) -> RunPlan:
        """The plan `encoded` wrote; ValueError when `word` is no such plan (a rank started by hand, a cut word)."""
        try:
            fields = json.loads(base64.urlsafe_b64decode(word.encode("ascii")))
        except (UnicodeError, binascii.Error, ValueError) as err:
            raise ValueError(f"--plan: not a run plan ({type(err).__name__}: {err})") from None
        if not (isinstance(fields, dict) and set(fields) == set(_KINDS) and fields["mode"] in get_args(Mode)
                and all(isinstance(fields[name], kind) for name, kind in _KINDS.items())):
            raise ValueError(f"--plan: not a run plan (it holds {json.dumps(fields)[:200]})")
        start = fields["start_from"]
        return cls(Path(fields["folder"]), fields["identity"], fields["inputs"], fields["mode"], fields["resume"],
                   fields["reason"], None if start is None else Path(start))


# the fields of an encoded plan, as JSON holds them
_KINDS: dict[str, type | tuple[type, ...]] = {
    "folder": str, "identity": dict, "inputs": dict, "mode": str, "resume": bool, "reason": str,
    "start_from": (str, type(None))}


def plan_run(cfg: RunConfig, *, name: str | None = None, metrics_dir: Path = Path("metrics"),
             mode: Mode = "never") -> RunPlan:
    """The run's plan (see the module): its folder (`name`, else the config's digest), and whether and from where
    it resumes, reading the run's history in its folder or else in `metrics_dir`. Raises what stops a resume:
    `ConfigMismatch`, `TornCheckpoints`, `UnusableCheckpoints` (checkpoints passed over are set aside, once)."""
    folder, identity, inputs = run_folder(cfg, name), training_identity(cfg), run_inputs(cfg)
    if mode == "insisted":
        check_resumable(folder, identity)  # before any model loads: checkpoints of another config are refused
        point = settle(folder, run_history(folder, metrics_dir), insisted=True)
        reason = f"--resume: continuing the run in {folder} from {point.checkpoint.name}" if point.checkpoint else \
            f"--resume: no checkpoint in {folder}: training from step 0"
        return RunPlan(folder, identity, inputs, mode, True, reason, point.checkpoint)
    if mode == "auto":
        decision = decide_resume(folder, identity, inputs, run_history(folder, metrics_dir))
        return RunPlan(folder, identity, inputs, mode, decision.resume, decision.reason, decision.checkpoint)
    return RunPlan(folder, identity, inputs, mode, False, f"training the run in {folder} from step 0", None)


def take_folder(plan: RunPlan) -> None:
    """The main process, once the run is set up, before its first step: a fresh run removes the checkpoints and
    records an earlier attempt left (naming them); the config and the inputs are recorded (`--resume` names the
    inputs that changed under its checkpoints)."""
    take(plan.folder, plan.identity, resume=plan.resume)
    note_inputs(plan.folder, plan.inputs, resume=plan.resume)


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    reason: str  # one line for the log: what was found, and so what happens
    checkpoint: Path | None = None  # where the resume continues from (the newest whose state verifies)


def _set_aside_note(folder: Path) -> str:
    rejected = sorted(p.name for p in (folder / CHECKPOINTS).glob(f"step-??????{REJECTED}"))
    return f" (checkpoints set aside by an earlier resume: {', '.join(rejected)})" if rejected else ""


def decide_resume(folder: Path, identity: Mapping[str, object], inputs: Mapping[str, str],
                  history: RecordedHistory) -> ResumeDecision:
    """`train.checkpoints.resume: auto`: resume the folder's interrupted attempt only when it is certainly this run's, from
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
                                "(same config, code, problems and initial model; train.checkpoints.resume: never trains afresh)",
                          point.checkpoint)
