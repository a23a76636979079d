"""Matrix products in bfloat16 vs float32 on this machine's CPU, at SmolLM2-135M's shapes: what `train.update.autocast: auto`
decides from (`pipeline.model.bf16_is_native`).

The update's forward under bf16 autocast is 1.5x faster on a CPU with AVX512-BF16 (`autocast_update.py`); on an
AVX2-only CPU oneDNN has no bf16 kernels and a bf16 product is emulated. This times both dtypes on the products an
update makes (packed tokens x hidden 576 against the projections 576 -> 1536 and 1536 -> 576), alternating, the
fastest of `--reps`, and prints whether `auto` would choose bf16 here.

    python -m benchmarks.bf16_matmul [--tokens 512] [--reps 5] [--threads 2] [--quick]

Last line: one JSON object; "ratio" = float32 seconds / bf16 seconds (above 1: bf16 is faster here).
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import harness
from pipeline.model import bf16_is_native

SHAPES = {"up (576 -> 1536)": (576, 1536), "down (1536 -> 576)": (1536, 576)}
QUICK = {"tokens": 16, "reps": 1, "threads": 1}


def fastest(left: torch.Tensor, right: torch.Tensor, reps: int) -> float:
    left @ right  # the first call builds the kernel
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        left @ right
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    seconds = {"float32": 0.0, "bfloat16": 0.0}
    for name, (inner, outer) in SHAPES.items():
        left, right = torch.randn(args.tokens, inner), torch.randn(inner, outer)
        row = {}
        for dtype in (torch.float32, torch.bfloat16):
            row[str(dtype).removeprefix("torch.")] = fastest(left.to(dtype), right.to(dtype), args.reps)
        for key, value in row.items():
            seconds[key] += value
        print(f"{name}: float32 {row['float32'] * 1e3:.2f} ms, bfloat16 {row['bfloat16'] * 1e3:.2f} ms")
    harness.last_line({
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "bf16_native": bf16_is_native(torch.device("cpu")),
        "autocast_auto_chooses": "bfloat16" if bf16_is_native(torch.device("cpu")) else "float32",
        "float32_ms": round(seconds["float32"] * 1e3, 3), "bfloat16_ms": round(seconds["bfloat16"] * 1e3, 3),
        "tokens": args.tokens, "threads": args.threads, "ratio": round(seconds["float32"] / seconds["bfloat16"], 4),
    }, args.quick)


if __name__ == "__main__":
    main()
