"""Does RL add to SFT? The learning-cpu preset (SmolLM2-135M-Instruct on 2 CPU cores), one DVC experiment per seed.

The experiment is the pipeline itself, configured by `configs/experiments/learning-cpu.yaml`: curate a mix in
which every problem offers both tools (generated calculator problems; NQ-open questions the search service
answers within what the policy sees), a light SFT cold start (32 code + 32 search traces, one epoch), 36 DAPO steps
with a KL anchor to the SFT model, then the prompted base, SFT and SFT + DAPO evaluated greedy on the same held-out
problems (why these settings: benchmarks/RESULTS.md, learning_cpu). This script holds no stage: it runs the preset
and reads what the evaluate stage wrote, metrics/eval_compare.json, from each experiment's git ref
(refs/exps/<..>/<baseline>/learning-cpu-s<seed>, the newest of that name).

Goal (issue): SFT + DAPO >= SFT + 10 points on the held-out mix (mean over seeds), right tool of the RL policy
>= 0.9 (mean), and each seed within 60 minutes on 2 cores.

    python -m benchmarks.learning_cpu [--seeds 0 1 2]            # run each seed, timed, then summarise
    python -m benchmarks.learning_cpu [--seeds 0 1 2] --collect  # summarise the experiments already run
    (--repo PATH: another checkout runs or holds them)

Running a seed is `python -m flows.experiment configs/experiments/learning-cpu.yaml --seeds <seed>` (the DVC
experiment learning-cpu-s<seed>). One line per seed, then as the last line one JSON object: per seed figures,
the mean gain, the mean right tool, the longest wall time and whether each goal is met (null: not timed here).

    python -m benchmarks.learning_cpu --quick   # runs nothing (a seed takes an hour): each seed's command, made
                                                # from today's params.yaml and the preset (both loaded strictly),
                                                # and which seeds' experiments the repo holds
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import harness
from pipeline.paths import REPO_ROOT


def parser() -> argparse.ArgumentParser:
    """The command line (without harness's --quick), built before the pipeline is imported (MLflow, torch:
    seconds), so `--help` answers at once."""
    built = argparse.ArgumentParser(prog="python -m benchmarks.learning_cpu", description=__doc__.splitlines()[0])
    built.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run.seed of each experiment")
    built.add_argument("--collect", action="store_true", help="run nothing: read the experiments already run")
    built.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout that runs or holds the experiments")
    return built


if __name__ == "__main__":
    harness.parse(parser(), None, {})

from flows import experiment as experiments  # noqa: E402
from pipeline.evaluation.labels import compared_labels  # noqa: E402
from pipeline.evaluation.report import COMPARE_FILE  # noqa: E402

PRESET = "configs/experiments/learning-cpu.yaml"
NAME = Path(PRESET).stem  # flows.experiment names each experiment <preset>-s<seed>
GOAL_GAIN_POINTS, GOAL_RIGHT_TOOL, GOAL_WALL_S = 10.0, 0.9, 3600.0


def run_command(seed: int) -> list[str]:
    return ["python", "-m", "flows.experiment", PRESET, "--seeds", str(seed)]


def run_seed(seed: int, repo: Path = REPO_ROOT) -> float:
    """Run one seed's experiment in `repo`; its wall seconds (a failed run stops everything)."""
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, *run_command(seed)[1:]], cwd=repo).returncode
    if rc != 0:
        sys.exit(f"{NAME}-s{seed}: `{' '.join(run_command(seed))}` failed (exit {rc})")
    return time.perf_counter() - t0


def experiment_ref(seed: int, repo: Path = REPO_ROOT) -> str:
    """The git ref of the newest DVC experiment named <preset>-s<seed> in `repo`."""
    ref = experiments.experiment_ref(f"{NAME}-s{seed}", repo)
    if ref is None:
        raise LookupError(f"no DVC experiment {NAME}-s{seed} in {repo}: run it with `{' '.join(run_command(seed))}` "
                          f"(or python -m benchmarks.learning_cpu --seeds {seed})")
    return ref


def read_compare(ref: str, path: str, repo: Path = REPO_ROOT) -> dict:
    """`path` (the evaluate stage's comparison) as committed in the experiment `ref`."""
    return json.loads(experiments.experiment_file(ref, path, repo))


