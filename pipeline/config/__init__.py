"""Load `params.yaml` into frozen, validated stage configs.

`load_config(path)` returns a `RunConfig` with one attribute per section. Errors name the
file and the dotted key (`params.yaml: train.lr: Input should be greater than 0`).

Command line: `python -m pipeline.config check [PATH]` prints `ok` or the errors (exit 1).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from pipeline.config.base import StageConfig
from pipeline.config.rollout import combination_errors
from pipeline.config.sections import (
    CurateConfig,
    DistributedConfig,
    EvaluateConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RunSection,
    SandboxConfig,
    SearchConfig,
    SFTConfig,
    TrainConfig,
)

DEFAULT_PARAMS = Path("params.yaml")


class ConfigError(ValueError):
    """A params file that cannot be used; the message lists every problem, one per line."""


class ParamsLoader(yaml.SafeLoader):
    """YAML 1.2 booleans (only true/false), as DVC reads and writes params files.

    `dvc exp run -S key=value` rewrites params.yaml with a YAML 1.2 dumper, which leaves
    `kind: off` unquoted; a YAML 1.1 reader would turn that into False and reject the file."""


ParamsLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ParamsLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))


def read_params(text: str) -> Any:
    """Parse a params file's text the way DVC does (see `ParamsLoader`)."""
    return yaml.load(text, Loader=ParamsLoader)  # noqa: S506 - a SafeLoader subclass


class RunConfig(StageConfig):
    """Every stage's config, one section each, as in params.yaml."""

    run: RunSection = Field(default_factory=RunSection, description="Seed, tracking and output locations shared by all stages.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The base policy model.")
    curate: CurateConfig = Field(default_factory=CurateConfig, description="Dataset curation.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Code-interpreter service.")
    search: SearchConfig = Field(default_factory=SearchConfig, description="Search service and cache.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Tool-augmented rollouts.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rule-based rewards.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Cold-start supervised fine-tuning.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="RL training.")
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig, description="Benchmark evaluation.")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig, description="Multi-process training.")

    @model_validator(mode="after")
    def _autocast_over_float32(self) -> RunConfig:
        if self.train.autocast != "none" and self.model.dtype != "float32":
            raise ValueError(f"train.autocast {self.train.autocast} needs model.dtype float32 (got {self.model.dtype}): "
                             "mixed precision keeps float32 weights and optimiser state and casts only the forward")
        return self

    @model_validator(mode="after")
    def _rollout_backend_supplies_what_the_run_reads(self) -> RunConfig:
        errors = combination_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"{source}: {key}: {msg}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a parsed params mapping; raises ConfigError naming every bad key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def load_config(path: str | Path = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read and validate a params file. `overrides` maps dotted keys to values (tests, CLIs)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    try:
        data = read_params(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return config_from_dict(data, str(path))


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


__all__ = [
    "ConfigError",
    "ParamsLoader",
    "read_params",
    "RunConfig",
    "StageConfig",
    "config_from_dict",
    "load_config",
    "DEFAULT_PARAMS",
]
