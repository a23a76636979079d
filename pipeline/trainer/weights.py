"""Which weights RL trains: all of them, or a LoRA adapter (peft) for small machines.

Chosen once at set-up from `train.finetune`; the trainer then asks the chosen object, never
which kind it has:

* `held_dtype(model_dtype, deepspeed)`: the dtype the policy (and a KL reference) is loaded in, so that
  the optimiser never steps low-precision weights (`pipeline.model`, precision): float32 master weights
  for full fine-tuning in one process (the forward runs in model.dtype under autocast), model.dtype
  under DeepSpeed (whose bf16 and fp16 modes keep float32 masters) and for LoRA's frozen base (peft
  keeps the adapter float32; checked);
* `prepare(model)`: the module the optimiser, the loss and the `hf` rollout backend share
  (the `hf` backend samples from the adapted model itself, so its weight sync stays free);
* `trainable(model)`: the parameters the optimiser holds (LoRA: the adapter only, so AdamW
  keeps two moments for a few percent of the weights instead of all of them);
* `rollout_tensors(model)`: what an out-of-process rollout engine (vLLM) must load to sample
  from the current policy, under the plain model's parameter names. A lazy iterator: a
  backend that needs nothing (`hf`) never consumes it, so nothing is computed;
* `export(model)`: a plain transformers model for `save_pretrained`; LoRA is merged in
  (`merge_and_unload`), so transformers and vLLM load the result without peft.

Checkpoints hold the whole module's state (base and adapter), so `--resume` restores it
exactly whichever kind trains.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import PreTrainedModel

from pipeline.config.train import FinetuneConfig, LoraFinetune

PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the wrapped model's parameter names


class PolicyWeights(Protocol):
    def held_dtype(self, model_dtype: str, deepspeed: bool) -> str: ...
    def prepare(self, model: PreTrainedModel) -> PreTrainedModel: ...
    def trainable(self, model: torch.nn.Module) -> list[torch.nn.Parameter]: ...
    def rollout_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]: ...
    def export(self, model: PreTrainedModel) -> PreTrainedModel: ...


@dataclass(frozen=True)
class FullWeights:
    """Every weight trains; the model is used and saved as loaded."""

    def held_dtype(self, model_dtype: str, deepspeed: bool) -> str:
        _refuse_unscaled_float16(model_dtype, deepspeed)
        return model_dtype if deepspeed else "float32"

    def prepare(self, model: PreTrainedModel) -> PreTrainedModel:
        return model

    def trainable(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def rollout_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        return model.named_parameters()

    def export(self, model: PreTrainedModel) -> PreTrainedModel:
        return model


@dataclass(frozen=True)
class LoraWeights:
    """A LoRA adapter on `cfg.target_modules`; the base model is frozen.

    Works with gradient checkpointing: transformers' checkpointing is non-reentrant and makes
    the (frozen) embeddings' output require grad, so gradients reach the adapters.
    """

    cfg: LoraFinetune

    def held_dtype(self, model_dtype: str, deepspeed: bool) -> str:
        _refuse_unscaled_float16(model_dtype, deepspeed)
        return model_dtype  # the base is frozen: in model.dtype it only runs, and costs half the memory

    def prepare(self, model: PreTrainedModel) -> PreTrainedModel:
        # peft annotates lora_alpha int; it only divides it by r, and a float scales as written
        lora = LoraConfig(r=self.cfg.r, lora_alpha=self.cfg.alpha,  # type: ignore[arg-type]
                          lora_dropout=self.cfg.dropout,
                          target_modules=list(self.cfg.target_modules), bias="none", task_type="CAUSAL_LM")
        adapted = get_peft_model(model, lora)
        if not any(isinstance(m, LoraLayer) for m in adapted.modules()):
            raise ValueError(f"train.finetune.target_modules {list(self.cfg.target_modules)} match no layer of the model")
        low = sorted({str(p.dtype) for p in adapted.parameters() if p.requires_grad and torch.finfo(p.dtype).bits < 32})
        if low:  # peft upcasts adapters over a bf16 base (autocast_adapter_dtype); an optimiser must not step these
            raise ValueError(f"the LoRA adapter's weights are {low}, not float32")
        # used as the transformers model it wraps: a PeftModel forwards every attribute it lacks to that model
        return cast(PreTrainedModel, adapted)

    def trainable(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        return [p for p in model.parameters() if p.requires_grad]

    def rollout_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The plain model's parameters, adapted layers merged (W + (alpha / r) B A), one at a time.

        The whole model, as for full fine-tuning: a backend may take one load as the whole model."""
        adapted = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
        for name, param in model.named_parameters():
            if ".lora_" in name:
                continue
            plain = name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
            layer, _, kind = name.rpartition(".base_layer.")
            if kind != "weight":  # a frozen parameter outside the adapters (or a base layer's bias)
                yield plain, param
                continue
            module = adapted[layer]
            with torch.no_grad():
                # every LoRA layer type defines it; peft's base class does not declare it
                delta = module.get_delta_weight(module.active_adapters[0])  # type: ignore[attr-defined]
                yield plain, param + delta.to(param.dtype)

    def export(self, model: PreTrainedModel) -> PreTrainedModel:
        """The base model with the adapter merged in. Done in place: call it once, at the end of training."""
        if not isinstance(model, PeftModel):
            raise TypeError(f"expected the peft-wrapped policy, got {type(model).__name__}")
        return cast(PreTrainedModel, model.merge_and_unload())  # the wrapped model itself; peft types it Module


def _refuse_unscaled_float16(model_dtype: str, deepspeed: bool) -> None:
    if model_dtype == "float16" and not deepspeed:
        raise ValueError("model.dtype float16 without distributed.enabled: float16 gradients need loss scaling, which "
                         "only DeepSpeed's fp16 mode brings (use bfloat16 or float32)")


def policy_weights(cfg: FinetuneConfig) -> PolicyWeights:
    """The strategy for `train.finetune` (the one place that looks at which kind is configured)."""
    return LoraWeights(cfg) if isinstance(cfg, LoraFinetune) else FullWeights()
