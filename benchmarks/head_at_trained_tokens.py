"""Seconds per training update with the output head run only at trained tokens vs at every position.

A TAPO row is prompt, sampled tokens, tool output, sampled tokens. The update needs log-probs of the
sampled tokens only, but the usual implementation (TRL, verl, and ours before) runs the output head and
the vocabulary softmax at every response position, tool output and padding included; with a 49k-token
vocabulary that is a large share of a small model's step. Ours runs them at the trained tokens only
(`pipeline.trainer.update._head_only_at`).

Rows below follow the held-out evaluation of the learning_cpu SFT model (SmolLM2-135M, task mix): a fact
row spends ~42 sampled tokens around ~260 tokens of search output, a calculator row ~61 sampled tokens
around ~27 of program output; prompts ~300 tokens, shared by a group's 8 rows. Lengths vary +-20% per
row (seeded); token ids are random (the cost does not depend on them). Both sides run the same
`policy_gradient_step` (shared prompts, DAPO loss with a KL term) and the same no-grad pass (the KL
reference's), alternately in one process; the baseline only swaps in a head that works at every
position (`every_position_head`).

    python benchmarks/head_at_trained_tokens.py [--reps 2] [--threads 2] [--quick]
Last line: one JSON object; "ratio" = every-position seconds / trained-token seconds on the fact group
(update + reference pass; higher is better).
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipeline.trainer.update as update  # noqa: E402
from benchmarks import harness
from benchmarks.update_bench import args_and_base_model, swapped, timed_update  # noqa: E402
from pipeline.types import TrainBatch  # noqa: E402

# group name -> (prompt tokens, sampled before the tool output, tool output, sampled after), row means
GROUPS = {"fact": (293, 25, 260, 17), "calculator": (309, 45, 27, 16)}
GROUP_SIZE = 8


def group_batch(shape: tuple[int, int, int, int], vocab: int, seed: int = 0) -> TrainBatch:
    """G right-padded rows sharing a prompt; tokens around the tool output are trained, the output is not."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    prompt, before, tool, after = shape
    spans = [[max(1, round(n * rng.uniform(0.8, 1.2))) for n in (before, tool, after)] for _ in range(GROUP_SIZE)]
    width = prompt + max(sum(s) for s in spans)
    ids = torch.randint(0, vocab, (GROUP_SIZE, width), generator=g)
    ids[:, :prompt] = ids[0, :prompt]
    attn = torch.zeros_like(ids)
    mask = torch.zeros(GROUP_SIZE, width)
    for i, (b, t, a) in enumerate(spans):
        attn[i, :prompt + b + t + a] = 1
        mask[i, prompt:prompt + b] = 1
        mask[i, prompt + b + t:prompt + b + t + a] = 1
    adv = torch.randn(GROUP_SIZE, 1, generator=g).expand(-1, width) * mask
    old = -torch.rand(GROUP_SIZE, width, generator=g) * mask
    return TrainBatch(ids, attn, mask, old, adv, n_policy_tokens=int(mask.sum()), ref_logprobs_BT=old.clone())


@contextlib.contextmanager
def every_position_head(model: torch.nn.Module, rows_N: torch.Tensor, cols_N: torch.Tensor) -> Iterator[None]:
    """The baseline in place of `_head_only_at`: the head, the temperature, the log-softmax and the entropy
    at every kept position (as ours did before, chunking aside), then the trained tokens picked. Log-softmax
    of log-probs is the identity, so the loss and the gradient are the same as ours."""
    def every_position(_head: torch.nn.Module, _args: tuple, logits_BKV: torch.Tensor) -> torch.Tensor:
        logp_BKV = F.log_softmax(logits_BKV.float() / 1.0, dim=-1)  # the benchmark's temperature, 1.0
        with torch.no_grad():  # the entropy at every position, as the update computed it (logged, not trained)
            entropy_BK = -(logp_BKV.exp() * logp_BKV).sum(-1)
        del entropy_BK  # dropped: the picked log-probs give the trained tokens' entropy again (N << B x K)
        return logp_BKV[rows_N, cols_N]

    handle = model.get_output_embeddings().register_forward_hook(every_position)
    try:
        yield
    finally:
        handle.remove()


def seconds(model: torch.nn.Module, batch: TrainBatch, baseline: bool) -> dict[str, float]:
    """One update and one no-grad pass (the reference's), timed; loss and gradient norm must agree."""
    with swapped("_head_only_at", every_position_head if baseline else update._head_only_at):
        return timed_update(model, batch, GROUP_SIZE)


def main(argv: list[str] | None = None) -> None:
    args, model, tokenizer = args_and_base_model(__doc__.splitlines()[0], argv)
    figures: dict[str, dict[str, float]] = {}
    for name, shape in GROUPS.items():
        batch = group_batch(shape, len(tokenizer))
        sides = ("trained_tokens", "every_position")
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for _ in range(args.reps):
            for side in sides:  # alternate, so drift on a noisy machine hits both sides
                runs[side].append(seconds(model, batch, baseline=side == "every_position"))
        total = {side: min(r["update_s"] + r["reference_s"] for r in runs[side]) for side in sides}
        ours, base = runs["trained_tokens"][0], runs["every_position"][0]
        figures[name] = {f"{side}_{k}": round(min(r[k] for r in runs[side]), 2)
                         for side in sides for k in ("update_s", "reference_s")} | {
            "speedup": round(total["every_position"] / total["trained_tokens"], 3),
            "same_loss_and_grad": abs(ours["loss"] - base["loss"]) <= 1e-5 * max(abs(base["loss"]), 1.0)
            and abs(ours["grad_norm"] - base["grad_norm"]) <= 1e-4 * base["grad_norm"],
            "trained_tokens": batch.n_policy_tokens, "width": batch.input_ids_BT.shape[1]}
        print(name, figures[name], flush=True)
    harness.last_line({"groups": figures, "ratio": figures["fact"]["speedup"], "reps": args.reps,
                       "threads": args.threads}, args.quick)


if __name__ == "__main__":
    main()
