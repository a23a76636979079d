"""benchmarks.harness: `--quick` sets sizes without overriding what the command line says; a benchmark's config and a
service's params file are today's params.yaml plus overrides, refused when params.yaml no longer takes them; and the
config of a benchmark whose quick run needs an optional extra (trainer_vs_trl: TRL) is checked without it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from benchmarks import harness, trainer_vs_trl
from pipeline.config import ConfigError, load_config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", default=[16, 64])
    return p


@pytest.mark.parametrize(("argv", "steps", "sizes", "quick"), [
    ([], 5, [16, 64], False),
    (["--quick"], 1, [2], True),
    (["--quick", "--steps", "3"], 3, [2], True),  # the command line wins over the quick sizes
    (["--sizes", "8", "--quick"], 1, [8], True),
])
def test_quick_sets_the_sizes_the_command_line_leaves_open(argv: list[str], steps: int, sizes: list[int],
                                                            quick: bool) -> None:
    args = harness.parse(parser(), argv, {"steps": 1, "sizes": [2]})
    assert (args.steps, args.sizes, args.quick) == (steps, sizes, quick)


def test_quick_sizes_for_an_argument_the_benchmark_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match=r"\['stepz'\]"):
        harness.parse(parser(), [], {"stepz": 1})


def test_a_params_file_for_a_service_is_complete_and_checked_before_use(tmp_path: Path) -> None:
    path = harness.params_file(tmp_path / "params.yaml", {"search.index_dir": str(tmp_path / "index")})
    assert load_config(path).search.index_dir == str(tmp_path / "index")
    assert load_config(path).model_dump() | {"search": None} == \
        load_config(harness.PARAMS).model_dump() | {"search": None}  # the rest is params.yaml's
    with pytest.raises(ConfigError, match="index_dirr"):
        harness.params_file(tmp_path / "bad.yaml", {"search.index_dirr": "x"})
    # what rollout_overlap wrote before (a section alone) is refused by the loader a service reads it with
    (tmp_path / "partial.yaml").write_text(yaml.safe_dump({"search": {"index_dir": str(tmp_path / "index")}}))
    with pytest.raises(ConfigError, match="missing"):
        load_config(tmp_path / "partial.yaml")


def test_derive_refuses_overrides_today_s_params_do_not_take() -> None:
    assert harness.derive({"train.steps": 2}).train.steps == 2
    # trainer_vs_trl's overrides before: dynamic sampling off under params.yaml's anchored openings
    with pytest.raises(ConfigError, match="anchor_dropped_tokens"):
        harness.derive({"train.algorithm.dynamic_sampling": False})


def test_trainer_vs_trl_states_trls_whole_recipe_against_todays_params(tmp_path: Path) -> None:
    args = argparse.Namespace(model=str(tmp_path / "model"), steps=3, prompts=2, group=4, max_tokens=64, quick=False)
    cfg = trainer_vs_trl.ours_config(args, tmp_path / "train.jsonl", tmp_path)
    assert (cfg.train.algorithm.kind, cfg.train.algorithm.kl_coef, cfg.train.algorithm.dynamic_sampling) == \
        ("dapo", 0.0, False)
    assert (cfg.train.sampling.anchor_dropped_tokens, cfg.train.sampling.refill_dropped_groups, cfg.train.update.ppo_mini_batches) == (0, False, 1)
    assert (cfg.train.optimizer.lr_decay, cfg.train.update.autocast, cfg.model.dtype) == ("constant", "none", "float32")
    assert (cfg.train.update.micro_batch_size, cfg.rollout.group_size, cfg.rollout.max_batch_sequences) == (8, 4, 8)
