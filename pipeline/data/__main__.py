"""Command line: `python -m pipeline.data [--params params.yaml] [--output-dir DIR]`.

Runs the curate stage from a params file and prints the report (counts per source and filter). The command line is
parsed before the curation code is imported (torch and transformers: seconds), so `--help` answers at once.
"""

from __future__ import annotations

import argparse
import json
import logging

from pipeline.config import DEFAULT_PARAMS, load_config


def parser() -> argparse.ArgumentParser:
    built = argparse.ArgumentParser(prog="python -m pipeline.data",
                                    description="Curate the data sets configured in a params file.")
    built.add_argument("--params", default=str(DEFAULT_PARAMS), help="Params file with a curate: section.")
    built.add_argument("--output-dir", default=None, help="Override curate.output_dir.")
    return built


if __name__ == "__main__":
    parser().parse_args()

from pipeline.data.curate import run  # noqa: E402  (after the command line: see the module docstring)


def main() -> None:
    args = parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = {"curate.output_dir": args.output_dir} if args.output_dir else {}
    report = run(load_config(args.params, overrides).curate)
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
