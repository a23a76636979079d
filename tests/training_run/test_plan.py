"""A run's plan is made once and read everywhere: `plan_run` applies `--resume`, `train.checkpoints.resume: auto` and `never`
to every state a run's folder can be in (the checkpoint it names is the one the resume point chose, and only what a
resume passes over is touched); the plan crosses a rank's command line unchanged, whatever it holds; a word that
is no plan is refused; and the train stage runs the plan its preflight made instead of planning again."""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flows.train
from flows.outputs import placement
from pipeline.config import config_from_dict
from pipeline.training_run.checkpoint import TornCheckpoints
from pipeline.training_run.folder import CHECKPOINTS, RUN_CONFIG, ConfigMismatch, mark_finished, training_identity
from pipeline.training_run.inputs import record_inputs, run_inputs
from pipeline.training_run.plan import RunPlan, plan_run
from pipeline.jsonl import write_problems
from tests.helpers.checkpoints import history_rows, write_checkpoints, write_history
from tests.train.toy_task import toy_problems

CHECKPOINTS_FOUND = ("none", "torn", "complete", "complete-and-torn")


def config(tmp_path: Path):
    return config_from_dict({"train": {"checkpoints": {"dir": str(tmp_path / "runs")}, "train_file": str(tmp_path / "t.jsonl"),
                                       "init_model": str(tmp_path / "model")}})


def make_folder(folder: Path, cfg, found: str, same_config: bool, finished: bool, same_inputs: bool) -> None:
    """A folder as an earlier attempt of `cfg`'s run (or of another config's) left it."""
    folder.mkdir(parents=True)
    if found.startswith("complete"):
        write_checkpoints(folder, (2,))
        write_history(folder, history_rows(3))
    if found in ("torn", "complete-and-torn"):
        (folder / CHECKPOINTS / "step-000003.tmp").mkdir(parents=True)  # a kill while saving
    identity = training_identity(cfg) | ({} if same_config else {"train.optimizer.lr": 0.5})
    (folder / RUN_CONFIG).write_text(json.dumps(identity))
    record_inputs(folder, run_inputs(cfg) | ({} if same_inputs else {"code": "changed"}))
    if finished:
        mark_finished(folder, 4)


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("found", "same_config", "finished", "same_inputs"),
                         list(itertools.product(CHECKPOINTS_FOUND, (True, False), (False, True), (True, False))))
def test_each_mode_plans_every_folder_state_by_its_rules(tmp_path: Path, capsys, found: str, same_config: bool,
                                                         finished: bool, same_inputs: bool) -> None:
    cfg = config(tmp_path)
    folder = tmp_path / "runs" / "exp"
    make_folder(folder, cfg, found, same_config, finished, same_inputs)
    before = listing(folder)
    complete = folder / CHECKPOINTS / "step-000002" if found.startswith("complete") else None

    never = plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics")
    assert (never.folder, never.mode, never.resume, never.start_from) == (folder, "never", False, None)
    assert never.identity == training_identity(cfg) and never.inputs == run_inputs(cfg)
    assert listing(folder) == before  # planning a fresh run touches nothing: the recipe takes the folder later

    auto = plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics", mode="auto")
    resumes = complete is not None and same_config and not finished and same_inputs
    assert (auto.resume, auto.start_from) == (resumes, complete if resumes else None), auto.reason
    assert listing(folder) == before and "\n" not in auto.reason

    if found != "none" and not same_config:
        with pytest.raises(ConfigMismatch, match="train.optimizer.lr: 0.5 in the checkpoints"):
            plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics", mode="insisted")
    elif found == "torn":
        with pytest.raises(TornCheckpoints, match=re.escape(str(folder / CHECKPOINTS / "step-000003.tmp"))):
            plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics", mode="insisted")
    else:  # --resume continues whatever the inputs and a finished run too; from step 0 in an empty folder
        insisted = plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics", mode="insisted")
        assert (insisted.resume, insisted.start_from) == (True, complete), insisted.reason
    assert listing(folder) == before
    said = capsys.readouterr().err  # each plan that resumes past the torn checkpoint says so (auto, --resume)
    assert said.count("--resume: skipping torn checkpoints") == (
        (resumes + same_config) if found == "complete-and-torn" else 0), said


