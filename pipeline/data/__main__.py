"""Command line: `python -m pipeline.data [--params params.yaml] [--output-dir DIR]`.

Runs the curate stage from a params file and prints the report (counts per source and filter).
"""

from __future__ import annotations

import argparse
import json
import logging

from pipeline.config import DEFAULT_PARAMS, load_config
from pipeline.data.curate import run


def main() -> None:
    parser = argparse.ArgumentParser(description="Curate the data sets configured in a params file.")
    parser.add_argument("--params", default=str(DEFAULT_PARAMS), help="Params file with a curate: section.")
    parser.add_argument("--output-dir", default=None, help="Override curate.output_dir.")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = {"curate.output_dir": args.output_dir} if args.output_dir else {}
    report = run(load_config(args.params, overrides).curate)
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
