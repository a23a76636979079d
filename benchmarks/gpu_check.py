"""GPU check: a few DAPO steps of a random-initialised ~0.5B Qwen2 model on every visible GPU, through the train
stage's multi-GPU path.

The ranks are started as the train stage starts them (`pipeline.distributed.launch.run_ranks`: torchrun, one rank
per visible GPU, rank-prefixed output); each rank wraps the model in `DeepSpeedReplicas` (ZeRO-2, bf16) and runs
HF generation of its own groups of samples -> old log-probs -> random 0/1 rewards -> group advantages ->
`apply_policy_gradient` (the trainer's update: the denominator summed over ranks, gradients reduced by DeepSpeed).
Nothing is downloaded (no tokenizer: prompts are random token ids, and every sample is generated to its full
length so the token counts are fixed). `--tiny` runs the same code on 2 CPU ranks with a tiny model (CI).

    .venv/bin/python benchmarks/gpu_check.py              # every visible GPU (1-8), < 8 min
    .venv/bin/python benchmarks/gpu_check.py --nproc 4    # the first 4
    .venv/bin/python benchmarks/gpu_check.py --tiny       # 2 gloo ranks on the CPU, seconds (--quick: the same)

Last line: JSON with the ranks, step_s (median optimiser step after the first, slowest rank), generation and
training tokens/s (all ranks), mfu (model FLOPs per second per GPU / the GPU's dense bf16 peak; null when the
peak is unknown or on CPU), peak_memory_gib per rank, and weights_agree (every rank holds bit-identical
parameters after the steps: the data-parallel invariant). MFU counts 6 * (non-embedding parameters) + 12 *
layers * hidden * sequence FLOPs per trained token (forward + backward; checkpointing's recompute not counted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402
from pipeline.rl.advantage import group_advantages  # noqa: E402
from pipeline.config.distributed import DistributedConfig  # noqa: E402
from pipeline.config.train import DAPOLoss  # noqa: E402
from pipeline.rl.loss import make_policy_loss  # noqa: E402
from pipeline.distributed.launch import leave_process_group, on_this_machine, run_ranks, visible_gpus  # noqa: E402
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
TINY_RANKS = 2
QUICK = {"tiny": True}  # the GPU part needs a GPU; its code runs on the CPU with --tiny


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


def rank_main(s: Setup, out: Path) -> None:
    """One rank (started by `main` through the stage's launcher): the steps, then this rank's figures in `out`."""
    from pipeline.distributed.replicas import DeepSpeedReplicas, deepspeed_engine

    cuda = torch.cuda.is_available() and s.dtype != "float32"
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)  # the same initial weights on every rank, as the trainer loads them
    model = Qwen2ForCausalLM(s.model).to(device=device, dtype=getattr(torch, s.dtype))
    n_params = sum(p.numel() for p in model.parameters())
    if cuda:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
    replicas = DeepSpeedReplicas(deepspeed_engine(model, optimizer, DistributedConfig(enabled=True, zero_stage=2),
                                                  s.micro, 1.0, s.dtype))
    loss, settings = make_policy_loss(DAPOLoss()), UpdateSettings(s.micro, 1.0, 1.0)
    g = torch.Generator().manual_seed(1000 + replicas.rank)  # each rank samples its own prompts
    steps = []
    for step in range(s.steps):
        t0 = time.perf_counter()
        ids, gen_s = generate(replicas.module, s, device, g)
        batch = with_old_logprobs(replicas.module, to_batch(ids, s, g), s.micro)
        sync(device)
        t1 = time.perf_counter()
        metrics = apply_policy_gradient(replicas, batch, loss, settings)
        sync(device)
        steps.append({"step_s": time.perf_counter() - t0, "gen_s": gen_s, "train_s": time.perf_counter() - t1,
                      "gen_tokens": ids.shape[0] * s.new_tokens, "train_tokens": ids.numel()})
        print(f"step {step}: loss {metrics['train/loss']:.4f} grad_norm {metrics['train/grad_norm']:.3f}",
              file=sys.stderr, flush=True)
    sums = torch.stack([p.detach().double().sum() for p in replicas.module.parameters()]).cpu()
    memory = torch.cuda.max_memory_allocated(device) if cuda else peak_rss()
    torch.save({"steps": steps, "param_sums": sums, "memory": memory, "params": n_params,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu"}, out / f"rank{replicas.rank}.pt")
    leave_process_group()


def summary(s: Setup, ranks: list[dict]) -> dict:
    """One JSON object for the run: the slowest rank's step, every rank's tokens, MFU per GPU."""
    timed = slice(1, None) if s.steps > 1 else slice(None)  # the first step includes one-off start-up work
    step_s = statistics.median(max(r["steps"][i]["step_s"] for r in ranks) for i in range(s.steps)[timed])
    train_s = statistics.median(max(r["steps"][i]["train_s"] for r in ranks) for i in range(s.steps)[timed])
    gen_s = statistics.median(max(r["steps"][i]["gen_s"] for r in ranks) for i in range(s.steps)[timed])
    train_tokens = sum(r["steps"][0]["train_tokens"] for r in ranks)
    gen_tokens = sum(r["steps"][0]["gen_tokens"] for r in ranks)
    per_gpu_flops = flops_per_token(s.model, s.prompt_len + s.new_tokens, ranks[0]["params"]) * train_tokens / \
        train_s / len(ranks)
    name = ranks[0]["device"]
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    return {
        "device": name, "ranks": len(ranks), "params": ranks[0]["params"], "zero_stage": 2, "dtype": s.dtype,
        "sequences_per_step": s.prompts * s.group * len(ranks), "tokens_per_sequence": s.prompt_len + s.new_tokens,
        "step_s": step_s, "generation_tokens_per_s": gen_tokens / gen_s, "training_tokens_per_s": train_tokens / train_s,
        "model_tflops_per_s_per_gpu": per_gpu_flops / 1e12, "mfu": per_gpu_flops / peak if peak else None,
        "peak_memory_gib": [r["memory"] / 2**30 for r in ranks],
        "weights_agree": all(torch.equal(r["param_sums"], ranks[0]["param_sums"]) for r in ranks),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help=f"tiny model on {TINY_RANKS} CPU ranks (for CI)")
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: every visible GPU)")
    parser.add_argument("--rank-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = harness.parse(parser, argv, QUICK)
    s = CPU_TINY if args.tiny else GPU
    if args.rank_out is not None:
        rank_main(s, args.rank_out)
        return
    if not args.tiny and not visible_gpus():
        raise SystemExit("no CUDA device: run with --tiny on a CPU machine")
    nproc = args.nproc or (TINY_RANKS if args.tiny else visible_gpus())
    with tempfile.TemporaryDirectory() as tmp:
        program = [__file__, "--rank-out", tmp, *(["--tiny"] if args.tiny else [])]
        ranks = run_ranks(program, on_this_machine(nproc), log_dir=Path(tmp) / "logs", on_line=print_to_stderr)
        if ranks.returncode != 0:
            raise SystemExit(f"gpu check: ranks failed (launcher exit {ranks.returncode}):\n{ranks.tail}")
        figures = summary(s, [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(nproc)])
    harness.last_line(figures, args.quick)


def print_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def peak_rss() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0  # Linux reports KiB


if __name__ == "__main__":
    main()
