"""One short RL step (a tiny in-process model, the real tool services) for each row of a pairwise covering
sample of the documented configuration matrix (tests/matrix/cases.py says how it is chosen), each step
checked for the invariants where the parts meet; and every unsupported combination refused by
`python -m pipeline.config check` with all of its keys named."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, load_config
from pipeline.config.__main__ import main as config_main
from pipeline.config.combinations import UNSUPPORTED
from pipeline.paths import REPO_ROOT
from pipeline.train import prepared_batch, set_up, update
from tests.matrix.cases import (FACTORS, all_pairs, check_dropped_rows_of_the_batch_train_nothing, check_metrics,
                                check_tool_output_gets_no_gradient, collect_until_kept, overrides, pairs_of,
                                pairwise_rows, row_id)
from tests.matrix.conftest import row_config
from tests.matrix.toy_protocols import TASKS

ROWS = pairwise_rows()


def test_the_sample_covers_every_pair_of_factor_values() -> None:
    covered = set().union(*(pairs_of(r) for r in ROWS))
    assert covered == all_pairs()
    assert len(ROWS) <= 24  # 18 at least (6 algorithms x 3 protocols)


def one_step(tr) -> None:
    """The step `pipeline.train.run` makes, with the invariants checked on what it trains."""
    kept, anchored = collect_until_kept(tr)
    groups = kept + anchored
    batch, _ = prepared_batch(tr, groups)
    check_dropped_rows_of_the_batch_train_nothing(batch, groups, anchored)
    check_tool_output_gets_no_gradient(tr, batch, groups)
    check_metrics(tr.cfg, update(tr, kept, anchored))


@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_one_step(row: dict[str, str], tmp_path: Path, protocol_models: dict[str, Path],
                  tool_urls: dict[str, str]) -> None:
    url = tool_urls[row["protocol"]]
    cfg = row_config(row, tmp_path, protocol_models[row["protocol"]], url)
    tr = set_up(cfg, {TASKS[row["protocol"]].tool: url})
    try:
        one_step(tr)
    finally:
        tr.engine.close()


def refused(tmp_path: Path, overrides: dict, capsys) -> str:
    """The config check's output for params.yaml with `overrides` (exit 1 asserted)."""
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = params
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    assert config_main(["check", str(path)]) == 1
    return capsys.readouterr().err


UNSUPPORTED_CASES = {  # one params change per refused combination (each rule of combinations.py, and the train section's)
    "train.update.autocast+model.dtype": {"train.update.autocast": "bfloat16", "model.dtype": "bfloat16"},
    "model.dtype+distributed.enabled": {"model.dtype": "float16", "train.update.autocast": "none", "sft.enabled": False},
    "model.dtype+sft.enabled": {"model.dtype": "float16", "train.update.autocast": "none", "distributed.enabled": True},
    "train.sampling.refill_dropped_groups+rollout.schedule": {"train.sampling.refill_dropped_groups": True,
                                                      "rollout.schedule": "turn-synchronous"},
    "train.finetune.kind+distributed.enabled": {"train.finetune": {"kind": "lora"}, "distributed.enabled": True},
    "train.sampling.refill_dropped_groups+train.algorithm.dynamic_sampling": {
        "train.sampling.refill_dropped_groups": True, "train.algorithm": {"kind": "grpo", "dynamic_sampling": False},
        "train.sampling.anchor_dropped_tokens": 0},
    "train.sampling.anchor_dropped_tokens+train.algorithm.kl_coef+train.algorithm.dynamic_sampling": {
        "train.sampling.anchor_dropped_tokens": 8, "train.algorithm.kl_coef": 0.0},
    "train.update.mask_tool_output+train.update.logprobs_source": {"train.update.mask_tool_output": False,
                                                     "train.update.logprobs_source": "rollout"},
    "reward.tepo.kind+rollout.backend": {"reward.tepo": {"kind": "sparse"}, "rollout.backend": "vllm"},
    "rollout.backend+rollout.top_p+rollout.temperature+train.update.logprobs_source": {
        "rollout.backend": "vllm", "rollout.top_p": 0.9, "rollout.temperature": 0.7, "train.update.logprobs_source": "rollout"},
    "rollout.tools+rollout.protocol": {"rollout.tools": [
        {"kind": "python", "name": "root", "function": "math:sqrt", "description": "A square root.",
         "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}, "timeout_s": 1.0,
         "concurrency": 1}]},
    "reward.tepo.kind+rollout.protocol": {"reward.tepo": {"kind": "dense"}, "rollout.protocol": "chat-tools"},
}


@pytest.mark.parametrize("keys", list(UNSUPPORTED_CASES))
def test_an_unsupported_combination_is_refused_naming_every_key(keys: str, tmp_path: Path, capsys) -> None:
    err = refused(tmp_path, UNSUPPORTED_CASES[keys], capsys)
    for key in keys.split("+"):
        assert key in err, (key, err)


def test_every_cross_section_rule_has_a_case() -> None:
    assert {"+".join(rule.keys) for rule in UNSUPPORTED} <= set(UNSUPPORTED_CASES)


def test_every_documented_combination_loads_or_is_refused_by_a_named_rule() -> None:
    """The full product of the matrix factors with data parallelism on and off: a combination the config
    accepts is one the sample may run; each refused one names the keys of a rule that applies."""
    names = list(FACTORS) + ["distributed"]
    for values in itertools.product(*FACTORS.values(), (False, True)):
        row = dict(zip(names, values, strict=True))
        if row["tepo"] != "off" or row["autocast"] != "none":  # they meet no cross-section rule: sampled above
            continue
        extra = overrides(row, Path("/nonexistent"), Path("/nonexistent"), Path("/nonexistent"), "")
        try:
            load_config(REPO_ROOT / "params.yaml", overrides=extra | {"distributed.enabled": row["distributed"]})
        except ConfigError as err:
            rules = [r for r in UNSUPPORTED if all(k in str(err) for k in r.keys)]
            assert rules, str(err)
            assert row["finetune"] == "lora" and row["distributed"]
        else:
            assert not (row["finetune"] == "lora" and row["distributed"])