def test_a_plan_passes_over_what_does_not_verify_once_and_names_the_checkpoint_left(tmp_path: Path) -> None:
    """The newest checkpoint is cut short: the plan starts from the one before, and the damaged one is set aside
    (so a rank, or any later reader, finds the plan's checkpoint the newest)."""
    cfg = config(tmp_path)
    folder = tmp_path / "runs" / "exp"
    folder.mkdir(parents=True)
    older, newer = write_checkpoints(folder, (2, 3))
    write_history(folder, history_rows(4))
    (folder / RUN_CONFIG).write_text(json.dumps(training_identity(cfg)))
    record_inputs(folder, run_inputs(cfg))
    weights = newer / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:50])
    for mode in ("auto", "insisted"):
        plan = plan_run(cfg, name="exp", metrics_dir=tmp_path / "metrics", mode=mode)
        assert plan.resume and plan.start_from == older
        assert sorted(p.name for p in (folder / CHECKPOINTS).iterdir()) == ["step-000002", "step-000003.rejected"]


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text()
                    | st.floats(allow_nan=False),  # a config holds no NaN (it would equal nothing, itself included)
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                    max_leaves=8)
PATHS = st.text(min_size=1).map(Path)
PLANS = st.builds(RunPlan, folder=PATHS, identity=st.dictionaries(st.text(), JSON, max_size=6),
                  inputs=st.dictionaries(st.text(), st.text(), max_size=4),
                  mode=st.sampled_from(["insisted", "auto", "never"]), resume=st.booleans(), reason=st.text(),
                  start_from=st.none() | PATHS)


@settings(max_examples=200, deadline=None)
@given(plan=PLANS)
def test_a_plan_crosses_a_command_line_unchanged(plan: RunPlan) -> None:
    word = plan.encoded()
    assert re.fullmatch(r"[A-Za-z0-9_=-]+", word)  # one word for any shell a launcher hands the ranks' arguments to
    assert RunPlan.decoded(word) == plan


def test_infinities_in_the_config_cross_too() -> None:
    plan = RunPlan(Path("runs/train/x"), {"a": math.inf, "b": -math.inf}, {}, "auto", False, "fresh", None)
    assert RunPlan.decoded(plan.encoded()).identity == {"a": math.inf, "b": -math.inf}


def _word(fields: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()


GOOD = json.loads(base64.urlsafe_b64decode(
    RunPlan(Path("r"), {"k": 1}, {"code": "c"}, "auto", True, "why", Path("r/c")).encoded()))


@pytest.mark.parametrize("word", [
    "", "not a plan", "%%%%", _word([]), _word("plan"), _word({k: v for k, v in GOOD.items() if k != "reason"}),
    _word(GOOD | {"extra": 1}), _word(GOOD | {"mode": "sometimes"}), _word(GOOD | {"resume": "yes"}),
    _word(GOOD | {"start_from": 3}), _word(GOOD | {"identity": [1]}), _word(GOOD | {"folder": None}),
])
def test_a_word_that_is_no_plan_is_refused(word: str) -> None:
    with pytest.raises(ValueError, match="^--plan: not a run plan"):
        RunPlan.decoded(word)


@settings(max_examples=100, deadline=None)
@given(plan=PLANS, data=st.data())
def test_a_cut_plan_is_refused_never_read_as_another(plan: RunPlan, data) -> None:
    word = plan.encoded()
    cut = data.draw(st.integers(0, len(word) - 1), label="kept")
    with pytest.raises(ValueError, match="^--plan: not a run plan"):
        RunPlan.decoded(word[:cut])


def test_the_stage_runs_the_plan_its_preflight_made(tmp_path: Path, monkeypatch) -> None:
    """Planning acts (it sets aside what a resume passes over) and prints its decision: the flow that follows its
    preflight runs that plan; a flow started alone (the pipeline's flow, a deployment) plans for itself."""
    made: list[RunPlan] = []

    def plan_run_once_more(cfg, **kwargs) -> RunPlan:
        made.append(RunPlan(Path(f"runs/{len(made)}"), {}, {}, kwargs["mode"], False, "fresh", None))
        return made[-1]

    monkeypatch.setattr(flows.train, "plan_run", plan_run_once_more)
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path)
    write_problems(tmp_path / "t.jsonl", toy_problems())
    Path("params.yaml").write_text(json.dumps(cfg.model_dump(mode="json")))
    flows.train.preflight("params.yaml", resume=True)
    key = ("params.yaml", True, None, None)
    place = placement("train", "params.yaml", label=None, out=None, ad_hoc=False)
    assert flows.train.flow_plan(cfg, place, key) is made[0] and made[0].mode == "insisted"
    assert flows.train.flow_plan(cfg, place, key) is made[1] and len(made) == 2  # a later flow plans anew
