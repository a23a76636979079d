"""Run a params preset as DVC experiments, one per seed.

    python -m flows.experiment configs/experiments/learning-cpu.yaml [--seeds 0 1 2] [--queue] [--name NAME]
                               [--dry-run]

For each seed this runs `dvc exp run -n <name>-s<seed> -S <override> ... -S run.seed=<seed>` (or queues it with
`--queue`; then `dvc queue start` runs the queue), where the overrides are every leaf the preset changes against
params.yaml (`pipeline.config.overrides`). params.yaml itself is left as it was: DVC applies the overrides in the
experiment's own workspace, and `dvc exp show` / `dvc params diff` list them. `--dry-run` prints the commands.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from pipeline.config import DEFAULT_PARAMS, ConfigError, load_config
from pipeline.config.overrides import experiment_overrides


def commands(preset: Path, seeds: list[int], name: str, queue: bool, base: Path = DEFAULT_PARAMS) -> list[list[str]]:
    """One `dvc exp run` command line per seed."""
    overrides = [o for o in experiment_overrides(load_config(base), load_config(preset)) if not o.startswith("run.seed=")]
    sets = [arg for o in overrides for arg in ("-S", o)]
    return [["dvc", "exp", "run", "-n", f"{name}-s{seed}", *sets, "-S", f"run.seed={seed}",
             *(["--queue"] if queue else [])] for seed in seeds]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.experiment", description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", type=Path, help="an override file, e.g. configs/experiments/learning-cpu.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="run.seed of each experiment")
    parser.add_argument("--name", default=None, help="experiment name prefix (default: the preset's file name)")
    parser.add_argument("--queue", action="store_true", help="queue the experiments (dvc queue start runs them)")
    parser.add_argument("--dry-run", action="store_true", help="print the dvc commands instead of running them")
    args = parser.parse_args(argv)
    try:
        lines = commands(args.preset, args.seeds, args.name or args.preset.stem, args.queue)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    for line in lines:
        print(shlex.join(line), flush=True)
        if not args.dry_run and subprocess.run(line).returncode != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
