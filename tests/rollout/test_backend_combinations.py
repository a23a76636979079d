"""What a rollout backend cannot supply is refused at config check, naming every key involved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, config_from_dict
from pipeline.config.rollout import vllm_logprobs_mode


def check(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "pipeline.config", "check", str(params)], capture_output=True,
                          text=True, check=False)


@pytest.mark.parametrize("tepo", ["sparse", "dense"])
def test_tepo_with_a_backend_without_entropies_is_refused_naming_both_keys(tmp_path: Path, tepo: str) -> None:
    done = check(tmp_path, {"rollout": {"backend": "vllm"}, "reward": {"tepo": {"kind": tepo}}})
    assert done.returncode == 1
    assert "reward.tepo" in done.stdout + done.stderr and "rollout.backend" in done.stdout + done.stderr


@pytest.mark.parametrize("tepo", ["off", "sparse", "dense"])
def test_tepo_with_the_hf_backend_is_accepted(tepo: str) -> None:
    config_from_dict({"rollout": {"backend": "hf"}, "reward": {"tepo": {"kind": tepo}}})


@pytest.mark.parametrize(("temperature", "top_p", "source", "refused"), [
    (0.7, 0.9, "rollout", True), (1.3, 0.5, "rollout", True),
    (0.7, 0.9, "recompute", False), (1.0, 0.9, "rollout", False), (0.0, 0.9, "rollout", False),
    (0.7, 1.0, "rollout", False)])
def test_a_nucleus_without_untruncated_logprobs_is_refused_with_rollout_logprobs(
        temperature: float, top_p: float, source: str, refused: bool) -> None:
    data = {"rollout": {"backend": "vllm", "temperature": temperature, "top_p": top_p},
            "train": {"update": {"logprobs_source": source}}}
    if not refused:
        config_from_dict(data)
        return
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    for key in ("rollout.backend", "rollout.top_p", "rollout.temperature", "train.update.logprobs_source"):
        assert key in str(err.value)


def test_the_hf_backend_takes_any_nucleus() -> None:
    config_from_dict({"rollout": {"backend": "hf", "temperature": 0.7, "top_p": 0.5}})


@pytest.mark.parametrize(("temperature", "top_p", "mode"), [
    (1.0, 1.0, "processed_logprobs"), (0.6, 1.0, "processed_logprobs"), (1.0, 0.9, "raw_logprobs"),
    (0.0, 0.9, "raw_logprobs"), (0.6, 0.9, None)])
def test_the_vllm_logprobs_mode_is_untruncated_or_none(temperature: float, top_p: float, mode: str | None) -> None:
    assert vllm_logprobs_mode(temperature, top_p) == mode
