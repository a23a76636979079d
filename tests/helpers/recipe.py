"""The plain training recipe tests start from.

params.yaml holds the main job's tuned recipe: a KL anchor to the SFT model with anchored openings of dropped
groups, refilled dynamic sampling, two mini-batches, a cosine schedule with warm-up, a bf16 update and balanced
sources. A test that is not about one of those knobs starts from this plain recipe instead, so what it checks
does not move when the main job is retuned; a test about a knob sets it itself.
"""

from __future__ import annotations

from typing import Any

PLAIN_RECIPE: dict[str, Any] = {
    "train.algorithm.kl_coef": 0.0, "train.sampling.anchor_dropped_tokens": 0, "train.sampling.refill_dropped_groups": False,
    "train.update.ppo_mini_batches": 1, "train.optimizer.lr_decay": "constant", "train.optimizer.warmup_steps": 0, "train.optimizer.min_lr_ratio": 0.0,
    "train.update.autocast": "none", "train.sampling.balance_sources": False,
}


def nested(dotted: dict[str, Any]) -> dict[str, Any]:
    """`{"a.b": 1}` as `{"a": {"b": 1}}`, to merge into a params mapping."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def plain_params(params: dict[str, Any]) -> dict[str, Any]:
    """A params mapping (read from params.yaml) with the plain recipe merged in."""
    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        for key, value in extra.items():
            base[key] = merge(dict(base.get(key) or {}), value) if isinstance(value, dict) else value
        return base
    return merge(params, nested(PLAIN_RECIPE))