def seed_figures(compare: dict, sft_label: str, rl_label: str, wall_s: float | None) -> dict:
    """One seed's figures from its eval_compare.json: held-out accuracy of SFT and SFT + DAPO, the gain in points,
    the RL policy's right-tool rate and the paired flips SFT -> SFT + DAPO."""
    models, flips = compare["models"], compare.get("flips", {})
    missing = [label for label in (sft_label, rl_label) if label not in models]
    if missing or (flips.get("before"), flips.get("after")) != (sft_label, rl_label):
        raise ValueError(f"eval_compare.json compares {list(models)} (flips {flips.get('before')!r} -> "
                         f"{flips.get('after')!r}), not {sft_label!r} -> {rl_label!r}")
    sft, rl = models[sft_label]["all"], models[rl_label]["all"]
    return {"sft": round(sft["accuracy"], 4), "sft_dapo": round(rl["accuracy"], 4),
            "gain_points": round(100 * (rl["accuracy"] - sft["accuracy"]), 2),
            "right_tool": round(rl["right_tool"], 4), "n_problems": int(rl["n_problems"]),
            "flips_up": flips["to_right"], "flips_down": flips["to_wrong"],
            "sign_test_p": round(flips["sign_test_p"], 4), "wall_s": None if wall_s is None else round(wall_s, 1)}


def seed_line(seed: int, f: dict) -> str:
    wall = "not timed here" if f["wall_s"] is None else f"{f['wall_s'] / 60:.1f} min"
    return (f"seed {seed}: SFT {100 * f['sft']:.1f} %, SFT + DAPO {100 * f['sft_dapo']:.1f} % "
            f"({f['gain_points']:+.1f} points on {f['n_problems']}), right tool {f['right_tool']:.3f}, "
            f"flips {f['flips_up']} up / {f['flips_down']} down (p = {f['sign_test_p']:.3g}), {wall}")


def summary(per_seed: dict[int, dict]) -> dict:
    """The seeds' figures, their means and whether each goal is met (time: null unless decided by the timed seeds)."""
    n = len(per_seed)
    gain = sum(f["gain_points"] for f in per_seed.values()) / n
    right_tool = sum(f["right_tool"] for f in per_seed.values()) / n
    walls = [f["wall_s"] for f in per_seed.values() if f["wall_s"] is not None]
    max_wall = max(walls) if walls else None
    in_time = False if max_wall is not None and max_wall > GOAL_WALL_S else (True if len(walls) == n else None)
    return {"seeds": {str(s): f for s, f in per_seed.items()}, "mean_gain_points": round(gain, 2),
            "mean_right_tool": round(right_tool, 4), "max_wall_s": max_wall,
            "goals": {"gain_10_points": gain >= GOAL_GAIN_POINTS, "right_tool_0.9": right_tool >= GOAL_RIGHT_TOOL,
                      "within_60_min": in_time}}


def planned(seeds: list[int], repo: Path) -> dict:
    """What a run would do, decided without running it: each seed's `dvc exp run` command (the preset's overrides
    against the repo's params.yaml, `flows.experiment.commands`) and the seeds whose experiment the repo holds."""
    lines = experiments.commands(repo / PRESET, seeds, NAME, queue=False, base=repo / "params.yaml")
    return {"commands": lines,
            "experiments_found": [seed for seed in seeds if experiments.experiment_ref(f"{NAME}-s{seed}", repo)]}


def main(argv: list[str] | None = None) -> None:
    args = harness.parse(parser(), argv, {})
    repo = args.repo
    if args.quick:
        harness.last_line(planned(args.seeds, repo), quick=True)
        return
    walls = {seed: None if args.collect else run_seed(seed, repo) for seed in args.seeds}
    per_seed = {}
    try:
        for seed, wall in walls.items():
            ref = experiment_ref(seed, repo)
            cfg = experiments.experiment_config(ref, repo)  # its own params: the rows its evaluate stage wrote
            compare = read_compare(ref, str(Path(cfg.evaluate.output_dir) / COMPARE_FILE), repo)
            rows = compared_labels(cfg.evaluate, cfg.train, cfg.sft, cfg.reward.tepo)
            per_seed[seed] = seed_figures(compare, *rows, wall)
            print(seed_line(seed, per_seed[seed]), flush=True)
    except (LookupError, ValueError) as err:  # ValueError: also params this checkout cannot read
        sys.exit(str(err))
    harness.last_line(summary(per_seed), quick=False)


if __name__ == "__main__":
    main()
