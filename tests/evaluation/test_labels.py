"""Each evaluated model's row is named after what it is: the policy after the config that trained it, so that an
experiment that trains differently (a preset, `dvc exp run -S`) never shows up under another algorithm's name; a
model given by hand after its folder, not after the params' policy."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from flows.evaluate import with_overrides
from flows.outputs import placement
from pipeline.config import RunConfig, config_from_dict, load_config
from pipeline.evaluation.labels import baseline_label, compared_labels, policy_label, run_label
from pipeline.paths import REPO_ROOT

ALGORITHMS = {"dapo": "DAPO", "grpo": "GRPO", "dr_grpo": "Dr.GRPO"}
TEPO = {"off": "", "sparse": "TEPO sparse", "dense": "TEPO dense"}
STARTS = {"models/sft": "SFT", "models/base": "base", "runs/other/step4/": "step4"}
TRAINING = list(itertools.product(ALGORITHMS, TEPO, (True, False), STARTS))


def trained(algorithm: str, tepo: str, masked: bool, start: str, label: str = "") -> RunConfig:
    return config_from_dict({"train": {"algorithm": {"kind": algorithm}, "init_model": start,
                                       "update": {"mask_tool_output": masked, "logprobs_source": "recompute"}},
                             "reward": {"tepo": {"kind": tepo}}, "evaluate": {"label": label}})


def row_of(cfg: RunConfig, model: str) -> str:
    """`model`'s row under `cfg`, from the sections the evaluate stage passes (evaluate, train, sft, reward.tepo)."""
    return run_label(model, cfg.evaluate, cfg.train, cfg.sft, cfg.reward.tepo)


@pytest.mark.parametrize(("algorithm", "tepo", "masked", "start"), TRAINING)
def test_the_policys_row_says_how_it_was_trained(algorithm: str, tepo: str, masked: bool, start: str) -> None:
    cfg = trained(algorithm, tepo, masked, start)
    expected = " + ".join(p for p in (STARTS[start], ALGORITHMS[algorithm], TEPO[tepo]) if p)
    expected += "" if masked else ", tool output in the loss"
    assert policy_label(cfg.train, cfg.sft, cfg.reward.tepo) == expected
    assert row_of(cfg, cfg.train.output_dir) == row_of(cfg, "./models/policy/") == f"{expected} (tools)"


def test_every_way_of_training_has_a_row_of_its_own() -> None:
    labels = {row_of(cfg := trained(*t), cfg.evaluate.model) for t in TRAINING}
    assert len(labels) == len(TRAINING)


def test_a_label_set_by_hand_wins_and_other_models_are_named_after_their_folder() -> None:
    cfg = trained("grpo", "dense", True, "models/sft", label="mine")
    assert row_of(cfg, cfg.evaluate.model) == row_of(cfg, "models/other") == "mine"
    cfg = trained("grpo", "dense", True, "models/sft")
    assert row_of(cfg, "runs/train/step8/") == "step8 (tools)"
    assert row_of(cfg, "models:/tapo-policy/3") == "models:/tapo-policy/3 (tools)"
    no_tools = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"mode": "no_tools"})})
    assert row_of(no_tools, "models/policy") == "SFT + GRPO + TEPO dense (no tools)"


def test_the_baselines_keep_their_labels_and_one_without_is_named_after_its_model() -> None:
    cfg = load_config(REPO_ROOT / "params.yaml")
    trained_by = (cfg.train, cfg.sft, cfg.reward.tepo)
    rows = (baseline_label("base", cfg.evaluate, *trained_by), baseline_label("sft", cfg.evaluate, *trained_by))
    assert rows == ("base (tools)", "SFT (tools)")
    unnamed = config_from_dict({"evaluate": {"baselines": {"sft": {"model": "models/sft", "output_dir": "m/s"}}}})
    assert baseline_label("sft", unnamed.evaluate, unnamed.train, unnamed.sft, unnamed.reward.tepo) == "sft (tools)"


PRESETS = sorted((REPO_ROOT / "configs" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_a_preset_that_trains_otherwise_than_the_main_job_has_another_policy_row(preset: Path) -> None:
    main, arm = load_config(REPO_ROOT / "params.yaml"), load_config(preset)
    trains_otherwise = (main.train.algorithm.kind, main.reward.tepo.kind, main.train.update.mask_tool_output,
                        main.train.init_model) != (arm.train.algorithm.kind, arm.reward.tepo.kind,
                                                   arm.train.update.mask_tool_output, arm.train.init_model)
    main_rows, arm_rows = (compared_labels(c.evaluate, c.train, c.sft, c.reward.tepo) for c in (main, arm))
    assert main_rows[0] == arm_rows[0] == "SFT (tools)"
    assert (main_rows[1] != arm_rows[1]) == trains_otherwise
    assert main_rows[1] == "SFT + DAPO (tools)"


@pytest.mark.parametrize(("label", "model", "row"), [
    (None, None, "SFT + DAPO (tools)"),  # the DVC stage: the policy
    ("mine", None, "mine"),
    (None, "runs/train/step2", "step2 (tools)"),  # not the params' name for the policy
    ("mine", "runs/train/step2", "mine"),
    (None, "models/policy", "SFT + DAPO (tools)"),
])
def test_the_evaluate_flow_names_a_model_given_by_hand_after_itself(monkeypatch: pytest.MonkeyPatch, label: str | None,
                                                                     model: str | None, row: str) -> None:
    monkeypatch.chdir(REPO_ROOT)
    cfg = load_config("params.yaml")
    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"label": "SFT + DAPO (tools)"})})
    place = placement("evaluate", "params.yaml", label=label or model, out=None, ad_hoc=model is not None)
    configured = with_overrides(cfg, label, place, model)
    assert row_of(configured, model or configured.evaluate.model) == row
