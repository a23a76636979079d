"""Load `params.yaml` into frozen, validated stage configs.

`load_config(path)` returns a `RunConfig` with one attribute per section. Errors name the
file and the dotted key (`params.yaml: train.optimizer.lr: Input should be greater than 0`), all of them at once.

Strict: numbers are read as YAML 1.2 reads them (`lr: 1e-6` is a float), then no string becomes a
number or a boolean (`steps: '4'` and `gradient_checkpointing: "yes"` are refused) and no float an
integer. Complete: a params file sets every key the config classes define, or is an override file
that names what fills its gaps (`extends:`); the rule is in `pipeline.config.params_file`.

Command line: `python -m pipeline.config check [PATH]` prints `ok` or the errors (exit 1), unsupported
combinations of settings from different sections included (`pipeline.config.combinations`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from pipeline.config.base import StageConfig
from pipeline.config.combinations import refusals
from pipeline.config.params_file import (CLASS_DEFAULTS, EXTENDS, ConfigError, ParamsLoader, missing_keys,
                                          read_params, resolve_extends)
from pipeline.config.train import MOVED_KEYS
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
    def _supported_combination(self) -> RunConfig:
        problems = refusals(self)  # settings of different sections that cannot run together (combinations.py)
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _format_errors(err: ValidationError, source: str) -> list[str]:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "extra_forbidden" and key in MOVED_KEYS:
            msg += f" (moved to {MOVED_KEYS[key]})"
        lines.append(f"{source}: {key}: {msg}")
    return lines


def _json_value(obj: Any) -> Any:
    """What `json.dumps` cannot write itself, as a params file would hold it (Python callers' overrides)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (Path, set, frozenset)):
        return str(obj) if isinstance(obj, Path) else sorted(obj)
    raise TypeError(f"{type(obj).__name__} is not a params value")


def _missing(data: dict[str, Any], source: str) -> list[str]:
    """One problem per key a complete params file leaves out."""
    return [f"{source}: {key}: missing (a complete params file sets every key; or start the file with "
            f"'{EXTENDS}: <params file>' or '{EXTENDS}: {CLASS_DEFAULTS}')" for key in missing_keys(RunConfig, data)]


def _validate(data: Any, source: str, *, missing: list[str]) -> RunConfig:
    """Strict validation (no string becomes a number or a boolean, no float an integer) of a parsed mapping,
    reported together with `missing` (the completeness problems of the file it came from)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping of sections, got {type(data).__name__}")
    problems = list(missing)
    try:
        # JSON mode: strict about scalars, yet a list still validates as a tuple and a string as a path
        cfg = RunConfig.model_validate_json(json.dumps(data, default=_json_value), strict=True)
    except (TypeError, ValueError) as err:
        if not isinstance(err, ValidationError):
            raise ConfigError(f"{source}: {err}") from None
        problems += _format_errors(err, source)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a partial params mapping over the config classes' defaults (Python callers, tests), as strictly
    as a file; raises ConfigError naming every bad key."""
    return _validate({} if data is None else data, source, missing=[])


def load_config(path: str | Path = DEFAULT_PARAMS, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read and validate a params file: complete, or an override file (`extends:`; see
    `pipeline.config.params_file`). `overrides` maps dotted keys to values (tests, CLIs), applied last: the
    file must be complete, the overrides need not be (what a replaced mapping leaves unset takes its default)."""
    path = Path(path)
    data, complete = resolve_extends(_read_mapping(path), path, _read_mapping)
    # completeness is the file's: an override's mapping (`train.algorithm: {kind: grpo}`) replaces the file's
    # and its unset keys take the class defaults, as for `config_from_dict`
    missing = _missing(data, str(path)) if complete and isinstance(data, dict) else []
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return _validate(data, str(path), missing=missing)


def _read_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: no such params file")
    try:
        data = read_params(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        raise ConfigError(f"{path}: empty params file (a complete one sets every section; an override file "
                          f"starts with '{EXTENDS}:')")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(data).__name__}")
    return data


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
