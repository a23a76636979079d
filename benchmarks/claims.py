"""The papers' claims as DVC experiments, side by side: DAPO, TEPO sparse and dense, tool output unmasked, and TAPO
Table 3's ablations (no search, no code, no think), each arm one experiment per seed on the main job's mix and budget.

    python -m benchmarks.claims [--repo PATH] [--arms dapo tepo-sparse ...] [--png claims.png]

An arm is a preset (`configs/experiments/<arm>.yaml`, run by `python -m flows.experiment`) or `dapo`, the main job
itself (`dvc exp run -n dapo-s<seed> -S run.seed=<seed>`). Every experiment named `<arm>-s<seed>` in the repo is
read from its git ref: the evaluate stage's comparison (`metrics/eval_compare.json`: the RL policy and the SFT
model on the held-out problems, greedy) and the training history (`metrics/train_history.jsonl`). Printed: a
markdown table, one row per experiment (held-out accuracy per source and overall, its gain over the arm's own SFT
model, right tool, tool calls per problem; over the last quarter of training: reward, calls per trajectory, the
share of entropy-reducing calls, the policy's entropy and KL to the SFT model); with --png, the training curves
of every experiment and the held-out accuracy per arm. Last line: one JSON object with the same figures.
`--quick` reads and runs nothing: each arm's command for seed 0, made from today's params.yaml and the arm's preset
(both loaded strictly), and the experiments the repo holds.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

from benchmarks import harness
from pipeline.paths import REPO_ROOT

ARMS = ("dapo", "tepo-sparse", "tepo-dense", "no-tool-mask", "no-think", "no-search", "no-code")


def parser() -> argparse.ArgumentParser:
    """The command line (without harness's --quick), built before the pipeline is imported (MLflow, torch:
    seconds), so `--help` answers at once."""
    built = argparse.ArgumentParser(prog="python -m benchmarks.claims", description=__doc__.splitlines()[0])
    built.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout holding the experiments")
    built.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    built.add_argument("--png", type=Path, default=None, help="write the curves and accuracies here")
    return built


if __name__ == "__main__":
    harness.parse(parser(), None, {})

from flows.experiment import commands, experiment_config, experiment_file, experiment_refs  # noqa: E402
from pipeline.evaluation.labels import compared_labels  # noqa: E402
from pipeline.evaluation.report import COMPARE_FILE  # noqa: E402
from pipeline.tracking.headline import last_quarter  # noqa: E402

CURVES = {"reward/mean": "reward", "calls": "tool calls per trajectory",
          "rollout/entropy_reducing_call_share": "share of entropy-reducing calls", "train/entropy": "entropy"}
TRAIN_COLUMNS = {"reward/mean": "reward", "calls": "calls/traj", "rollout/entropy_reducing_call_share": "H-reducing",
                 "train/entropy": "entropy", "train/ref_kl": "KL"}


def experiments(repo: Path, arms: tuple[str, ...]) -> dict[str, str]:
    """name -> ref of the newest experiment of each `<arm>-s<seed>` name, in arm then seed order."""
    found = experiment_refs(repo)
    pattern = re.compile(rf"^({'|'.join(map(re.escape, arms))})-s(\d+)$")
    named = [(arms.index(m[1]), int(m[2]), name) for name in found if (m := pattern.match(name))]
    return {name: found[name] for _, _, name in sorted(named)}


def with_calls(row: dict) -> dict:
    """A history row with `calls`: tool calls per trajectory, all tools."""
    calls = [v for k, v in row.items() if k.startswith("rollout/calls_per_traj/")]
    return row | {"calls": sum(calls)} if calls else row


def figures(compare: dict, history: list[dict], sft_label: str, rl_label: str) -> dict:
    """One experiment's held-out figures (RL policy; gain over its SFT model) and last-quarter training means."""
    missing = [label for label in (sft_label, rl_label) if label not in compare["models"]]
    if missing:
        raise ValueError(f"its comparison has no row {missing[0]!r} (its rows: {list(compare['models'])})")
    rl, sft = compare["models"][rl_label], compare["models"][sft_label]
    sources = sorted(k for k, v in rl.items() if isinstance(v, dict) and k != "all")
    out = {"accuracy": rl["all"]["accuracy"], "sft_accuracy": sft["all"]["accuracy"],
           "gain_points": 100 * (rl["all"]["accuracy"] - sft["all"]["accuracy"]),
           "right_tool": rl["all"]["right_tool"], "n_problems": int(rl["all"]["n_problems"]),
           "calls_per_problem": sum(v for k, v in rl["all"].items() if k.startswith("calls_per_rollout/"))}
    out |= {f"accuracy/{s}": rl[s]["accuracy"] for s in sources}
    tail = [with_calls(r) for r in sorted(history, key=lambda r: r["step"])][-last_quarter(len(history)):]
    for key, name in TRAIN_COLUMNS.items():
        values = [r[key] for r in tail if key in r]
        out[f"train/{name}"] = sum(values) / len(values) if values else None
    return out


