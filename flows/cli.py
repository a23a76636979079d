"""The command lines of the flows, parsed before anything heavy is imported.

`python -m flows.<stage> --help` (and a mistyped option) answers at once: each flow module hands its
command line here before its own imports (Prefect, MLflow, torch, transformers: seconds), and the flow
module is imported only once the arguments parse and the params file validates. A user's mistake (a bad
params file, a missing model or checkpoint, a resume under another config) ends the command with one line
on stderr and exit 1, not a traceback (`USER_ERRORS` of flows.common and of the flow's module;
`TAPO_TRACEBACK=1` shows it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from flows.quiet import quiet_libraries
from pipeline.config import DEFAULT_PARAMS, ConfigError, load_config
from pipeline.paths import REPO_ROOT

Option = Callable[[argparse.ArgumentParser], None]


def _resume(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--resume", action="store_true", help="continue this run from its latest checkpoint, "
                        "whatever train.checkpoints.resume would decide (refused when its checkpoints were written under another "
                        "config; inputs that changed since are named)")


def _label(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--label", default=None, help="name of this run; a run with a label (or another params "
                        "file, or --model) is ad hoc and writes under runs/<stage>/<label>/, never into DVC's outputs")


def _out(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="where an ad-hoc run writes instead of runs/<stage>/<label>/ "
                        "('.': where the params say, DVC's outputs included)")


def _model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model to evaluate instead of evaluate.model (directory, "
                        "hub id, or MLflow URI such as models:/tapo-policy@champion)")


def _baseline(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", default=None, help="evaluate one of evaluate.baselines (its model, label and "
                        "output folder: the DVC stage evaluate-<name>) instead of evaluate.model")


def _dvc(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dvc", action="store_true", help="run `dvc repro` (only stages whose inputs changed)")


@dataclass(frozen=True)
class Command:
    flow: str  # the flow function's name in flows.<module>
    description: str
    options: tuple[Option, ...] = ()


COMMANDS: dict[str, Command] = {
    "prepare_model": Command("prepare_model_flow", "Prepare the base model (models/base).", (_label, _out)),
    "curate": Command("curate_flow", "Curate the training and test problems (data/curated).", (_label, _out)),
    "build_index": Command("build_index_flow", "Build the search index (data/search/index).", (_label, _out)),
    "sft": Command("sft_flow", "Fine-tune the base model on tool-use traces (models/sft, metrics/sft.json).",
                   (_label, _out)),
    "train": Command("train_flow", "Train the policy with tools (models/policy, metrics/train*).",
                     (_resume, _label, _out)),
    "evaluate": Command("evaluate_flow", "Evaluate a model on the configured benchmarks (metrics/eval*).",
                        (_model, _label, _out, _baseline)),
    "services": Command("services_flow", "Start the tool services and keep them running until Ctrl-C."),
    "pipeline": Command("pipeline_flow", "Run the whole pipeline under one MLflow parent run.", (_dvc,)),
}


def project_prefect_settings(cwd: Path | None = None) -> dict[str, str]:
    """The checkout's prefect.toml as the environment variables Prefect reads, for a stage started elsewhere.

    Prefect reads prefect.toml from the working directory only, so a stage started from another folder (a params
    file kept elsewhere, a scratch directory) ran with Prefect's defaults, among them a 20 s limit on the start of
    its temporary API server, which a loaded 2-core machine overruns. An explicit variable still wins; returns
    what was set."""
    here = Path.cwd() if cwd is None else cwd
    source = REPO_ROOT / "prefect.toml"
    if (here / "prefect.toml").is_file() or not source.is_file():
        return {}
    flat: dict[str, str] = {}

    def walk(table: dict, prefix: str) -> None:
        for key, value in table.items():
            name = f"{prefix}_{key}".upper()
            if isinstance(value, dict):
                walk(value, name)
            else:
                flat[name] = str(value).lower() if isinstance(value, bool) else str(value)

    walk(tomllib.loads(source.read_text()), "PREFECT")
    added = {name: value for name, value in flat.items() if name not in os.environ}
    os.environ.update(added)
    return added


def parser_for(module: str) -> argparse.ArgumentParser:
    command = COMMANDS[module]
    parser = argparse.ArgumentParser(prog=f"python -m flows.{module}", description=command.description)
    parser.add_argument("--params", default=str(DEFAULT_PARAMS), help="params file (default: params.yaml)")
    for option in command.options:
        option(parser)
    return parser


def main(module: str, argv: list[str] | None = None) -> NoReturn:
    """Parse, validate the params file, then import and run the flow (see the module docstring)."""
    args = vars(parser_for(module).parse_args(argv))
    try:
        load_config(args["params"])
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(1) from None
    if module == "pipeline":
        args["use_dvc"] = args.pop("dvc")
    quiet_libraries()  # before the libraries load: they read these settings at import
    project_prefect_settings()
    # Imported here, once the command line is known to be good: these imports take seconds.
    common, flows = importlib.import_module("flows.common"), importlib.import_module(f"flows.{module}")
    common.run_flow(module, getattr(flows, COMMANDS[module].flow), args,
                    getattr(flows, "USER_ERRORS", common.USER_ERRORS), getattr(flows, "preflight", None))
    raise SystemExit(0)
