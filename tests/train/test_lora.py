"""LoRA fine-tuning (`train.finetune.kind: lora`) on the tiny toy model, tool-free coin flip.

Only the adapter moves and the frozen base stays bit for bit; the weights pushed to an
out-of-process rollout engine are the merged ones under plain parameter names; a resumed run
repeats the step it redoes exactly; the exported directory is a plain merged model that
transformers loads without peft.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlflow
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from pipeline.train import run, set_up, update
from pipeline.training_run.folder import run_folder
from pipeline.training_run.plan import plan_run
from tests.helpers.training import collect_batch
from tests.train.test_resume import assert_same_metrics
from tests.train.toy_task import build_direct_model, toy_config

pytestmark = pytest.mark.integration  # training runs, a resume and an export

LORA = {"kind": "lora", "r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
SCALE = LORA["alpha"] / LORA["r"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_direct_model(tmp_path_factory.mktemp("lora") / "model")


def merged(base_W: torch.Tensor, lora_A: torch.Tensor, lora_B: torch.Tensor) -> torch.Tensor:
    """W + (alpha / r) B A, written out here rather than taken from peft."""
    return base_W + SCALE * (lora_B @ lora_A)


def test_lora_trains_only_the_adapter(tmp_path: Path, model_dir: Path) -> None:
    cfg = toy_config(tmp_path, model_dir, steps=3, gradient_checkpointing=True, finetune=LORA)
    tr = set_up(cfg, {})
    trainable = {n for n, p in tr.replicas.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    held = [p for group in tr.replicas.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in tr.replicas.model.parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in tr.replicas.model.named_parameters()}
    updates = 0
    for _ in range(3):
        kept, _ = collect_batch(tr)
        updates += update(tr, kept)["train/skipped"] == 0.0
    assert updates >= 1  # the coin flip gives informative groups
    for name, param in tr.replicas.model.named_parameters():
        if name in trainable:
            if ".lora_B." in name:  # B starts at zero: every adapter received a gradient step
                assert not torch.equal(param, before[name]), name
        else:
            assert torch.equal(param, before[name]), f"frozen {name} moved"

    # Weight sync for an engine with its own copy: the whole plain model, adapted layers merged.
    params = dict(tr.replicas.model.named_parameters())
    plain = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    pushed = dict(tr.replicas.weights.rollout_tensors(tr.replicas.model))
    assert sorted(pushed) == sorted(plain)
    adapted = [n for n in plain if any(f".{m}." in n for m in LORA["target_modules"])]
    assert len(adapted) == 2 * len(LORA["target_modules"])  # 2 layers of the tiny Llama
    for name, tensor in pushed.items():
        if name in adapted:
            stem = "base_model.model." + name.removesuffix(".weight")
            expected = merged(params[f"{stem}.base_layer.weight"], params[f"{stem}.lora_A.default.weight"],
                              params[f"{stem}.lora_B.default.weight"])
            torch.testing.assert_close(tensor, expected, rtol=0, atol=1e-6)
            assert not torch.equal(tensor, plain[name])
        else:
            assert torch.equal(tensor, plain[name]), name
    tr.engine.close()


def test_lora_run_resumes_exactly_and_exports_a_merged_model(tmp_path: Path, model_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's artifact store (./mlruns) goes under tmp_path
    cfg = toy_config(tmp_path, model_dir, steps=3, checkpoints__every=1, finetune=LORA, sample_tables__every=1)
    metrics = tmp_path / "metrics"
    run(cfg, {}, metrics_dir=metrics)
    straight = [json.loads(line) for line in (metrics / "train_history.jsonl").read_text().splitlines()]
    straight_policy = load_file(tmp_path / "policy" / "model.safetensors")
    assert any(row["train/skipped"] == 0.0 for row in straight[1:])

    # As if killed after logging step 2 but before its checkpoint: resume from step 2 redoes step 2.
    shutil.rmtree(run_folder(cfg) / "checkpoints" / "step-000003")
    last_checkpoint = load_file(run_folder(cfg) / "checkpoints" / "step-000002" / "model.safetensors")
    run(cfg, {}, plan_run(cfg, metrics_dir=metrics, mode="insisted"), metrics_dir=metrics)  # --resume
    rows = [json.loads(line) for line in (metrics / "train_history.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 2 ran twice; the history keeps the resumed run's row
    assert_same_metrics(rows[-1], straight[2], exact=True)
    run_id = json.loads((run_folder(cfg) / "checkpoints" / "step-000003" / "state.json").read_text())["mlflow_run_id"]
    redone = mlflow.load_table("samples/step-000002.json", run_ids=[run_id])
    assert len(redone) == cfg.train.sample_tables.trajectories  # the redone step's samples are not logged twice
    resumed_policy = load_file(tmp_path / "policy" / "model.safetensors")
    assert sorted(resumed_policy) == sorted(straight_policy)
    for name, weight in straight_policy.items():
        assert torch.equal(resumed_policy[name], weight), name

    # The export is a plain model: no adapter files, the base's parameter names, merged weights.
    out = tmp_path / "policy"
    assert not (out / "adapter_config.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    exported_sd, base_sd = exported.state_dict(), base.state_dict()
    assert sorted(exported_sd) == sorted(base_sd)
    adapted = [n for n in base_sd if any(f".{m}." in n for m in LORA["target_modules"])]
    assert len(adapted) == 6
    for name in base_sd:
        if name in adapted:
            assert not torch.equal(exported_sd[name], base_sd[name]), f"{name}: adapter not merged"
        else:
            assert torch.equal(exported_sd[name], base_sd[name]), f"{name}: not adapted, yet changed"
    # The step-2 checkpoint holds base and adapter; step 3 trained on from it, so compare the
    # merge rule on the final checkpoint the resumed run wrote.
    final = load_file(run_folder(cfg) / "checkpoints" / "step-000003" / "model.safetensors")
    for name in adapted:
        stem = "base_model.model." + name.removesuffix(".weight")
        torch.testing.assert_close(exported_sd[name], merged(final[f"{stem}.base_layer.weight"],
                                                             final[f"{stem}.lora_A.default.weight"],
                                                             final[f"{stem}.lora_B.default.weight"]), rtol=0, atol=1e-6)
        assert torch.equal(final[f"{stem}.base_layer.weight"], last_checkpoint[f"{stem}.base_layer.weight"])
    ids = torch.tensor([[1, 2, 3, 4]])
    assert not torch.allclose(exported(ids).logits, base(ids).logits)


def test_lora_with_data_parallelism_is_refused_before_loading(tmp_path: Path) -> None:
    cfg = toy_config(tmp_path, tmp_path / "no-model-here", finetune=LORA)
    cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"enabled": True})})
    with pytest.raises(ValueError, match="train.finetune: kind lora is not supported with distributed.enabled"):
        set_up(cfg, {})
