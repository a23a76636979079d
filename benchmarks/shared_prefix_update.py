"""Seconds per training update with the rows run as a prefix tree vs prompt-shared padded rows, on real groups.

After the cold start, a group's rows often agree far past their prompt: a fact row opens with the same
thought and the same query (the question), so the ~260 tokens of search output after it are the same
too, and the rows part only at the answer; and rows differ in length, so a padded batch runs padding.
Ours runs every distinct prefix of a micro-batch's rows once (`pipeline.trainer.prefix_tree`: the tree's nodes
packed into one sequence under a tree attention mask, no padding). The baseline is ours before: each
distinct prompt once, then all rows' continuations in one batch padded to the longest row (TRL and verl
share nothing). With --checkpointing both sides run under gradient checkpointing (params.yaml's default),
where the trainer ran the rows plainly padded before (the prompt-sharing KV cache cannot be checkpointed):
that is then the baseline.

The rollout shares prefills the same way (`hf_backend.prefill_key`): rows admitted together with the
same context are prefilled once, copies of a fact row after the same search included; its baseline
prefilled only a group's fresh copies of the prompt once. Both rollouts are timed here too.

The groups are real: the SFT model of a workspace where the learning-cpu preset ran (`benchmarks.preset_run`)
samples them (the preset's RL rollout settings: group 8, temperature 1, the real code sandbox and search service
started here) for problems drawn from its training mix, `--groups` per source. Each side runs the same
`policy_gradient_step` (DAPO loss with a KL term, one micro-batch per group, lr 0) and the same no-grad pass (the
KL reference's), alternately in one process; the baseline swaps in the old forward (`prompt_only`).

    python benchmarks/shared_prefix_update.py [--run WORKSPACE] [--groups 4] [--reps 2] [--threads 2]
                                              [--checkpointing] [--quick]
`--run`: a pipeline workspace where the learning-cpu preset ran (default: this repo; e.g. after
`dvc exp apply learning-cpu-s0`), its models/sft and data/curated/train.jsonl.
Last line: one JSON object; "ratio" = the baseline's seconds (prompt-only; padded with --checkpointing; named
in "baseline") / ours over all the groups (update + reference pass; higher is better); per source the token
positions each side runs and the seconds of each side;
"rollout_ratio" = the baseline's rollout seconds / ours (the fastest of `--reps` each), with prefilled tokens.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import tempfile
from collections.abc import Hashable
from pathlib import Path

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipeline.trainer.update as update  # noqa: E402
from benchmarks import harness  # noqa: E402
from benchmarks.preset_run import preset_config, preset_run_or_exit, workspace  # noqa: E402
from benchmarks.update_bench import swapped, timed_update  # noqa: E402
from flows.common import tools_needed  # noqa: E402
from flows.services import running_services  # noqa: E402
from pipeline.rollout.sequence import unique_rows  # noqa: E402
from pipeline.trainer.batching import make_train_batch  # noqa: E402
from pipeline.jsonl import read_problems  # noqa: E402
from pipeline.model import load_policy  # noqa: E402
from pipeline.rollout.backends import hf as hf_backend  # noqa: E402
from pipeline.rollout.engine import RolloutEngine  # noqa: E402
from pipeline.rollout.backends.hf import KV  # noqa: E402
from pipeline.rollout.sequence import Sequence  # noqa: E402
from pipeline.trainer.prefix_tree import prefix_tree  # noqa: E402
from pipeline.tools.factory import make_tools  # noqa: E402
from pipeline.types import Group, ScoredGroup, TrainBatch  # noqa: E402

QUICK = {"groups": 1, "reps": 1, "threads": 1}


def prompt_only(model: torch.nn.Module, batch: TrainBatch, _packed: object, _attention: object,
                rows_N: torch.Tensor, tokens_N: torch.Tensor) -> torch.Tensor:
    """The baseline in place of `_logits_over_prefix_tree` (ours before; the packed tree and its attention are
    ignored): each distinct prompt (the tokens before the earliest trained one) once, its KV repeated for the rows,
    then every row's continuation in one batch padded to the longest row. (Where `packing_pays` says no, both
    sides run the plain padded forward.)"""
    prefix_len = int(tokens_N.min()) - 1
    prefix_BL = batch.input_ids_BT[:, :prefix_len]
    unique, expand = unique_rows([tuple(row) for row in prefix_BL.tolist()])
    expand_B = torch.tensor(expand)
    out = model(input_ids=prefix_BL[unique], use_cache=True, logits_to_keep=1)
    shared = [(layer.keys.index_select(0, expand_B), layer.values.index_select(0, expand_B))
              for layer in out.cache.layers]
    T = batch.input_ids_BT.shape[1]
    with update._head_only_at(model, rows_N, tokens_N - 1 - prefix_len):
        return model(input_ids=batch.input_ids_BT[:, prefix_len:], attention_mask=batch.attention_mask_BT,
                     cache=DynamicCache(ddp_cache_data=shared), use_cache=True, logits_to_keep=T - prefix_len).logits


def old_prefill_key(seq: Sequence, past: KV | None) -> Hashable:
    """The rollout baseline in place of `hf_backend.prefill_key` (ours before): only fresh copies of a
    prompt shared a prefill; a row re-admitted after a tool call was prefilled on its own."""
    return tuple(seq.context_ids) if past is None else id(seq)


def sample_groups(root: Path, per_source: int, seed: int, reps: int) -> tuple[list[Group], dict[str, float]]:
    """`per_source` groups of each source of the training mix of the preset's workspace `root`, sampled by its SFT
    model; with the rollout's seconds and prefilled tokens, ours and the baseline's (alternately, `reps` times each)."""
    run = preset_run_or_exit(root)
    problems = read_problems(run.train)
    rng = random.Random(seed)
    drawn = [p for source in sorted({p.source for p in problems})
             for p in rng.sample([q for q in problems if q.source == source], per_source)]
    model, tokenizer = load_policy(str(run.sft), "float32", "cpu")
    figures: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as work:
        cfg = preset_config(run.root, Path(work))
        with running_services(cfg, tools_needed(run.train), str(run.preset), log_dir=Path(work) / "logs") as urls:
            for _ in range(max(reps, 1)):
                for side, key in (("ours", hf_backend.prefill_key), ("old_key", old_prefill_key))[:2 if reps else 1]:
                    with swapped("prefill_key", key, hf_backend), \
                            RolloutEngine(model, tokenizer, make_tools(cfg.rollout.tools, cfg.sandbox, cfg.search, urls), cfg.rollout, seed=seed) as engine:
                        result = engine.rollout(drawn, cfg.rollout.group_size)
                    figures.setdefault(f"rollout_{side}_s", []).append(result.stats.wall_s)
                    figures[f"prefill_tokens_{side}"] = [float(result.stats.prefill_tokens)]
                    if side == "ours":
                        groups = result.groups
    return groups, {k: round(min(v), 2) for k, v in figures.items()}


def group_batch(group: Group, pad_id: int, seed: int) -> TrainBatch:
    """The group's rows with +-1 advantages (the cost does not depend on them) and a KL reference."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], len(group.trajectories))
    advantages = [np.full(len(t.response_ids), s) for t, s in zip(group.trajectories, signs, strict=True)]
    batch = make_train_batch([ScoredGroup(group, ())], advantages, pad_id)
    return dataclasses.replace(batch, ref_logprobs_BT=batch.old_logprobs_BT.clone())


