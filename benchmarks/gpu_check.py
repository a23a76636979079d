"""GPU check: a few DAPO steps of a random-initialised ~0.5B Qwen2 model with DeepSpeed ZeRO-2.

Runs as-is on one NVIDIA GPU with no downloads (no tokenizer: prompts are random token
ids, and every sample is generated to its full length so the token counts are fixed):
HF generation of groups of samples -> old log-probs -> random 0/1 rewards -> group
advantages -> `apply_policy_gradient` through `DeepSpeedReplicas` (the trainer's own update
path) in bf16 with ZeRO-2. `--tiny` runs the same code on the CPU with a tiny model (CI).

    .venv/bin/python benchmarks/gpu_check.py            # one GPU, < 8 min
    .venv/bin/python benchmarks/gpu_check.py --tiny     # CPU, seconds

Last line: JSON with generation_tokens_per_s, training_tokens_per_s, mfu (model FLOPs per
second / the GPU's dense bf16 peak; null when the peak is unknown or on CPU) and peak memory.
MFU counts 6 * (non-embedding parameters) + 12 * layers * hidden * sequence FLOPs per
trained token (forward + backward; gradient-checkpointing recompute is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.rl.advantage import group_advantages  # noqa: E402
from pipeline.config.distributed import DistributedConfig  # noqa: E402
from pipeline.config.train import DAPOLoss  # noqa: E402
from pipeline.rl.loss import make_policy_loss  # noqa: E402
from pipeline.services.processes import free_port  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402
from pipeline.trainer.update import UpdateSettings, apply_policy_gradient, micro_batches, token_logprobs_and_entropy  # noqa: E402

# Dense bf16 peak FLOP/s by device-name fragment (vendor data sheets, SXM parts).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12}


@dataclass(frozen=True)
class Setup:
    model: Qwen2Config
    prompts: int
    group: int
    prompt_len: int
    new_tokens: int
    micro: int
    steps: int
    dtype: str


def qwen2_0p5b() -> Qwen2Config:
    """The Qwen2.5-0.5B architecture (494M parameters, tied embeddings)."""
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def tiny() -> Qwen2Config:
    return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                       tie_word_embeddings=True)


GPU = Setup(qwen2_0p5b(), prompts=16, group=4, prompt_len=128, new_tokens=256, micro=8, steps=3, dtype="bfloat16")
CPU_TINY = Setup(tiny(), prompts=2, group=2, prompt_len=8, new_tokens=8, micro=2, steps=2, dtype="float32")


def ensure_single_process_env() -> None:
    """DeepSpeed needs a process group even for one rank; bind it to loopback."""
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate(model, s: Setup, device: torch.device, g: torch.Generator) -> tuple[torch.Tensor, float]:
    prompts = torch.randint(0, s.model.vocab_size, (s.prompts, s.prompt_len), generator=g).to(device)
    model.eval()
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        ids = model.generate(prompts.repeat_interleave(s.group, 0), attention_mask=torch.ones_like(
            prompts.repeat_interleave(s.group, 0)), do_sample=True, temperature=1.0, top_p=1.0,
            max_new_tokens=s.new_tokens, min_new_tokens=s.new_tokens, pad_token_id=0)
    sync(device)
    return ids, time.perf_counter() - t0


def to_batch(ids: torch.Tensor, s: Setup, g: torch.Generator) -> TrainBatch:
    B, T = ids.shape
    mask = torch.zeros(B, T, device=ids.device)
    mask[:, s.prompt_len:] = 1.0
    rewards = torch.randint(0, 2, (s.prompts, s.group), generator=g).double()
    adv = torch.cat([torch.as_tensor(group_advantages(r.numpy(), std_normalize=True)) for r in rewards])
    adv_BT = adv.float().to(ids.device)[:, None] * mask
    return TrainBatch(ids, torch.ones_like(ids), mask, torch.zeros(B, T, device=ids.device), adv_BT,
                      n_policy_tokens=int(mask.sum()))


def with_old_logprobs(model, batch: TrainBatch, micro: int) -> TrainBatch:
    with torch.no_grad():
        parts = [token_logprobs_and_entropy(model, m, 1.0, with_entropy=False)[0] for m in micro_batches(batch, micro)]
    return TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT,
                      torch.cat(parts).float() * batch.loss_mask_BT, batch.advantages_BT, batch.n_policy_tokens)


def flops_per_token(cfg: Qwen2Config, seq: int, n_params: int) -> float:
    embed = cfg.vocab_size * cfg.hidden_size
    return 6.0 * (n_params - embed) + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (for CI)")
    args = parser.parse_args()
    s = CPU_TINY if args.tiny else GPU
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --tiny on a CPU machine")
    ensure_single_process_env()
    from pipeline.distributed.replicas import DeepSpeedReplicas, deepspeed_engine

    device = torch.device("cuda" if not args.tiny else "cpu")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(s.model).to(device=device, dtype=getattr(torch, s.dtype))
    n_params = sum(p.numel() for p in model.parameters())
    if not args.tiny:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
    backend = DeepSpeedReplicas(deepspeed_engine(model, optimizer, DistributedConfig(enabled=True, zero_stage=2),
                                                 s.micro, 1.0, s.dtype))
    loss, settings = make_policy_loss(DAPOLoss()), UpdateSettings(s.micro, 1.0, 1.0)
    g = torch.Generator().manual_seed(0)
    gen_tokens = gen_s = train_tokens = train_s = 0.0
    for step in range(s.steps):
        ids, elapsed = generate(backend.module, s, device, g)
        batch = with_old_logprobs(backend.module, to_batch(ids, s, g), s.micro)
        sync(device)
        t0 = time.perf_counter()
        metrics = apply_policy_gradient(backend, batch, loss, settings)
        sync(device)
        if step > 0 or s.steps == 1:  # the first step includes one-off start-up work
            gen_tokens, gen_s = gen_tokens + ids.shape[0] * s.new_tokens, gen_s + elapsed
            train_tokens, train_s = train_tokens + ids.numel(), train_s + time.perf_counter() - t0
        print(f"step {step}: loss {metrics['train/loss']:.4f} grad_norm {metrics['train/grad_norm']:.3f}",
              file=sys.stderr)
    train_tps = train_tokens / train_s
    achieved = flops_per_token(s.model, s.prompt_len + s.new_tokens, n_params) * train_tps
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None) if device.type == "cuda" else None
    print(json.dumps({
        "device": name, "params": n_params, "zero_stage": 2, "dtype": s.dtype,
        "sequences_per_step": s.prompts * s.group, "tokens_per_sequence": s.prompt_len + s.new_tokens,
        "generation_tokens_per_s": gen_tokens / gen_s, "training_tokens_per_s": train_tps,
        "model_tflops_per_s": achieved / 1e12, "mfu": achieved / peak if peak else None,
        "peak_memory_gib": (torch.cuda.max_memory_allocated() if device.type == "cuda" else peak_rss()) / 2**30,
    }))


def peak_rss() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


if __name__ == "__main__":
    main()
