"""Bad params are refused, naming the file and the key, before any stage does work.

Faults as an operator meets them: a value quoted by hand (`steps: '4'`), a number written the way
people and DVC write it (`lr: 1e-6`), a key or a whole section deleted, an empty file. Each class is
tested over every key params.yaml has (the list is derived from the file, so keys added later are
covered), through `load_config` and the `python -m pipeline.config check` command line.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dvc.utils.hydra import apply_overrides
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import ConfigError, load_config, read_params
from pipeline.config.sections import TrainConfig
from pipeline.paths import REPO_ROOT

PARAMS = REPO_ROOT / "params.yaml"
FULL = read_params(PARAMS.read_text())


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) for every scalar and list in a parsed params mapping."""
    for key, value in node.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def keys_of(node: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every dotted key of a mapping, inner mappings included (`reward.routing.*` and the named
    `evaluate.baselines.*` records are entries, not config keys)."""
    for key, value in node.items():
        yield prefix + key
        if isinstance(value, dict) and prefix + key not in ("reward.routing", "reward.type_routing",
                                                                 "evaluate.baselines"):
            yield from keys_of(value, f"{prefix}{key}.")


def with_value(dotted: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(FULL)
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    node[leaf] = value
    return data


def without(dotted: str) -> dict[str, Any]:
    data = copy.deepcopy(FULL)
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node[key]
    del node[leaf]
    return data


def write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def named(key: str) -> str:
    """A pattern for `key` in an error: pydantic puts a union member's tag after the union's key
    (`train.algorithm.dapo.eps_low`)."""
    return r"(?:\.[\w-]+)?\.".join(map(re.escape, key.split(".")))


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


SCALARS = [(k, v) for k, v in leaves(FULL) if type(v) in (int, float, bool)]


@pytest.mark.parametrize(("key", "value"), SCALARS, ids=[k for k, _ in SCALARS])
def test_a_number_or_boolean_written_as_a_string_is_refused_naming_the_key(tmp_path: Path, key: str,
                                                                           value: Any) -> None:
    text = str(value).lower() if isinstance(value, bool) else repr(value)
    quoted = yaml.safe_dump(with_value(key, "VALUE_HERE"), sort_keys=False).replace("VALUE_HERE", f"'{text}'")
    message = refused(write(tmp_path, quoted))
    assert re.search(f"{re.escape(str(tmp_path / 'params.yaml'))}: {named(key)}: Input should be ", message)


@pytest.mark.parametrize("text", ["yes", "on", "1", "True "])
def test_booleans_are_only_true_and_false(tmp_path: Path, text: str) -> None:
    assert "train.update.gradient_checkpointing" in refused(write(tmp_path, with_value("train.update.gradient_checkpointing", text)))


INTEGERS = [k for k, v in SCALARS if type(v) is int]


@pytest.mark.parametrize("key", INTEGERS)
def test_a_float_is_not_an_integer(tmp_path: Path, key: str) -> None:
    assert re.search(f": {named(key)}: ", refused(write(tmp_path, with_value(key, dict(leaves(FULL))[key] + 0.5))))


ALL_KEYS = list(keys_of(FULL))


@pytest.mark.parametrize("key", ALL_KEYS)
def test_a_missing_key_or_section_is_refused_naming_it(tmp_path: Path, key: str) -> None:
    message = refused(write(tmp_path, without(key)))
    assert f"{tmp_path / 'params.yaml'}: {key}: missing" in message


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_an_empty_params_file_is_refused(tmp_path: Path, text: str) -> None:
    assert "empty params file" in refused(write(tmp_path, text))


def test_a_non_utf8_params_file_is_refused_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_bytes(PARAMS.read_bytes().replace(b"experiment: tapo", b"experiment: tap\xe9"))
    assert f"{path}: not UTF-8 text" in refused(path)


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=1e-12, max_value=0.99, allow_nan=False, allow_infinity=False))
def test_floats_read_as_yaml_1_2_reads_them(lr: float) -> None:
    """However a writer spells the number (`1e-06` with no dot, as DVC's dumper does), it is that float."""
    for spelling in (repr(lr), f"{lr:e}", f"{lr:E}", f"{round(lr * 1e12)}e-12"):
        assert read_params(f"lr: {spelling}\n") == {"lr": float(spelling)}, spelling


@pytest.mark.parametrize(("text", "value"), [("010", 10), ("0o17", 15), ("0x1f", 31), ("-3", -3), ("1_000", "1_000"),
                                             ("1:30", "1:30"), ("2024-01-02", "2024-01-02"), (".inf", float("inf")),
                                             ("off", "off"), ("yes", "yes"), ("1e3", 1000.0), ("+.5", 0.5)])
def test_scalars_follow_the_yaml_1_2_core_schema(text: str, value: Any) -> None:
    assert read_params(f"v: {text}\n") == {"v": value}


def test_dvc_exp_run_set_param_with_an_exponent_loads_as_a_float(tmp_path: Path) -> None:
    rewritten = tmp_path / "params.yaml"
    rewritten.write_text(PARAMS.read_text())
    apply_overrides(rewritten, ["train.optimizer.lr=1e-6", "train.steps=5"])  # what `dvc exp run -S` writes
    assert "lr: 1e-06" in rewritten.read_text()  # no dot: a string to YAML 1.1
    cfg = load_config(rewritten)
    assert (cfg.train.optimizer.lr, cfg.train.steps) == (1e-6, 5)


def test_check_reports_every_problem_with_its_key(tmp_path: Path) -> None:
    data = without("train.optimizer.warmup_steps")
    del data["sandbox"]
    data["train"] |= {"steps": "4", "stepz": 3}
    data["train"]["optimizer"]["lr"] = "LR_HERE"
    data["train"]["update"]["gradient_checkpointing"] = "yes"
    data["rollout"]["group_size"] = 0
    text = yaml.safe_dump(data, sort_keys=False).replace("LR_HERE", '"1e-6"')  # quoted: a string in any YAML
    res = subprocess.run([sys.executable, "-m", "pipeline.config", "check", str(write(tmp_path, text))],
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert res.returncode == 1 and res.stdout == ""
    for key in ("train.optimizer.warmup_steps: missing", "sandbox: missing", "train.steps", "train.optimizer.lr",
                "train.update.gradient_checkpointing", "train.stepz: unknown key", "rollout.group_size"):
        assert f"params.yaml: {key}" in res.stderr, key


def test_override_files_say_what_fills_their_gaps(tmp_path: Path) -> None:
    base = write(tmp_path, with_value("train.steps", 9))
    (tmp_path / "sub").mkdir()
    over = tmp_path / "sub" / "exp.yaml"
    over.write_text("extends: ../params.yaml\ntrain:\n  optimizer:\n    lr: 3e-6\n")
    cfg = load_config(over)
    assert (cfg.train.steps, cfg.train.optimizer.lr, cfg.model.path) == (9, 3e-6, FULL["model"]["path"])
    over.write_text("extends: defaults\ntrain:\n  optimizer:\n    lr: 3e-6\n")
    assert load_config(over).train.steps == TrainConfig().steps
    over.write_text("extends: ../params.yaml\ntrain:\n  steps: '4'\n")
    assert f"{over}: train.steps: Input should be a valid integer" in refused(over)
    over.write_text("extends: nowhere.yaml\n")
    assert "nowhere.yaml: no such params file" in refused(over)
    base.write_text("extends: sub/exp.yaml\n")
    over.write_text("extends: ../params.yaml\n")
    assert "extends itself" in refused(over)
    over.write_text("train:\n  optimizer:\n    lr: 3e-6\n")  # neither complete nor an override file
    assert f"{over}: run: missing" in refused(over)


def test_configs_built_in_python_are_as_strict() -> None:
    for bad in ({"steps": "4"}, {"optimizer": {"lr": "1e-6"}}, {"update": {"gradient_checkpointing": "yes"}}, {"steps": 4.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            TrainConfig(**bad)


@pytest.mark.parametrize("key", [k for k, _ in SCALARS][::4])
def test_a_key_written_twice_is_refused_naming_it_and_both_lines(tmp_path: Path, key: str) -> None:
    """PyYAML lets the second of two equal keys win silently; an operator who appends `steps: 8` below the
    existing `steps: 4` must hear about it."""
    *parents, leaf = key.split(".")
    lines = yaml.safe_dump(FULL, sort_keys=False).splitlines()
    own = f"{'  ' * len(parents)}{leaf}: "
    at = next(i for i, text in enumerate(lines) if text.startswith(own))
    lines.insert(at + 1, lines[at])
    message = refused(write(tmp_path, "\n".join(lines) + "\n"))
    assert f"key '{leaf}' appears twice (lines {at + 1} and {at + 2})" in message
