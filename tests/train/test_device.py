"""Device placement: `model.device` resolves once, and a batch follows the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.model import load_policy, model_device, resolve_device
from tests.train.test_loss import _random_batch
from tests.train.toy_task import build_direct_model


def test_auto_is_cuda_when_present_else_cpu() -> None:
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_absent_accelerator_is_a_clear_error() -> None:
    for name in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="model.device"):
            resolve_device(name)


def test_every_tensor_of_a_batch_moves() -> None:
    batch = _random_batch(64)
    batch = dataclasses.replace(batch, ref_logprobs_BT=batch.old_logprobs_BT.clone())
    moved = batch.to(torch.device("meta"))  # a real device without storage: shows where each tensor went
    tensors = [f.name for f in dataclasses.fields(moved) if isinstance(getattr(moved, f.name), torch.Tensor)]
    assert len(tensors) == 6 and all(getattr(moved, n).device.type == "meta" for n in tensors)
    assert moved.n_policy_tokens == batch.n_policy_tokens
    assert batch.to(torch.device("cpu")).input_ids_BT is batch.input_ids_BT  # no copy when already there


def test_load_policy_places_the_model(tmp_path) -> None:
    model_dir = build_direct_model(tmp_path / "model", sft_steps=1)
    model, _ = load_policy(model_dir, device="cpu")
    assert model_device(model) == torch.device("cpu")
