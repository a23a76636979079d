"""The inference servers of the asynchronous mode on this machine: how long a vLLM CPU server takes to start, to
generate 16 sequences x 64 tokens, and to take a weight push through /dev/shm + collective_rpc, for the tests' tiny
Llama and for a random Llama shaped like SmolLM2-135M (the same tensors: 538 MB in float32).

Each server is pinned to `--core`. A push is timed by phase (write the file while the server still generates;
pause; load; set the version; resume). Runs in the vLLM environment; the last line is one JSON object.

    .venv-vllm/bin/python -m benchmarks.inference_servers [--core 1] [--repeats 3] [--skip-135m] [--quick]

`--quick`: the tiny model only, one repeat (a server start, about 1-2 minutes here).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pipeline.inference.client import InferenceClient
from pipeline.inference.pool import ServerPool, Supervision
from pipeline.inference.records import Sampling
from pipeline.inference.server import LaunchSpec
from pipeline.inference.weights import FileTransport, WeightPusher, WeightSource
from pipeline.services.processes import free_port
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.tiny_vllm import save_tiny

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, tie_word_embeddings=True,
                    max_position_embeddings=2048, rope_theta=100000.0)


def save_smollm2_shaped(path: Path) -> LlamaForCausalLM:
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).float().eval()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)  # the server needs one; generation is not measured on this model
    return model


def start(model_dir: Path, core: int, logs: Path) -> tuple[ServerPool, float]:
    spec = LaunchSpec(model_dir.name, model_dir, free_port(), logs, python=sys.executable, cores=(core,),
                      max_model_len=512, kv_cache_gib=1)
    started = time.perf_counter()
    pool = ServerPool.launched([spec], Supervision(start_timeout_s=900.0, max_restarts=0)).start()
    return pool, time.perf_counter() - started


async def generate_16x64(pool: ServerPool, seed: int) -> float:
    async with InferenceClient(pool, deadline_s=600.0, attempts=1) as client:
        started = time.perf_counter()
        await asyncio.gather(*[client.generate(f"k{i}", [5, 6, 7, 8 + i], Sampling(64, seed=seed + i, ignore_eos=True))
                               for i in range(16)])
        return time.perf_counter() - started


def pushes(pool: ServerPool, model: torch.nn.Module, repeats: int) -> dict[str, float]:
    pusher = WeightPusher(pool, FileTransport(Path("/dev/shm"), 900.0), control_deadline_s=120.0)
    reports = []
    try:
        for version in range(1, repeats + 1):
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)  # a different model each time
            reports.append(pusher.push(WeightSource.of_module(model), version))
    finally:
        pusher.transport.close()
    phases = ("prepare_s", "pause_s", "load_s", "version_s", "resume_s", "total_s")
    return {p: round(statistics.median(getattr(r, p) for r in reports), 3) for p in phases} | {
        "mbytes": round(reports[0].bytes / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-135m", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the tiny model only, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.skip_135m = 1, True
    torch.set_num_threads(1)
    result: dict[str, object] = {"quick": args.quick, "core": args.core}
    with tempfile.TemporaryDirectory() as tmp:
        tiny_dir = save_tiny(Path(tmp) / "tiny", seed=0)
        tiny = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        pool, result["tiny_start_s"] = start(tiny_dir, args.core, Path(tmp) / "logs")
        with pool:
            asyncio.run(generate_16x64(pool, 0))  # warm-up
            times = [asyncio.run(generate_16x64(pool, 100 * r)) for r in range(args.repeats)]
            result["tiny_generate_16x64_s"] = round(statistics.median(times), 3)
            result["tiny_push"] = pushes(pool, tiny, args.repeats)
        print(json.dumps(result), file=sys.stderr, flush=True)
        if not args.skip_135m:
            big_dir = Path(tmp) / "smollm2-135m-shaped"
            big = save_smollm2_shaped(big_dir)
            pool, result["smollm2_135m_start_s"] = start(big_dir, args.core, Path(tmp) / "logs")
            with pool:
                result["smollm2_135m_push"] = pushes(pool, big, args.repeats)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