def read_experiment(ref: str, repo: Path) -> tuple[dict, list[dict]]:
    """The figures and the training history of the experiment `ref`, read with its own params (the rows its
    evaluate stage wrote)."""
    cfg = experiment_config(ref, repo)
    compare = json.loads(experiment_file(ref, f"{cfg.evaluate.output_dir}/{COMPARE_FILE}", repo))
    text = experiment_file(ref, "metrics/train_history.jsonl", repo)
    history = [json.loads(line) for line in text.splitlines() if line.strip()]
    return figures(compare, history, *compared_labels(cfg.evaluate, cfg.train, cfg.sft, cfg.reward.tepo)), history


def cell(value: float | None, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}" if percent else f"{value:.3f}"


def table(rows: dict[str, dict]) -> str:
    sources = sorted({k.removeprefix("accuracy/") for f in rows.values() for k in f if k.startswith("accuracy/")})
    head = ["experiment", *sources, "all", "gain over SFT", "right tool", "calls/problem",
            *(f"train {n}" for n in TRAIN_COLUMNS.values())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, f in rows.items():
        cells = [name, *(cell(f.get(f"accuracy/{s}"), True) for s in sources), cell(f["accuracy"], True),
                 f"{f['gain_points']:+.1f}", cell(f["right_tool"], True), cell(f["calls_per_problem"]),
                 *(cell(f[f"train/{n}"]) for n in TRAIN_COLUMNS.values())]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(histories: dict[str, list[dict]], rows: dict[str, dict], png: Path) -> None:
    """Top and middle left: the training curves of every experiment (seed 0 solid, others dashed); the last two
    panels: held-out accuracy and tool calls per problem per arm (bars: the mean over seeds, dots: each seed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.5))
    axes = grid.ravel()
    colours = {arm: plt.get_cmap("tab10")(i) for i, arm in enumerate(ARMS)}
    for name, history in histories.items():
        arm, seed = name.rsplit("-s", 1)
        rows_ = [with_calls(r) for r in sorted(history, key=lambda r: r["step"])]
        for ax, key in zip(axes, CURVES, strict=False):
            points = [(r["step"], r[key]) for r in rows_ if key in r and not math.isnan(r[key])]
            if points:
                ax.plot(*zip(*points), color=colours[arm], linestyle="-" if seed == "0" else "--", label=name)
    for ax, title in zip(axes, CURVES.values(), strict=False):
        ax.set_title(f"training: {title}")
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    for ax, key, title in ((axes[4], "accuracy", "held-out accuracy, %"),
                           (axes[5], "calls_per_problem", "held-out tool calls per problem")):
        by_arm: dict[str, list[float]] = {}
        for name, f in rows.items():
            by_arm.setdefault(name.rsplit("-s", 1)[0], []).append(f[key] * (100 if key == "accuracy" else 1))
        ax.bar(list(by_arm), [sum(v) / len(v) for v in by_arm.values()], color=[colours[a] for a in by_arm])
        for i, values in enumerate(by_arm.values()):
            ax.scatter([i] * len(values), values, color="black", s=10, zorder=3)
        ax.set_title(f"{title} (dots: seeds)")
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def planned(repo: Path, arms: tuple[str, ...]) -> dict:
    """Each arm's seed-0 command (`flows.experiment.commands`: the arm's preset against the repo's params.yaml; the
    main job itself for dapo) and the experiments the repo holds."""
    params = repo / "params.yaml"
    presets = {arm: params if arm == "dapo" else repo / "configs" / "experiments" / f"{arm}.yaml" for arm in arms}
    return {"commands": {arm: commands(preset, [0], arm, queue=False, base=params)[0]
                         for arm, preset in presets.items()},
            "experiments_found": list(experiments(repo, arms))}


def main(argv: list[str] | None = None) -> None:
    args = harness.parse(parser(), argv, {})
    if args.quick:
        harness.last_line(planned(args.repo, tuple(args.arms)), quick=True)
        return
    found = experiments(args.repo, tuple(args.arms))
    if not found:
        raise SystemExit(f"no experiment named <arm>-s<seed> for {args.arms} in {args.repo}")
    rows, histories = {}, {}
    for name, ref in found.items():
        try:
            rows[name], histories[name] = read_experiment(ref, args.repo)
        except (LookupError, ValueError) as err:  # ValueError: also params this checkout cannot read
            raise SystemExit(f"{name}: {err}") from None
    print(table(rows))
    if args.png:
        plot(histories, rows, args.png)
        print(f"plots: {args.png}")
    harness.last_line({name: {k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()}
                       for name, f in rows.items()}, quick=False)


if __name__ == "__main__":
    main()
