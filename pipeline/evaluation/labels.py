"""The name of each evaluated model in the tables, plots and comparison files.

The policy's name is read from the config that trained it (its initial model, algorithm, TEPO variant and
masking) rather than written by hand beside it, so that an experiment which changes how the policy is trained
(a preset, `dvc exp run -S ...`) cannot show up as another algorithm's row."""

from __future__ import annotations

from pathlib import Path

from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.reward import TepoConfig
from pipeline.config.sft import SFTConfig
from pipeline.config.train import TrainConfig


def policy_label(train: TrainConfig, sft: SFTConfig, tepo: TepoConfig) -> str:
    """What the train stage made of its initial model, from the config that trained it (e.g. "SFT + DAPO + TEPO
    sparse"): train.init_model named by the sft section's input or output, the algorithm, reward.tepo and
    train.update.mask_tool_output. So a preset's table never names an algorithm other than the one its policy was
    trained with."""
    starts = {Path(sft.output_dir): "SFT", Path(sft.init_model): "base"}
    start = starts.get(Path(train.init_model), Path(train.init_model).name or train.init_model)
    parts = [start, train.algorithm.display_name, tepo.display_name]
    return " + ".join(p for p in parts if p) + ("" if train.update.mask_tool_output else ", tool output in the loss")


def run_label(model: str, ec: EvaluateConfig, train: TrainConfig, sft: SFTConfig, tepo: TepoConfig) -> str:
    """The model's row in the tables: evaluate.label when set; else what trained it (`policy_label`, when `model` is
    train.output_dir) or its folder's name; then evaluate.mode."""
    if ec.label:
        return ec.label
    if Path(model) == Path(train.output_dir):
        name = policy_label(train, sft, tepo)
    else:  # a registry URI (models:/tapo-policy/3) says more whole than its last part
        name = model if ":/" in model else Path(model).name or model
    return f"{name} ({'tools' if ec.mode == 'tools' else 'no tools'})"


def baseline_label(name: str, ec: EvaluateConfig, train: TrainConfig, sft: SFTConfig, tepo: TepoConfig) -> str:
    """The row of evaluate.baselines[name] (its own label, or named after its model as `run_label` names one)."""
    baseline = ec.baselines[name]
    return run_label(baseline.model, ec.model_copy(update={"label": baseline.label}), train, sft, tepo)


def compared_labels(ec: EvaluateConfig, train: TrainConfig, sft: SFTConfig, tepo: TepoConfig) -> tuple[str, str]:
    """(the SFT model's row, the policy's row) in the evaluate stage's comparison: the two models whose paired flips
    it reports (evaluate.baselines.sft and evaluate.model)."""
    return baseline_label("sft", ec, train, sft, tepo), run_label(ec.model, ec, train, sft, tepo)
