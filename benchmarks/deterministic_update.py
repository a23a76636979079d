"""Seconds per training update with torch's deterministic kernels (`run.deterministic`, the default) vs without.

Ours runs the update as the train stage does by default: `pipeline.repeatable.use_deterministic_kernels(True)`,
so a kernel that adds into one place from several threads (the backward of advanced indexing where an index
repeats) runs an ordered version. The baseline is the same update with torch's default kernels. Both sides run
the same `policy_gradient_step` (DAPO loss with a KL term, lr 0, bf16 autocast, one micro-batch per group as
a prefix tree, then the reference's no-grad pass) on the same groups, alternately in one process, and each
side's gradients are hashed on every pass: ours must give one digest per group, the baseline may give several.

The groups have the main job's shape, not its tokens (the cost depends on the shapes): `--groups` groups of 8
rows with one prompt of 450 tokens (the TAPO system prompt and a question), rows that agree in pairs for the
first 40 tokens of the response (a thought and a call) and then run 60-250 tokens on their own; the base model
(SmolLM2-135M-Instruct, models/base, float32 weights).

    python benchmarks/deterministic_update.py [--groups 3] [--reps 3] [--threads 2] [--quick]
Last line: one JSON object; "ratio" = the baseline's seconds / ours over every pass (higher is better: 1.0 means
the deterministic kernels cost nothing); per side the seconds and the distinct gradient digests per group.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness
from benchmarks.update_bench import args_and_base_model, timed_update  # noqa: E402
from pipeline.repeatable import use_deterministic_kernels  # noqa: E402
from pipeline.trainer.update import masked_logprobs_no_grad  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402

SIDES = {"deterministic": True, "fast_kernels": False}
PROMPT, SHARED_OPENING, ROWS = 450, 40, 8


def shaped_group(vocab: int, seed: int) -> TrainBatch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(60, 251, ROWS) + PROMPT + SHARED_OPENING
    T = int(lengths.max())
    ids = torch.as_tensor(rng.integers(0, vocab, (ROWS, T)))
    ids[:, :PROMPT] = ids[0, :PROMPT]
    for r in range(0, ROWS, 2):
        ids[r + 1, :PROMPT + SHARED_OPENING] = ids[r, :PROMPT + SHARED_OPENING]
    attn = (torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]).long()
    mask = attn.double()
    mask[:, :PROMPT] = 0
    adv = torch.as_tensor(rng.choice([-1.0, 1.0], (ROWS, 1))).expand(ROWS, T) * mask
    return TrainBatch(ids, attn, mask, torch.zeros(ROWS, T), adv, n_policy_tokens=int(mask.sum()))


def with_own_logprobs(model: torch.nn.Module, batch: TrainBatch) -> TrainBatch:
    """Old and reference log-probs from the model itself, as at a run's first step (ratio 1, KL 0)."""
    own = masked_logprobs_no_grad(model, batch, ROWS, 1.0, torch.bfloat16)
    return dataclasses.replace(batch, old_logprobs_BT=own, ref_logprobs_BT=own.clone())


def gradient_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.grad.detach().numpy().tobytes())
    return h.hexdigest()[:12]


def main(argv: list[str] | None = None) -> None:
    args, model, _ = args_and_base_model(__doc__.splitlines()[0], argv, groups=3)
    groups = [with_own_logprobs(model, shaped_group(model.config.vocab_size, seed)) for seed in range(args.groups)]
    seconds = dict.fromkeys(SIDES, 0.0)
    digests: dict[str, list[int]] = {side: [] for side in SIDES}
    for i, batch in enumerate(groups):
        seen: dict[str, set[str]] = {side: set() for side in SIDES}
        for _ in range(max(args.reps, 1)):
            for side, deterministic in SIDES.items():  # alternate, so drift on a noisy machine hits both sides
                use_deterministic_kernels(deterministic)
                r = timed_update(model, batch, ROWS, autocast=torch.bfloat16)
                seen[side].add(gradient_digest(model))
                seconds[side] += r["update_s"] + r["reference_s"]
                print(f"group {i} {side}: {r['update_s'] + r['reference_s']:.2f} s, grad norm {r['grad_norm']:.9f}",
                      flush=True)
        for side in SIDES:
            digests[side].append(len(seen[side]))
    harness.last_line({"ratio": round(seconds["fast_kernels"] / seconds["deterministic"], 3),
                       "seconds": {side: round(s, 2) for side, s in seconds.items()},
                       "distinct_gradients_per_group": digests, "reps": args.reps, "threads": args.threads}, args.quick)


if __name__ == "__main__":
    main()
