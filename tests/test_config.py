"""params.yaml loads into frozen configs; bad keys, types and ranges name the key and the file (the strict
and completeness rules in depth: tests/faults/test_params.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import yaml

from pipeline.config import ConfigError, RunConfig, load_config


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_default_params_load(repo_root: Path) -> None:
    cfg = load_config(repo_root / "params.yaml")
    assert cfg.model.path == "smollm2-135m-instruct"
    assert cfg.train.algorithm.kind == "dapo"


def test_config_is_frozen(repo_root: Path) -> None:
    cfg = load_config(repo_root / "params.yaml")
    with pytest.raises(pydantic.ValidationError):
        cfg.train.optimizer.lr = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train:\n  stepz: 3\n", "train.stepz: unknown key"),
        ("train:\n  optimizer:\n    lr: fast\n", "train.optimizer.lr"),
        ("train:\n  optimizer:\n    lr: -1.0\n", "train.optimizer.lr"),
        ("rollout:\n  group_size: 0\n", "rollout.group_size"),
        ("bogus_section: {}\n", "bogus_section: unknown key"),
        ("train:\n  algorithm:\n    kind: ppo\n", "train.algorithm"),
        ("rollout:\n  max_policy_tokens: 4096\n  max_total_tokens: 1024\n", "rollout"),
        ("model:\n  device: gpu0\n", "model.device"),
        ("train:\n  algorithm:\n    kind: grpo\n    kl_coef: -0.1\n", "train.algorithm.grpo.kl_coef"),
    ],
)
def test_bad_values_name_key_and_file(tmp_path: Path, text: str, needle: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such params file"):
        load_config(tmp_path / "nope.yaml")


def test_params_yaml_mirrors_every_field(repo_root: Path) -> None:
    """Every config field appears in params.yaml, so the file documents the whole run."""
    data = yaml.safe_load((repo_root / "params.yaml").read_text())
    cfg = load_config(repo_root / "params.yaml")
    dumped = cfg.model_dump()
    assert set(dumped) == set(data)
    for section, fields in dumped.items():
        assert set(fields) == set(data[section]), section


def test_cli_check(repo_root: Path, tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "pipeline.config", "check", str(repo_root / "params.yaml")],
                        capture_output=True, text=True, cwd=repo_root)
    assert ok.returncode == 0 and ok.stdout.strip() == "ok"
    bad = _write(tmp_path, (repo_root / "params.yaml").read_text().replace("  steps:", "  stepz:"))
    res = subprocess.run([sys.executable, "-m", "pipeline.config", "check", str(bad)],
                         capture_output=True, text=True, cwd=repo_root)
    assert res.returncode == 1
    assert "train.stepz" in res.stderr


def test_params_yaml_is_complete_at_every_depth(repo_root: Path) -> None:
    """The completeness rule comes from the config classes: a key added to any of them (nested settings and the
    chosen variants included) must be added to params.yaml, or every stage refuses the file."""
    from pipeline.config import RunConfig, read_params
    from pipeline.config.params_file import missing_keys

    assert missing_keys(RunConfig, read_params((repo_root / "params.yaml").read_text())) == []
    assert "train.algorithm.eps_high" in missing_keys(RunConfig, {"train": {"algorithm": {"kind": "dapo"}}})
    assert "train.algorithm.eps" in missing_keys(RunConfig, {"train": {"algorithm": {"kind": "grpo"}}})
    assert "train.finetune.r" in missing_keys(RunConfig, {"train": {"finetune": {"kind": "lora"}}})


def test_the_rollout_backend_is_a_typed_choice_no_module_compares_by_name(repo_root: Path) -> None:
    """What a run needs of its backend is read from `rollout.generation` (`GenerationBackend`), said once in
    pipeline/config/rollout.py; a module that compared `rollout.backend` with a name would escape that."""
    from typing import get_args

    from pipeline.config.rollout import BACKENDS, RolloutConfig

    assert set(BACKENDS) == set(get_args(RolloutConfig.model_fields["backend"].annotation))
    assert all(RolloutConfig(backend=name).generation.name == name for name in BACKENDS)  # type: ignore[arg-type]
    compared = re.compile(r"\.backend\s*(==|!=|\bin\b|\bnot in\b)")
    offenders = [f"{path}:{n}" for folder in ("pipeline", "flows", "sandbox")
                 for path in sorted((repo_root / folder).rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if compared.search(line)]
    assert not offenders, offenders


def test_a_key_of_the_flat_train_section_is_refused_naming_where_it_moved(tmp_path: Path) -> None:
    from pipeline.config.train import MOVED_KEYS

    assert len(MOVED_KEYS) == 27  # every key train had besides algorithm, finetune, init_model, train_file, steps, output_dir
    for old, new in MOVED_KEYS.items():  # each target is a key of today's schema, and no old key still is one
        section, _, leaf = new.removeprefix("train.").partition(".")
        assert leaf in type(getattr(RunConfig().train, section)).model_fields, new
        assert old.removeprefix("train.") not in type(RunConfig().train).model_fields, old
    path = tmp_path / "old.yaml"
    path.write_text("extends: defaults\ntrain:\n  lr: 3e-6\n  checkpoint_every: 2\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert f"{path}: train.lr: unknown key (moved to train.optimizer.lr)" in str(refused.value)
    assert f"{path}: train.checkpoint_every: unknown key (moved to train.checkpoints.every)" in str(refused.value)
