"""Several seeds of one experiment in one table: each headline number's mean and 95 % confidence interval, and
the pooled sign test over every seed's flips.

Pure functions of the seeds' headline numbers (`pipeline.tracking.headline`: each seed's
`metrics/headline/train.json` and `metrics/headline/eval.json` merged, key -> value); reading them from the
experiments is the caller's (`flows.experiment --summarise`).

- The interval is Student's t over the seeds, mean +- t(0.975, n - 1) * s / sqrt(n) with s the sample standard
  deviation: a seed is one draw of the whole pipeline (data order, sampling, initial rollouts), and with three to
  five of them the normal interval would be far too narrow. One seed has no interval.
- `gain` (the policy's accuracy minus the SFT baseline's, `accuracy - acc_sft`) is summarised per seed like the
  others: the interval of the paired difference is narrower than the two accuracies' intervals suggest, since a
  seed's SFT and policy share its held-out problems and its cold start.
- The per-seed p-values are shown but not averaged (a mean of p-values tests nothing). The seeds' flips are
  pooled instead: every seed's problems are independent evaluations of a problem under another seed, so the
  to_right and to_wrong counts add up, and the exact two-sided sign test on the sums is the evidence of all seeds
  together (`pipeline.evaluation.flips.sign_test_p`, as each seed's own).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats  # installed with gensim, a declared dependency

from pipeline.evaluation.flips import sign_test_p

CONFIDENCE = 0.95
NOT_AVERAGED = ("p_value",)  # shown per seed, pooled through the flips instead
FLIP_KEYS = ("to_right", "to_wrong")
GAIN, ACCURACY, SFT_ACCURACY = "gain", "accuracy", "acc_sft"


@dataclass(frozen=True)
class Interval:
    """A headline number over the seeds that report it: mean and the t-interval's bounds (None for one seed)."""

    n: int
    mean: float
    low: float | None
    high: float | None


@dataclass(frozen=True)
class PooledFlips:
    seeds: int  # the seeds whose flips were added
    to_right: int
    to_wrong: int
    sign_test_p: float


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean and two-sided Student-t confidence interval of `values` (one per seed)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to summarise")
    mean = math.fsum(values) / n
    if n == 1:
        return Interval(1, mean, None, None)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)


def with_gain(headline: Mapping[str, float]) -> dict[str, float]:
    """A seed's headline plus `gain` (accuracy - acc_sft) when it has both."""
    out = dict(headline)
    if ACCURACY in out and SFT_ACCURACY in out:
        out[GAIN] = out[ACCURACY] - out[SFT_ACCURACY]
    return out


def summarise_seeds(per_seed: Mapping[str, Mapping[str, float]]) -> dict[str, Interval]:
    """Each headline key (and `gain`) -> its interval over the seeds that report it, keys in first-seen order."""
    rows = [with_gain(h) for h in per_seed.values()]
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in NOT_AVERAGED))
    return {k: t_interval([r[k] for r in rows if k in r]) for k in keys}


def pooled_flips(per_seed: Mapping[str, Mapping[str, float]]) -> PooledFlips | None:
    """The flips of every seed that reports them, added, and the exact sign test on the sums; None if none does."""
    counted = [h for h in per_seed.values() if all(k in h for k in FLIP_KEYS)]
    if not counted:
        return None
    up, down = (sum(int(h[k]) for h in counted) for k in FLIP_KEYS)
    return PooledFlips(len(counted), up, down, sign_test_p(up, down))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def render_summary(per_seed: Mapping[str, Mapping[str, float]]) -> str:
    """The seeds' table (a row per headline number: n, mean, 95 % interval, each seed's value) and the pooled
    sign test's line."""
    names = list(per_seed)
    summary = summarise_seeds(per_seed)
    rows = [[key, str(iv.n), _fmt(iv.mean), f"[{_fmt(iv.low)}, {_fmt(iv.high)}]",
             *(_fmt(with_gain(per_seed[s]).get(key)) for s in names)] for key, iv in summary.items()]
    rows += [[key, "", "", "", *(_fmt(per_seed[s].get(key)) for s in names)] for key in NOT_AVERAGED
             if any(key in per_seed[s] for s in names)]
    head = ["headline", "n", "mean", f"{100 * CONFIDENCE:.0f} % CI (t)", *names]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *rows]]
    pooled = pooled_flips(per_seed)
    if pooled is not None:
        lines.append(f"Pooled flips over {pooled.seeds} seed{'s' * (pooled.seeds != 1)}: {pooled.to_right} wrong -> "
                     f"right, {pooled.to_wrong} right -> wrong (two-sided sign test p = {pooled.sign_test_p:.3g}).")
    return "\n".join(lines)
