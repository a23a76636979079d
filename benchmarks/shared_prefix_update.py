"""Seconds per training update with prefixes shared past the prompt vs at the prompt only, on real groups.

After the cold start, a group's rows often agree far past their prompt: a fact row opens with the same
thought and the same query (the question), so the ~260 tokens of search output after it are the same
too, and the rows part only at the answer. Ours cuts each micro-batch where the fewest token positions
are run (`pipeline.shared_prefix`); the baseline is ours before, which shared the prompt only (TRL and
verl share nothing). Trained tokens inside a shared part are computed once and weighed per row.

The groups are real: the learning_cpu SFT model samples them (rollout settings of its RL stage: group 8,
temperature 1, the real code sandbox and search service started here) for problems drawn from its
training mix, `--groups` per source. Each side runs the same `policy_gradient_step` (DAPO loss with a KL
term, one micro-batch per group, lr 0) and the same no-grad pass (the KL reference's), alternately in
one process; the baseline swaps in a planner that cuts at the prompt.

    python benchmarks/shared_prefix_update.py --run runs/learning_cpu [--groups 4] [--reps 2] [--threads 2]
Last line: one JSON object; "ratio" = prompt-only seconds / ours over all the groups (update + reference
pass; higher is better); per source the positions run and the seconds of each side.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipeline.update as update  # noqa: E402
from benchmarks.learning_cpu import BOTH_TOOLS, FULL, rl_config  # noqa: E402
from benchmarks.update_bench import swapped  # noqa: E402
from flows.services import running_services  # noqa: E402
from pipeline.batching import make_train_batch  # noqa: E402
from pipeline.config.train import DAPOLoss  # noqa: E402
from pipeline.jsonl import read_problems  # noqa: E402
from pipeline.loss import make_policy_loss  # noqa: E402
from pipeline.model import load_policy  # noqa: E402
from pipeline.paths import REPO_ROOT  # noqa: E402
from pipeline.rollout.engine import RolloutEngine  # noqa: E402
from pipeline.shared_prefix import PrefixPlan, common_prefix_lengths, plan_shared_prefix, prefix_classes  # noqa: E402
from pipeline.tools.factory import make_tools  # noqa: E402
from pipeline.types import Group, ScoredGroup, TrainBatch  # noqa: E402
from pipeline.update import UpdateSettings, _first_scored_position  # noqa: E402


def prompt_only(ids_BT: torch.Tensor, first_trained: int) -> PrefixPlan:
    """The baseline's cut: the end of the shortest prompt (rows grouped by their prompt)."""
    length = first_trained - 1
    return PrefixPlan(length, *prefix_classes(common_prefix_lengths(ids_BT), length))


def sample_groups(run: Path, per_source: int, seed: int) -> list[Group]:
    """`per_source` groups of each source of the run's training mix, sampled by its SFT model."""
    cfg = rl_config(FULL, run)
    problems = read_problems(run / "train.jsonl")
    rng = random.Random(seed)
    drawn = [p for source in sorted({p.source for p in problems})
             for p in rng.sample([q for q in problems if q.source == source], per_source)]
    model, tokenizer = load_policy(str(run / "sft"), "float32", "cpu")
    with tempfile.TemporaryDirectory() as logs, \
            running_services(cfg, BOTH_TOOLS, str(REPO_ROOT / "params.yaml"), log_dir=Path(logs)) as urls, \
            RolloutEngine(model, tokenizer, make_tools(cfg, urls), cfg.rollout, seed=seed) as engine:
        return engine.rollout(drawn, cfg.rollout.group_size).groups


