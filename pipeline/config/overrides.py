"""A params preset as DVC experiment overrides: every leaf a preset file changes, in the Hydra syntax of
`dvc exp run -S key=value`.

A preset (`configs/experiments/*.yaml`) is an override file (`extends: ../../params.yaml`). Applied with
`dvc exp run -S ...` rather than by copying it over params.yaml, the experiment records exactly which params it
changed (`dvc exp show`, `dvc params diff`) and runs only the stages that read them. Values are written as
Hydra reads them (DVC parses `-S` with Hydra's override grammar): strings single-quoted, lists `[...]`,
mappings `{key: value}`, so a list of sources or a nested section goes in one override. A key the preset
adds (another variant's fields, a new named entry) goes in as `+key=value` and one it drops as `~key`.
"""

from __future__ import annotations

import re
from typing import Any

from pipeline.config import RunConfig


def leaf_overrides(base: Any, preset: Any, prefix: str = "") -> list[str]:
    """The overrides that turn mapping `base` into `preset`, a leaf at a time (lists are leaves).

    A key the preset adds is appended (`+key=value`: a variant with other fields, a new named entry) and a key
    it lacks is deleted (`~key`), since Hydra refuses to set a key the file does not have and keeps one the
    preset dropped."""
    if not (isinstance(base, dict) and isinstance(preset, dict)):
        return [] if base == preset else [f"{prefix.removesuffix('.')}={hydra_value(preset)}"]
    out = [f"~{prefix}{key}" for key in base if key not in preset]
    for key, value in preset.items():
        if key not in base:
            out.append(f"+{prefix}{key}={hydra_value(value)}")
        else:
            out += leaf_overrides(base[key], value, f"{prefix}{key}.")
    return out


def hydra_value(value: Any) -> str:
    """`value` in Hydra's override grammar."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if "${" in value:  # OmegaConf would resolve it as an interpolation when DVC applies the override
            raise ValueError(f"{value!r}: a params value holding '${{' cannot go through dvc exp run -S")
        # Hydra's quoted strings: a backslash is literal unless it runs into a quote or the closing quote, so
        # those runs are doubled and each quote escaped
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a Hydra override")


def experiment_overrides(base: RunConfig, preset: RunConfig) -> list[str]:
    """The overrides that turn `base` into `preset`, in key order."""
    changed = leaf_overrides(base.model_dump(mode="json"), preset.model_dump(mode="json"))
    return sorted(changed, key=lambda line: line.lstrip("+~"))
