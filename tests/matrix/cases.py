"""The configuration matrix: its factors, a pairwise covering sample of them, and the invariants of one step.

The full product of the documented factors (6 algorithms x 3 protocols x 3 TEPO modes x 2 finetunes x
2 precisions x 2 old-log-prob sources x 2 sampling modes = 864 steps) would take most of the CI budget.
Defects of this kind sit where two parts meet, so the sample covers every *pair* of factor values at
least once (a pairwise covering array, built greedily below from a fixed order: deterministic, and the
test asserts its coverage); at least 6 x 3 = 18 rows are needed for the two largest factors, and the
greedy cover gives about that. Data parallelism and the vLLM backend are sampled from these rows
(`DISTRIBUTED_ROWS`, and tests/vllm/test_matrix_vllm.py).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.rl.advantage import token_advantages
from pipeline.rl.anchor import step_openings
from pipeline.config import RunConfig
from pipeline.rl.loss import make_policy_loss
from pipeline.types import ScoredGroup, TrainBatch
from tests.helpers.training import collect

ALGORITHMS = {  # name -> (train.algorithm mapping, kl_coef)
    "dapo": {"kind": "dapo"}, "dapo+kl": {"kind": "dapo", "kl_coef": 0.1},
    "grpo": {"kind": "grpo"}, "grpo+kl": {"kind": "grpo", "kl_coef": 0.1},
    "dr_grpo": {"kind": "dr_grpo"}, "dr_grpo+kl": {"kind": "dr_grpo", "kl_coef": 0.1},
}
FACTORS: dict[str, tuple[str, ...]] = {
    "algorithm": tuple(ALGORITHMS),
    "protocol": ("tapo", "torl", "search-r1"),
    "tepo": ("off", "sparse", "dense"),
    "finetune": ("full", "lora"),
    "autocast": ("none", "bfloat16"),
    "logprobs_source": ("rollout", "recompute"),
    "sampling": ("rounds", "refill"),
}
Row = dict[str, str]


def pairs_of(row: Row) -> set[tuple[tuple[str, str], tuple[str, str]]]:
    return set(itertools.combinations(sorted(row.items()), 2))


def all_pairs() -> set[tuple[tuple[str, str], tuple[str, str]]]:
    out = set()
    for (f, fv), (g, gv) in itertools.combinations(sorted(FACTORS.items()), 2):
        out |= {((f, a), (g, b)) for a in fv for b in gv}
    return out


def pairwise_rows() -> list[Row]:
    """Greedy pairwise cover: repeatedly take the row of the full product that covers most uncovered pairs
    (the first such in product order, so the sample is the same on every run)."""
    names = list(FACTORS)
    candidates = [dict(zip(names, values, strict=True)) for values in itertools.product(*FACTORS.values())]
    uncovered, rows = all_pairs(), []
    while uncovered:
        best = max(candidates, key=lambda r: len(pairs_of(r) & uncovered))
        rows.append(best)
        uncovered -= pairs_of(best)
    return rows


def row_id(row: Row) -> str:
    return "-".join(row[f] for f in FACTORS)


# ZeRO-2 on 2 gloo ranks: one row per protocol, full weights (LoRA is refused there), both sampling modes.
def distributed_rows(rows: list[Row]) -> list[Row]:
    full = [r for r in rows if r["finetune"] == "full"]
    picked = []
    for protocol, sampling in (("tapo", "refill"), ("torl", "rounds"), ("search-r1", "refill")):
        match = [r for r in full if r["protocol"] == protocol and r["sampling"] == sampling] or \
                [r for r in full if r["protocol"] == protocol]
        picked.append(match[0])
    return picked


# The vLLM backend (its own environment): one tapo row (an engine start costs ~1.5 min on 2 CPU cores), TEPO off
# (its records carry no entropies for TEPO to read: refused or computed by the trainer, not sampled here), in
# rounds (the rollout runs apart from the trainer).
def vllm_rows(rows: list[Row]) -> list[Row]:
    picked = []
    for protocol in ("tapo",):
        match = [r for r in rows if r["protocol"] == protocol and r["tepo"] == "off"] or \
                [r for r in rows if r["protocol"] == protocol]
        picked.append(match[0] | {"tepo": "off", "sampling": "rounds"})
    return picked


def overrides(row: Row, root: Path, model_dir: Path, train_file: Path, tool_url: str) -> dict[str, Any]:
    """params.yaml overrides of one row: small and fast, every factor set explicitly."""
    algorithm = dict(ALGORITHMS[row["algorithm"]])
    refill = row["sampling"] == "refill"
    if refill:  # the refill replaces dropped groups, so it needs dynamic sampling (GRPO's is off by default)
        algorithm["dynamic_sampling"] = True
    dropping = algorithm.get("dynamic_sampling", algorithm["kind"] == "dapo")
    out = {
        "run.tracking_uri": f"sqlite:///{root / 'mlruns.db'}", "run.torch_threads": 1,
        "train.init_model": str(model_dir), "train.train_file": str(train_file),
        "train.checkpoints.dir": str(root / "ckpt"), "train.output_dir": str(root / "policy"),
        "train.update.gradient_checkpointing": False, "train.optimizer.lr": 1e-3, "train.sampling.prompts_per_step": 2,
        "train.sampling.max_gen_rounds": 2, "train.update.micro_batch_size": 4, "train.algorithm": algorithm,
        "train.update.ppo_mini_batches": 1, "train.optimizer.warmup_steps": 0, "train.optimizer.lr_decay": "constant",
        "train.sampling.balance_sources": False,
        "train.finetune": {"kind": row["finetune"], "r": 4, "alpha": 8.0} if row["finetune"] == "lora"
        else {"kind": "full"},
        "train.update.autocast": row["autocast"], "train.update.logprobs_source": row["logprobs_source"],
        "train.sampling.refill_dropped_groups": refill,
        "train.sampling.anchor_dropped_tokens": 4 if dropping and algorithm.get("kl_coef", 0.0) > 0 else 0,
        "rollout.protocol": row["protocol"], "rollout.group_size": 4, "rollout.max_policy_tokens": 64,
        "rollout.max_total_tokens": 1024, "rollout.max_tool_calls": 1, "rollout.max_turns": 2,
        "rollout.max_tool_output_chars": 200, "search.top_k": 1,
        "reward.overlong_buffer": 16, "reward.tepo": {"kind": row["tepo"]},
    }
    if row["protocol"] == "torl":  # ToRL's rewards: -1 for a wrong answer, -0.5 for code that failed
        out |= {"reward.wrong_answer_reward": -1.0, "reward.code_penalty": -0.5}
    return out


def check_rewards(cfg: RunConfig, groups: list[ScoredGroup]) -> None:
    """Each term inside its documented range, and the total their sum."""
    rc = cfg.reward
    for g in groups:
        for r in g.rewards:
            assert 0.0 <= r.accuracy <= 1.0 and -1.0 <= r.length <= 0.0, r
            assert r.format in (0.0, rc.format_penalty) and r.code_penalty in (0.0, rc.code_penalty), r
            assert -(1.0 - rc.wrong_answer_reward) - 1e-9 <= r.entropy <= 0.0, r
            outcome = rc.wrong_answer_reward + (1.0 - rc.wrong_answer_reward) * r.accuracy if r.format_ok \
                else rc.format_penalty
            assert math.isclose(r.total, outcome + r.length + r.code_penalty + r.entropy, abs_tol=1e-9), r


def check_entropies(groups: list[ScoredGroup]) -> None:
    """Every entropy a step can read (TEPO reads the policy tokens') is a real, non-negative number, and a
    trajectory's are not all zero (a zero standing for "not recorded")."""
    for g in groups:
        for t in g.group.trajectories:
            assert len(t.entropies) == len(t.response_ids)
            policy = [e for e, m in zip(t.entropies, t.loss_mask, strict=True) if m]
            assert all(isinstance(e, float) and math.isfinite(e) and e >= 0.0 for e in policy), policy
            assert not policy or any(e > 0.0 for e in policy), "every entropy 0.0: not recorded"


def check_dropped_have_zero_advantage(tr, dropped: list[ScoredGroup], anchored: list[ScoredGroup]) -> None:
    tc, tepo = tr.cfg.train, tr.tepo
    for a in token_advantages(dropped + anchored, tc.algorithm, tepo, tr.keep):
        assert np.all(a == 0.0)


def check_tool_output_gets_no_gradient(tr, batch: TrainBatch, groups: list[ScoredGroup]) -> None:
    """d loss / d log pi(token) is exactly 0 at every tool-output token (and every mask-0 token), and the
    batch's masks cover each recorded tool-output span; some policy token does get a gradient."""
    trajs = [t for g in groups for t in g.group.trajectories]
    n_outputs = 0
    for row, t in enumerate(trajs):
        start = len(t.prompt_ids)
        for call in t.tool_calls:
            a, b = call.output_span
            assert torch.all(batch.loss_mask_BT[row, start + a:start + b] == 0)
            assert torch.all(batch.advantages_BT[row, start + a:start + b] == 0)
            n_outputs += b - a
    logprobs = batch.old_logprobs_BT.detach().clone().requires_grad_(True)
    loss = make_policy_loss(tr.cfg.train.algorithm, tr.cfg.rollout.max_policy_tokens)
    loss.fn(logprobs, batch).loss_sum.backward()
    grad = logprobs.grad
    assert torch.all(grad[batch.loss_mask_BT == 0] == 0.0)
    assert n_outputs > 0
    trained = (batch.loss_mask_BT == 1) & (batch.advantages_BT != 0)
    assert bool(trained.any()) == bool((grad[batch.loss_mask_BT == 1] != 0).any()) or tr.cfg.train.algorithm.kl_coef > 0


def check_dropped_rows_of_the_batch_train_nothing(batch: TrainBatch, groups: list[ScoredGroup],
                                                  anchored: list[ScoredGroup]) -> None:
    """The batch's rows of dropped groups (their openings) have zero advantage on every token, and the kept
    groups' rows carry some."""
    openings = {id(g) for g in anchored}
    row, kept_rows = 0, []
    for g in groups:
        n = len(g.group.trajectories)
        if id(g) in openings:
            assert torch.all(batch.advantages_BT[row:row + n] == 0.0)
        else:
            kept_rows += range(row, row + n)
        row += n
    assert not kept_rows or bool((batch.advantages_BT[kept_rows] != 0).any())


def check_metrics(cfg: RunConfig, metrics: dict[str, float]) -> None:
    assert metrics["train/skipped"] == 0.0
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/approx_kl", "train/ref_kl"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["train/entropy"] > 0.0 and metrics["train/approx_kl"] >= 0.0 and metrics["train/ref_kl"] >= 0.0
    if cfg.train.update.logprobs_source == "recompute":  # old log-probs from the update's own forward: ratio exactly 1
        assert metrics["train/approx_kl"] == 0.0 and metrics["train/clip_low"] == metrics["train/clip_high"] == 0.0


def collect_until_kept(tr, tries: int = 3) -> tuple[list[ScoredGroup], list[ScoredGroup]]:
    """The step's groups (kept, anchored openings), every collection checked; a collection that keeps nothing
    is a step the trainer skips, so (as the training loop would) the next one is drawn, up to `tries`.
    Identical on every rank of a data-parallel job (the groups are all-gathered)."""
    for _ in range(tries):
        collected = collect(tr)
        anchored = step_openings(collected.kept, collected.dropped, tr.cfg.train.sampling.anchor_dropped_tokens)
        check_rewards(tr.cfg, collected.seen)
        check_entropies(collected.seen)
        check_dropped_have_zero_advantage(tr, collected.dropped, anchored)
        assert all(tr.keep(g) for g in collected.kept)
        if collected.kept:
            return collected.kept, anchored
    raise AssertionError(f"no informative group in {tries} collections: the step has nothing to check")
