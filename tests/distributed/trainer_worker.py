"""One rank of the end-to-end test: `pipeline.train`'s own set_up / sampling / update step
with `distributed.enabled`, a DeepSpeed checkpoint, the final export, then a resumed run; then the
same set-up with dynamic sampling by refill (each rank refilling from its share of a window).

The steps are the ones `pipeline.train.run` makes (its MLflow and metric files are left out).
Rank 0 writes what every rank saw to OUT/trainer.pt and OUT/refill.pt.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from pipeline.training_run.checkpoint import TrainerState
from pipeline.config import load_config
from pipeline.distributed.checkpointing import for_each_full_parameter
from pipeline.train import set_up, update
from tests.helpers.training import collect


def gathered(tr) -> torch.Tensor:
    parts: list[torch.Tensor] = []
    for_each_full_parameter(tr.replicas, lambda _, t: parts.append(t.detach().flatten().clone()))
    return torch.cat(parts)


def one_step(tr) -> dict:
    collected = collect(tr)
    kept, rollout_metrics = collected.kept, collected.metrics
    metrics = update(tr, kept)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [(g.group.problem.id, g.group.trajectories[0].response_ids) for g in kept])
    return {"kept_same_on_all_ranks": all(e == everyone[0] for e in everyone), "n_kept": len(kept),
            "kept": everyone[0],
            "trajectories": rollout_metrics["rollout/trajectories"], "metrics": metrics,
            "rollout_matches_policy": rollout_model_matches(tr)}


def rollout_model_matches(tr) -> bool:
    """The rollout engine samples from the trained weights (a refreshed copy under ZeRO-3)."""
    full = gathered(tr)
    return bool(torch.equal(full, torch.cat([p.detach().flatten() for p in tr.engine.model.parameters()])))


def main(params: Path, out: Path) -> None:
    cfg = load_config(params)
    tr = set_up(cfg, {})
    first = one_step(tr)
    saved = tr.replicas.save_checkpoint(tr.plan.folder, TrainerState(1, tr.stream.cursor, tr.engine.rollouts_started),
                                        tr.scheduler, tr.tokenizer)
    before_second = gathered(tr)
    second = one_step(tr)
    after = gathered(tr)
    tr.replicas.save_model(tr.tokenizer, Path(cfg.train.output_dir))
    resumed = set_up(cfg, {}, replace(tr.plan, resume=True, start_from=saved))  # every rank loads what the plan names
    resumed_state = resumed.start
    third = one_step(resumed)
    result = {"first": first, "second": second, "after": after, "before_second": before_second,
              "resumed_state": resumed_state, "resumed_after": gathered(resumed), "third": third,
              "world": dist.get_world_size()}
    if dist.get_rank() == 0:
        torch.save(result, out / "trainer.pt")
    refilled(params, out)


def refilled(params: Path, out: Path) -> None:
    """Three steps with `train.sampling.refill_dropped_groups` (window of 3 x 2 problems): per step, the window,
    the problems every rank saw in order, the kept ones and the cursor."""
    cfg = load_config(params, overrides={
        "train.algorithm.dynamic_sampling": True, "train.sampling.refill_dropped_groups": True, "train.sampling.max_gen_rounds": 2,
        "train.checkpoints.dir": str(out / "refill_run"), "train.output_dir": str(out / "refill_policy")})
    tr = set_up(cfg, {})
    steps = []
    for _ in range(3):
        window = [p.id for p in copy.deepcopy(tr.stream).take(6)]
        collected = collect(tr)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, ([g.group.problem.id for g in collected.seen],
                                          [g.group.problem.id for g in collected.kept]))
        update(tr, collected.kept)
        steps.append({"window": window, "seen_kept": everyone, "cursor": tr.stream.cursor,
                      "collector": type(tr.sampler).__name__, "metrics": collected.metrics})
    if dist.get_rank() == 0:
        torch.save(steps, out / "refill.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
