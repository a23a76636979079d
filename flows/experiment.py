"""Run a params preset as DVC experiments, one per seed.

    python -m flows.experiment configs/experiments/learning-cpu.yaml [--seeds 0 1 2] [--queue] [--name NAME]
                               [--dry-run] [--summarise]

For each seed this runs `dvc exp run -n <name>-s<seed> -S <override> ... -S run.seed=<seed>` (or queues it with
`--queue`; then `dvc queue start` runs the queue), where the overrides are every leaf the preset changes against
params.yaml (`pipeline.config.overrides`). `dvc exp show` / `dvc params diff` list them. `--dry-run` prints the
commands.

Once the runs end, the seeds are summarised (`pipeline.evaluation.seeds`): each headline number's mean and 95 %
t-interval over the seeds, the policy's gain over SFT likewise, and the sign test over all seeds' flips pooled.
`--summarise` prints that summary for experiments already run (queued ones, once `dvc queue start` has run them)
without running anything. Each seed's numbers are its experiment's headline files (`HEADLINE_FILES`, the metrics
dvc.yaml declares) read from the experiment's own git commit (`refs/exps/.../<name>-s<seed>`), not from
`dvc exp show --json` nor MLflow: the commit is what DVC itself keeps and shows, found for any baseline (`dvc exp
show` lists only the current commit's experiments unless told otherwise, in a JSON layout that changed between DVC
releases), read in milliseconds without DVC's repository lock (which a queued run holds), and independent of
whether or where MLflow tracked the run; `tests/orchestration/test_seeds.py` checks the two agree.

An experiment is the preset on the *committed* params: DVC runs (and queues) experiments on the workspace, and
`dvc exp run -S` leaves its overrides in the workspace's params.yaml, so a second preset run there would also carry
the first one's keys. So each run's params.yaml is put back as it was once the run ends (the experiment keeps its
own: `dvc exp apply <name>`), and a params.yaml that already differs from the last commit is refused, naming the
keys, unless `--allow-changed-params` says those changes belong in every experiment.

The driver runs as a stage process does (`flows.common.stage_process`): whatever ends it ends its experiment.
SIGINT / SIGTERM stop the running `dvc exp run`'s stage first, so that dvc sees its stage fail and releases its
locks, then dvc; params.yaml is put back; the exit is 130 / 143. On SIGKILL the driver's watcher ends every
process it started, dvc last: dvc's stage first, so that dvc sees it fail and releases its locks on its own
(nothing can run in the driver, so params.yaml keeps the run's overrides, and the next run names them). A dvc
killed anyway while it writes its lock table (an OOM kill, a SIGKILL of the whole group) leaves it cut short (or
git's index locked); each run first sets such files aside (`flows.dvc_state`), so one killed experiment does not
stop every later dvc command there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from pipeline.config import DEFAULT_PARAMS, ConfigError, RunConfig, config_from_dict, load_config
from pipeline.config.params_file import read_params
from pipeline.config.overrides import experiment_overrides, leaf_overrides


def parser() -> argparse.ArgumentParser:
    """The command line, built before the stage machinery is imported (MLflow, torch: seconds), so `--help`
    answers at once."""
    built = argparse.ArgumentParser(prog="python -m flows.experiment", description=__doc__.split("\n\n")[0])
    built.add_argument("preset", type=Path, help="an override file, e.g. configs/experiments/learning-cpu.yaml")
    built.add_argument("--seeds", type=int, nargs="+", default=[0], help="run.seed of each experiment")
    built.add_argument("--name", default=None, help="experiment name prefix (default: the preset's file name)")
    built.add_argument("--queue", action="store_true", help="queue the experiments (dvc queue start runs them)")
    built.add_argument("--dry-run", action="store_true", help="print the dvc commands instead of running them")
    built.add_argument("--allow-changed-params", action="store_true",
                       help="run although params.yaml differs from the last commit (the changes join every run)")
    built.add_argument("--summarise", action="store_true",
                       help="run nothing: summarise the experiments <name>-s<seed> already run (mean, 95%% interval, "
                            "pooled sign test)")
    return built


if __name__ == "__main__":
    parser().parse_args()

from flows.common import stage_process  # noqa: E402  (after the command line: see `parser`)
from flows.dvc_run import run_dvc  # noqa: E402
from flows.dvc_state import DvcStillRunning, set_aside_broken_state  # noqa: E402
from pipeline.evaluation.seeds import render_summary  # noqa: E402

HEADLINE_FILES = ("metrics/headline/train.json", "metrics/headline/eval.json")  # dvc.yaml's metrics


def commands(preset: Path, seeds: list[int], name: str, queue: bool, base: Path = DEFAULT_PARAMS) -> list[list[str]]:
    """One `dvc exp run` command line per seed."""
    overrides = [o for o in experiment_overrides(load_config(base), load_config(preset)) if not o.startswith("run.seed=")]
    sets = [arg for o in overrides for arg in ("-S", o)]
    return [["dvc", "exp", "run", "-n", f"{name}-s{seed}", *sets, "-S", f"run.seed={seed}",
             *(["--queue"] if queue else [])] for seed in seeds]


def experiment_refs(repo: Path = Path(".")) -> dict[str, str]:
    """Experiment name -> git ref of the newest DVC experiment of that name in `repo` (DVC keeps each under
    refs/exps/<..>/<baseline>/<name>; a re-run under another baseline adds one)."""
    refs = subprocess.run(["git", "for-each-ref", "--sort=committerdate", "--format=%(refname)", "refs/exps"],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.split()
    return {ref.rsplit("/", 1)[1]: ref for ref in refs}  # oldest first, so the newest of a name wins


def experiment_ref(name: str, repo: Path = Path(".")) -> str | None:
    """The git ref of the newest DVC experiment called `name` in `repo`, or None."""
    return experiment_refs(repo).get(name)


def experiment_file(ref: str, path: str, repo: Path = Path(".")) -> str:
    """The text of `path` as the experiment `ref` committed it; LookupError when it holds no such file."""
    shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=repo, capture_output=True, text=True)
    if shown.returncode != 0:
        raise LookupError(f"{ref} holds no {path} (did the stage that writes it run?): {shown.stderr.strip()}")
    return shown.stdout


def experiment_config(ref: str, repo: Path = Path(".")) -> RunConfig:
    """The config the experiment `ref` ran with: its own committed params.yaml (the preset's overrides applied)."""
    return config_from_dict(read_params(experiment_file(ref, DEFAULT_PARAMS.name, repo)), f"{ref}:{DEFAULT_PARAMS.name}")


def experiment_headline(ref: str, repo: Path = Path(".")) -> dict[str, float]:
    """The headline numbers of the experiment `ref`: the headline files it holds, merged (their keys are unique;
    the table's n column shows a seed that lacks one); LookupError when it holds neither."""
    out: dict[str, float] = {}
    missing = []
    for path in HEADLINE_FILES:
        try:
            out |= {k: float(v) for k, v in json.loads(experiment_file(ref, path, repo)).items()}
        except LookupError:
            missing.append(path)
    if len(missing) == len(HEADLINE_FILES):
        raise LookupError(f"{ref} holds none of {', '.join(HEADLINE_FILES)} (did its train and evaluate stages run?)")
    return out


def seed_headlines(name: str, seeds: list[int], repo: Path = Path(".")) -> dict[str, dict[str, float]]:
    """Experiment name -> its headline numbers, for `<name>-s<seed>` of each seed; LookupError naming the
    experiments not found (or a headline file one lacks)."""
    refs = experiment_refs(repo)
    names = [f"{name}-s{seed}" for seed in seeds]
    missing = [n for n in names if n not in refs]
    if missing:
        raise LookupError(f"no DVC experiment {', '.join(missing)} in {repo.resolve()} (`dvc exp list --all-commits` "
                          "lists those there; a queued one runs with `dvc queue start`)")
    return {n: experiment_headline(refs[n], repo) for n in names}


def print_summary(name: str, seeds: list[int], *, after_runs: bool = False) -> int:
    """Print the seeds' summary; 1 when an experiment or its headline is missing, unless the experiments just ran
    (their runs succeeded: a pipeline whose stages write no headline has nothing to summarise, and says so)."""
    try:
        per_seed = seed_headlines(name, seeds)
    except LookupError as err:
        print(f"summary: {err}", file=sys.stderr)
        return 0 if after_runs else 1
    print(f"\n{name}: {len(seeds)} seed{'s' * (len(seeds) != 1)} ({', '.join(per_seed)})", flush=True)
    print(render_summary(per_seed), flush=True)
    return 0


def changed_since_commit(params: Path) -> list[str]:
    """The keys in which `params` differs from its committed version ([] outside git or when not committed)."""
    committed = subprocess.run(["git", "show", f"HEAD:./{params.name}"], cwd=params.parent, capture_output=True,
                               text=True)
    if committed.returncode != 0:
        return []
    overrides = leaf_overrides(yaml.safe_load(committed.stdout), yaml.safe_load(params.read_text()))
    return [o.lstrip("+~").split("=", 1)[0] for o in overrides]


def run_keeping(params: Path, line: list[str]) -> int:
    """Run one `dvc exp run`, then put `params` back as it was, whatever became of the run."""
    before = params.read_bytes()
    try:
        return run_dvc(line)
    finally:
        if params.read_bytes() != before:
            params.write_bytes(before)
            print(f"{params} put back as it was (the experiment's own: dvc exp apply {line[4]})", flush=True)


def set_aside_what_dvc_left(repo: Path = Path(".")) -> bool:
    """Set aside the state files a killed dvc left broken in `repo`, saying so; False (and why on stderr) when a
    dvc or git still running there may own them."""
    try:
        moved = set_aside_broken_state(repo)
    except DvcStillRunning as err:
        print(err, file=sys.stderr)
        return False
    for path in moved:
        print(f"{path.with_suffix('')} was left by a dvc killed while writing it: set aside as {path}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    name = args.name or args.preset.stem
    if args.summarise:
        return print_summary(name, args.seeds)
    try:
        lines = commands(args.preset, args.seeds, name, args.queue)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    changed = [] if args.dry_run or args.allow_changed_params else changed_since_commit(DEFAULT_PARAMS.resolve())
    if changed:
        print(f"{DEFAULT_PARAMS} differs from the last commit in {', '.join(changed)} (left by an earlier `dvc exp "
              "run`?): DVC runs experiments on the workspace, so every one would carry these changes besides the "
              f"preset's. Put it back with `git checkout {DEFAULT_PARAMS}`, or pass --allow-changed-params.",
              file=sys.stderr)
        return 1
    if args.dry_run:
        print("\n".join(shlex.join(line) for line in lines))
        return 0
    with stage_process():
        for line in lines:
            if not set_aside_what_dvc_left():
                return 1
            print(shlex.join(line), flush=True)
            if run_keeping(DEFAULT_PARAMS, line) != 0:
                return 1
    if args.queue:
        print(f"queued; once `dvc queue start` has run them: python -m flows.experiment {shlex.quote(str(args.preset))} "
              f"--seeds {' '.join(map(str, args.seeds))}{f' --name {shlex.quote(name)}' if args.name else ''} "
              "--summarise", flush=True)
        return 0
    return print_summary(name, args.seeds, after_runs=True)


if __name__ == "__main__":
    sys.exit(main())
