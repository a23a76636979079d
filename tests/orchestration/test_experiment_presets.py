"""A params preset becomes DVC experiment overrides that give exactly the preset's config.

Checked with DVC's own override code (`dvc.utils.hydra.apply_overrides`, what `dvc exp run -S` runs) on a copy
of params.yaml, for every preset under configs/experiments, and for any value through Hydra's parser."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml
from dvc.utils.hydra import apply_overrides
from hydra.core.override_parser.overrides_parser import OverridesParser
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.experiment import commands
from pipeline.config import load_config
from pipeline.config.overrides import experiment_overrides, hydra_value

PRESETS = sorted((Path(__file__).resolve().parents[2] / "configs" / "experiments").glob("*.yaml"))

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9),
                    st.floats(allow_nan=False, allow_infinity=False, width=32),
                    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20).filter(lambda t: "${" not in t))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), inner,
                                                 max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(values)
def test_hydra_reads_back_every_value_as_written(value) -> None:
    (parsed,) = OverridesParser.create().parse_overrides([f"key={hydra_value(value)}"])
    assert parsed.value() == value


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_dvcs_own_override_code_turns_params_yaml_into_the_preset(preset: Path, repo_root: Path, tmp_path: Path) -> None:
    params = tmp_path / "params.yaml"
    shutil.copy(repo_root / "params.yaml", params)
    overrides = experiment_overrides(load_config(params), load_config(preset))
    assert overrides, f"{preset} changes nothing"
    apply_overrides(params, overrides)
    assert load_config(params).model_dump() == load_config(preset).model_dump()


def test_each_seed_is_one_named_experiment(repo_root: Path) -> None:
    lines = commands(PRESETS[0], [0, 2], "lc", queue=True, base=repo_root / "params.yaml")
    assert [line[:5] for line in lines] == [["dvc", "exp", "run", "-n", "lc-s0"], ["dvc", "exp", "run", "-n", "lc-s2"]]
    assert all(line[-3:] == ["-S", f"run.seed={seed}", "--queue"] for line, seed in zip(lines, (0, 2)))


TEPO_VARIANTS = {"off": {"kind": "off"}, "sparse": {"kind": "sparse", "min_segment_tokens": 2},
                 "dense": {"kind": "dense", "alpha": 0.7, "min_segment_tokens": 1, "advantage_eps": 1.0e-5}}


@pytest.mark.parametrize("before", sorted(TEPO_VARIANTS))
@pytest.mark.parametrize("after", sorted(TEPO_VARIANTS))
def test_a_preset_that_switches_a_variant_or_drops_an_entry_gets_exactly_its_config(before: str, after: str,
                                                                                     repo_root: Path,
                                                                                     tmp_path: Path) -> None:
    default = yaml.safe_load((repo_root / "params.yaml").read_text())
    start, target = copy.deepcopy(default), copy.deepcopy(default)
    start["reward"]["tepo"] = TEPO_VARIANTS[before]
    start["evaluate"]["baselines"]["extra"] = {"model": "models/x", "label": "x", "output_dir": "metrics/x"}
    target["reward"]["tepo"] = TEPO_VARIANTS[after]
    target["run"]["seed"] = 17
    params, preset = tmp_path / "params.yaml", tmp_path / "preset.yaml"
    params.write_text(yaml.safe_dump(start))
    preset.write_text(yaml.safe_dump(target))
    apply_overrides(params, experiment_overrides(load_config(params), load_config(preset)))
    assert load_config(params).model_dump() == load_config(preset).model_dump()