def seconds(model: torch.nn.Module, batch: TrainBatch, baseline: bool, checkpointing: bool) -> dict[str, float]:
    if checkpointing:  # the baseline: rows padded, nothing shared in the update
        return timed_update(model, batch, len(batch), share_prefixes=not baseline)
    with swapped("_logits_over_prefix_tree", prompt_only if baseline else update._logits_over_prefix_tree):
        return timed_update(model, batch, len(batch))


def positions(batch: TrainBatch) -> dict[str, int]:
    """Token positions each side runs, and the batch's real tokens (rows run whole, no padding)."""
    ids, mask = batch.input_ids_BT, batch.loss_mask_BT.bool()
    lengths = batch.attention_mask_BT.sum(1).tolist()
    prefix_len = int(mask.any(0).int().argmax()) - 1  # before the earliest trained token
    prompts = len(unique_rows([tuple(row) for row in ids[:, :prefix_len].tolist()])[0])
    tree = prefix_tree(ids, lengths)
    return {"positions_tree": tree.positions(), "positions_prompt_only": prompts * prefix_len + len(batch) * (
        ids.shape[1] - prefix_len), "positions_padded": ids.numel(), "real_tokens": sum(lengths),
        "shared_nodes": sum(1 for node in tree.walk() if len(node.rows) > 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None,
                        help="a pipeline workspace where the learning-cpu preset ran (its models/sft and "
                             "data/curated/train.jsonl; default: this repo)")
    parser.add_argument("--groups", type=int, default=4, help="groups sampled per source")
    parser.add_argument("--reps", type=int, default=2, help="alternations of the two sides (0: positions only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpointing", action="store_true",
                        help="both sides under gradient checkpointing; the baseline runs the rows padded")
    args = harness.parse(parser, argv, QUICK)
    torch.set_num_threads(args.threads)
    with workspace(args.run, args.quick) as root:
        groups, rollout = sample_groups(root, args.groups, args.seed, args.reps)
        print("rollout", rollout, flush=True)
        model, tokenizer = load_policy(str(preset_run_or_exit(root).sft), "float32", "cpu")
    if args.checkpointing:
        model.gradient_checkpointing_enable()  # active in train mode, which policy_gradient_step sets
    baseline = "padded" if args.checkpointing else "prompt_only"
    rows: dict[str, list[dict[str, float]]] = {}
    for i, group in enumerate(groups):
        batch = group_batch(group, tokenizer.pad_token_id, args.seed + i)
        row = positions(batch)
        runs: dict[str, list[dict[str, float]]] = {"ours": [], baseline: []}
        for _ in range(args.reps):
            for side in runs:  # alternate, so drift on a noisy machine hits both sides
                runs[side].append(seconds(model, batch, side == baseline, args.checkpointing))
        if args.reps:
            row |= {f"{side}_s": min(r["update_s"] + r["reference_s"] for r in runs[side]) for side in runs}
            ours, base = runs["ours"][0], runs[baseline][0]
            row["same_loss_and_grad"] = (abs(ours["loss"] - base["loss"]) <= 1e-5 * max(abs(base["loss"]), 1.0)
                                         and abs(ours["grad_norm"] - base["grad_norm"]) <= 1e-4 * base["grad_norm"])
        print(group.problem.source, group.problem.id, row, flush=True)
        rows.setdefault(group.problem.source, []).append(row)
    figures = {source: {k: round(sum(r[k] for r in rs), 2) for k in rs[0] if k != "same_loss_and_grad"}
               | {"groups": len(rs), "all_same_loss_and_grad": all(r.get("same_loss_and_grad", True) for r in rs)}
               for source, rs in rows.items()}
    total = {k: sum(f.get(k, 0.0) for f in figures.values()) for k in ("ours_s", f"{baseline}_s",
                                                                      "positions_tree", f"positions_{baseline}")}
    ratio = round(total[f"{baseline}_s"] / total["ours_s"], 3) if args.reps else None
    rollout_ratio = round(rollout["rollout_old_key_s"] / rollout["rollout_ours_s"], 3) if args.reps else None
    harness.last_line({"sources": figures, "ratio": ratio, "rollout": rollout, "rollout_ratio": rollout_ratio,
                       "positions_ratio": round(total[f"positions_{baseline}"] / total["positions_tree"], 3),
                       "groups_per_source": args.groups, "reps": args.reps, "threads": args.threads,
                       "checkpointing": args.checkpointing, "baseline": baseline}, args.quick)


if __name__ == "__main__":
    main()
