"""Reading params files: YAML 1.2 scalars, `extends:` override files, and the completeness rule.

The rule for missing sections and keys (what `load_config` and `python -m pipeline.config check` enforce):

- A params file is **complete**: every section of `RunConfig`, every key of every section, and every key of
  each nested settings mapping (`curate.filters`, `rollout.vllm`, `train.algorithm` for its `kind`, ...).
  `params.yaml`, the file the stages and DVC read, is such a file. What "every key" means is derived from
  the config classes, so a key added to a class is required in params.yaml from then on. Entries of lists
  (`curate.sources`, `evaluate.benchmarks`, `curate.multi_llm.judges`) and of named mappings
  (`evaluate.baselines`) are records whose optional fields keep their defaults (`- {name: gsm8k}`), and
  free-form mappings (`reward.routing`) hold what they hold.
- Or it is an **override file**, which says what fills its gaps with a top-level `extends:`:
  `extends: ../params.yaml` (a path relative to the override file, or absolute) merges the override over
  that file, which is read by the same rule (complete, or extending another); `extends: defaults` merges it
  over the config classes' own defaults. Mappings merge key by key; a list or a scalar replaces.
  `configs/*.yaml` and the small files tests write are override files.
- An empty file (or one holding only comments) is refused: it is neither.
"""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

EXTENDS = "extends"
CLASS_DEFAULTS = "defaults"  # `extends: defaults`: the gaps take the config classes' defaults


class ConfigError(ValueError):
    """A params file that cannot be used; the message lists every problem, one per line."""


class ParamsLoader(yaml.SafeLoader):
    """YAML 1.2 core schema scalars, as DVC (ruamel) reads and writes params files.

    `dvc exp run -S key=value` rewrites params.yaml with a YAML 1.2 dumper. PyYAML's 1.1 resolver would read
    its `kind: off` as False, `lr: 1e-06` (no dot) as a string, `010` as 8 and `1:30` as 90; YAML 1.2 reads
    a string, a float, 10 and a string. Only true/false are booleans, and dates stay strings."""


_REPLACED = {"tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
             "tag:yaml.org,2002:timestamp"}
ParamsLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ParamsLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
ParamsLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_12, list("-+0123456789"))
ParamsLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+.0123456789"))


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # `010` is ten in YAML 1.2 (PyYAML's 1.1 constructor reads octal)


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith("inf"):
        return -math.inf if text.startswith("-") else math.inf
    return math.nan if text == ".nan" else float(text)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A mapping whose keys are unique: a key written twice (PyYAML lets the second silently win) is an error.
    Keys a `<<` merge brings in may be overridden: that is what merging is for."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice (lines {seen[key]} "
                                                    f"and {line}): the second would silently win", key_node.start_mark)
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=True)


ParamsLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
ParamsLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
ParamsLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def read_params(text: str) -> Any:
    """Parse a params file's text the way DVC does (see `ParamsLoader`)."""
    return yaml.load(text, Loader=ParamsLoader)  # noqa: S506 - a SafeLoader subclass


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _model_for(field: FieldInfo, value: dict[str, Any]) -> type[BaseModel] | None:
    """The config class a mapping under `field` is validated as (the member its `kind` picks, for a union)."""
    annotation = _unwrap(field.annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    members = [m for m in map(_unwrap, typing.get_args(annotation)) if isinstance(m, type) and issubclass(m, BaseModel)]
    discriminator = field.discriminator if isinstance(field.discriminator, str) else None
    for member in members:
        tag = member.model_fields.get(discriminator) if discriminator else None
        if tag is None and len(members) == 1:
            return member
        if tag is not None and discriminator and value.get(discriminator) in typing.get_args(_unwrap(tag.annotation)):
            return member
    return None


def missing_keys(model: type[BaseModel], data: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys `model` defines that `data` lacks (recursively through nested config mappings)."""
    missing = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in data:
            missing.append(prefix + key)
            continue
        value = data[key]
        if isinstance(value, dict) and isinstance(field.discriminator, str) and field.discriminator not in value:
            missing.append(f"{prefix}{key}.{field.discriminator}")  # the variant a union's mapping is
            continue
        sub = _model_for(field, value) if isinstance(value, dict) else None
        if sub is not None:
            missing += missing_keys(sub, value, f"{prefix}{key}.")
    return missing


def resolve_extends(data: dict[str, Any], path: Path, read: typing.Callable[[Path], dict[str, Any]],
                    seen: tuple[Path, ...] = ()) -> tuple[dict[str, Any], bool]:
    """(`data` merged over what its `extends:` names, whether the result must be complete on its own).

    `read` reads another params file into a mapping (it must raise on a missing or empty file)."""
    if EXTENDS not in data:
        return data, True
    target, rest = data[EXTENDS], {k: v for k, v in data.items() if k != EXTENDS}
    if target == CLASS_DEFAULTS:
        return rest, False
    if not isinstance(target, str) or not target:
        raise ConfigError(f"{path}: {EXTENDS}: must be a params file's path or '{CLASS_DEFAULTS}', got {target!r}")
    base_path = (path.parent / target).resolve()
    if base_path in seen:
        raise ConfigError(f"{path}: {EXTENDS}: {target} extends itself (through {', '.join(map(str, seen))})")
    base, complete = resolve_extends(read(base_path), base_path, read, (*seen, path.resolve()))
    return merge(base, rest), complete