def group_batch(group: Group, pad_id: int, seed: int) -> TrainBatch:
    """The group's rows with +-1 advantages (the cost does not depend on them) and a KL reference."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], len(group.trajectories))
    advantages = [np.full(len(t.response_ids), s) for t, s in zip(group.trajectories, signs, strict=True)]
    batch = make_train_batch([ScoredGroup(group, ())], advantages, pad_id)
    return TrainBatch(batch.input_ids_BT, batch.attention_mask_BT, batch.loss_mask_BT, batch.old_logprobs_BT,
                      batch.advantages_BT, batch.n_policy_tokens, ref_logprobs_BT=batch.old_logprobs_BT.clone())


def seconds(model: torch.nn.Module, batch: TrainBatch, baseline: bool) -> dict[str, float]:
    """One update (forward, backward; lr 0 keeps the weights) and one no-grad pass, with the loss and
    gradient norm, which must agree between the sides."""
    size = len(batch)
    settings = UpdateSettings(micro_batch_size=size, grad_clip=1.0, temperature=1.0, share_prompts=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with swapped("plan_shared_prefix", prompt_only if baseline else plan_shared_prefix):
        t0 = time.perf_counter()
        metrics = update.policy_gradient_step(model, optimizer, batch, make_policy_loss(DAPOLoss(kl_coef=0.2)),
                                              settings)
        t1 = time.perf_counter()
        update.masked_logprobs_no_grad(model, batch, size, 1.0)
        return {"update_s": t1 - t0, "reference_s": time.perf_counter() - t1, "loss": metrics["train/loss"],
                "grad_norm": metrics["train/grad_norm"]}


def plan_figures(batch: TrainBatch) -> dict[str, float]:
    ids, first = batch.input_ids_BT, _first_scored_position(batch.loss_mask_BT)
    ours, base = plan_shared_prefix(ids, first), prompt_only(ids, first)
    width = ids.shape[1]
    return {"positions_ours": ours.tokens_run(width), "positions_prompt_only": base.tokens_run(width),
            "cut_past_prompt": ours.length - base.length, "distinct_prefixes": len(ours.unique_U)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=REPO_ROOT / "runs" / "learning_cpu",
                        help="a learning_cpu output directory (its sft/ model and train.jsonl)")
    parser.add_argument("--groups", type=int, default=4, help="groups sampled per source")
    parser.add_argument("--reps", type=int, default=2, help="alternations of the two sides (0: plans only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    groups = sample_groups(args.run, args.groups, args.seed)
    model, tokenizer = load_policy(str(args.run / "sft"), "float32", "cpu")
    rows: dict[str, list[dict[str, float]]] = {}
    for i, group in enumerate(groups):
        batch = group_batch(group, tokenizer.pad_token_id, args.seed + i)
        row = plan_figures(batch)
        runs: dict[str, list[dict[str, float]]] = {"ours": [], "prompt_only": []}
        for _ in range(args.reps):
            for side in runs:  # alternate, so drift on a noisy machine hits both sides
                runs[side].append(seconds(model, batch, baseline=side == "prompt_only"))
        if args.reps:
            row |= {f"{side}_s": min(r["update_s"] + r["reference_s"] for r in runs[side]) for side in runs}
            ours, base = runs["ours"][0], runs["prompt_only"][0]
            row["same_loss_and_grad"] = (abs(ours["loss"] - base["loss"]) <= 1e-5 * max(abs(base["loss"]), 1.0)
                                         and abs(ours["grad_norm"] - base["grad_norm"]) <= 1e-4 * base["grad_norm"])
        print(group.problem.source, group.problem.id, row, flush=True)
        rows.setdefault(group.problem.source, []).append(row)
    figures = {source: {k: round(sum(r[k] for r in rs), 2) for k in rs[0] if k != "same_loss_and_grad"}
               | {"groups": len(rs), "all_same_loss_and_grad": all(r.get("same_loss_and_grad", True) for r in rs)}
               for source, rs in rows.items()}
    total = {k: sum(f.get(k, 0.0) for f in figures.values()) for k in ("ours_s", "prompt_only_s",
                                                                      "positions_ours", "positions_prompt_only")}
    ratio = round(total["prompt_only_s"] / total["ours_s"], 3) if args.reps else None
    print(json.dumps({"sources": figures, "ratio": ratio,
                      "positions_ratio": round(total["positions_prompt_only"] / total["positions_ours"], 3),
                      "groups_per_source": args.groups, "reps": args.reps, "threads": args.threads}))


if __name__ == "__main__":
    main()
