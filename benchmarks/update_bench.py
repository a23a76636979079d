"""What the training-update benchmarks share: their command line, the base model, and one function of
`pipeline.trainer.update` swapped for its baseline while the baseline side runs (both sides in one process).
Quick mode (`benchmarks.harness`): one group, one pass a side, on the quick workspace's tiny model."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType

import time

import torch

import pipeline.trainer.update as update
from benchmarks import harness
from benchmarks.preset_run import workspace
from pipeline.config.train import DAPOLoss
from pipeline.rl.loss import make_policy_loss
from pipeline.model import load_policy
from pipeline.types import TrainBatch


def args_and_base_model(description: str, argv: Sequence[str] | None, groups: int | None = None
                        ) -> tuple[argparse.Namespace, torch.nn.Module, object]:
    """`--reps` (alternations of the two sides), `--threads`, `--quick`, and `--groups` where a default is given;
    SmolLM2-135M-Instruct from models/base, fp32 (quick: the quick workspace's tiny model)."""
    parser = argparse.ArgumentParser(description=description)
    if groups is not None:
        parser.add_argument("--groups", type=int, default=groups)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    quick = {"reps": 1, "threads": 1} | ({"groups": 1} if groups is not None else {})
    args = harness.parse(parser, argv, quick)
    torch.set_num_threads(args.threads)
    with workspace(None, args.quick) as root:
        model_dir = root / "models" / ("sft" if args.quick else "base")
        model, tokenizer = load_policy(str(model_dir), "float32", "cpu")
    return args, model, tokenizer


@contextlib.contextmanager
def swapped(name: str, replacement: Callable, module: ModuleType = update) -> Iterator[None]:
    """`<module>.<name>` (`pipeline.trainer.update` unless given) is `replacement` while open (the module looks
    its helpers up at call time)."""
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def timed_update(model: torch.nn.Module, batch: TrainBatch, micro_batch_size: int,
                 share_prefixes: bool = True, autocast: torch.dtype | None = None) -> dict[str, float]:
    """One update (forward, backward; DAPO loss with a KL term; lr 0 keeps the weights) and one no-grad pass
    (the KL reference's, which shares prefixes either way), timed, with the update's loss and gradient norm,
    which must agree between the sides of a benchmark (unless they differ in precision)."""
    settings = update.UpdateSettings(micro_batch_size=micro_batch_size, grad_clip=1.0, temperature=1.0,
                                     share_prefixes=share_prefixes, autocast=autocast)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    t0 = time.perf_counter()
    metrics = update.policy_gradient_step(model, optimizer, batch, make_policy_loss(DAPOLoss(kl_coef=0.2)), settings)
    t1 = time.perf_counter()
    update.masked_logprobs_no_grad(model, batch, micro_batch_size, 1.0, autocast)
    return {"update_s": t1 - t0, "reference_s": time.perf_counter() - t1, "loss": metrics["train/loss"],
            "grad_norm": metrics["train/grad_norm"]}
