"""What every benchmark shares: its `--quick` switch, the config it derives from params.yaml, the params file a
service it starts reads, the tiny workspace its quick mode runs in, and its last line.

- A benchmark configures the pipeline as the pipeline configures itself: a params file and the benchmark's dotted
  overrides through the strict loader (`derive`, `pipeline.config.load_config`), so a key that went away or a
  combination params.yaml no longer allows is refused when the benchmark starts, naming every key involved. A
  service a benchmark starts reads a params file written by `params_file`: `extends:` the benchmark's params, the
  overrides on top, loaded back before the service sees it (a partial file is refused by the service's loader:
  `distributed: missing`).
- `--quick` sets tiny sizes (`parse`) and runs the same code, in seconds: a model a benchmark loads is the tiny
  cold-started one of a scratch workspace laid out as after a learning-cpu preset run
  (`benchmarks.preset_run.quick_workspace`).
  tests/benchmarks/test_quick.py runs every benchmark's quick mode, so one that no longer starts against today's
  config fails there, not in the hands of whoever next wants its figure. Quick figures measure nothing: the last
  line says `"quick": true`.
- The test tier builds one quick workspace for every benchmark and names it in `TAPO_BENCH_QUICK_WORKSPACE`; its
  params.yaml names the services the tier started (`sandbox.url`, `search.url`, `search.redis_url`), which the
  pipeline's own service start-up (`flows.services.running_services`) then uses instead of starting its own, so no
  quick run trains a model or starts a tool service (a benchmark of a service starts the one it measures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import RunConfig, load_config
from pipeline.paths import REPO_ROOT

PARAMS = REPO_ROOT / "params.yaml"
WORKSPACE_ENV = "TAPO_BENCH_QUICK_WORKSPACE"  # the shared quick workspace (benchmarks.preset_run.quick_workspace)


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None, quick: Mapping[str, Any]
          ) -> argparse.Namespace:
    """The benchmark's arguments with `--quick`, which makes `quick` (argument name -> value) the defaults;
    an argument given on the command line still wins. Quick runs compute in one torch thread: on tiny tensors a
    second thread only waits for the first (on a loaded machine 20x the time)."""
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, seconds, the same code (CI runs it); its figures measure nothing")
    unknown = set(quick) - {action.dest for action in parser._actions}
    if unknown:
        raise ValueError(f"quick sizes for arguments the parser does not have: {sorted(unknown)}")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args(argv)
        torch = sys.modules.get("torch")  # a benchmark that computes with torch has imported it by now
        if torch is not None:
            torch.set_num_threads(1)
    return args


def nested(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """`{"a.b": 1}` as `{"a": {"b": 1}}`."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def derive(overrides: Mapping[str, Any] | None = None, params: Path = PARAMS) -> RunConfig:
    """The config a benchmark runs: `params` (a complete params file or one that extends another) with its dotted
    `overrides`, validated as every stage validates its own (an unknown key, a bad value or a combination the
    pipeline refuses raises `ConfigError`, naming every key involved)."""
    return load_config(params, overrides=dict(overrides or {}))


def params_file(path: Path, overrides: Mapping[str, Any], base: Path = PARAMS) -> Path:
    """A params file at `path` for a service the benchmark starts: `base` with the dotted `overrides`, loaded
    back before anything reads it."""
    path.write_text(yaml.safe_dump({"extends": str(base.resolve())} | nested(overrides), sort_keys=False))
    load_config(path)
    return path


def base_params(quick: bool) -> Path:
    """The params file a benchmark starts from: the shared quick workspace's in quick mode (this checkout's, and
    the services already running), else this checkout's."""
    shared = os.environ.get(WORKSPACE_ENV)
    return Path(shared) / "params.yaml" if quick and shared else PARAMS


def last_line(result: Mapping[str, Any], quick: bool) -> None:
    """The benchmark's last line: one JSON object (`"quick": true` in quick mode, whose figures measure nothing)."""
    print(json.dumps(({"quick": True} if quick else {}) | dict(result)), flush=True)
