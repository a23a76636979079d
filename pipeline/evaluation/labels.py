"""The name of each evaluated model in the tables, plots and comparison files.

The policy's name is read from the config that trained it (its initial model, algorithm, TEPO variant and
masking) rather than written by hand beside it, so that an experiment which changes how the policy is trained
(a preset, `dvc exp run -S ...`) cannot show up as another algorithm's row."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import RunConfig


def policy_label(cfg: RunConfig) -> str:
    """What the train stage made of its initial model, from the config that trained it (e.g. "SFT + DAPO + TEPO
    sparse"), so that a preset's table never names an algorithm other than the one its policy was trained with."""
    tc = cfg.train
    starts = {Path(cfg.sft.output_dir): "SFT", Path(cfg.sft.init_model): "base"}
    start = starts.get(Path(tc.init_model), Path(tc.init_model).name or tc.init_model)
    parts = [start, tc.algorithm.display_name, cfg.reward.tepo.display_name]
    return " + ".join(p for p in parts if p) + ("" if tc.update.mask_tool_output else ", tool output in the loss")


def run_label(cfg: RunConfig, model: str) -> str:
    """The model's row in the tables: evaluate.label when set; else what trained it (the train stage's output)
    or its folder's name; then the mode."""
    ec = cfg.evaluate
    if ec.label:
        return ec.label
    if Path(model) == Path(cfg.train.output_dir):
        name = policy_label(cfg)
    else:  # a registry URI (models:/tapo-policy/3) says more whole than its last part
        name = model if ":/" in model else Path(model).name or model
    return f"{name} ({'tools' if ec.mode == 'tools' else 'no tools'})"


def baseline_label(cfg: RunConfig, name: str) -> str:
    """The row of evaluate.baselines[name] (its own label, or named after its model as `run_label` names one)."""
    baseline = cfg.evaluate.baselines[name]
    as_baseline = cfg.evaluate.model_copy(update={"label": baseline.label})
    return run_label(cfg.model_copy(update={"evaluate": as_baseline}), baseline.model)


def compared_labels(cfg: RunConfig) -> tuple[str, str]:
    """(the SFT model's row, the policy's row) in the evaluate stage's comparison under `cfg`: the two models
    whose paired flips it reports."""
    return baseline_label(cfg, "sft"), run_label(cfg, cfg.evaluate.model)
