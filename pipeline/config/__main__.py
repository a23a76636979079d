"""`python -m pipeline.config check [PATH]`: validate a params file (exit 1 on errors)."""

from __future__ import annotations

import argparse
import sys

from pipeline.config import DEFAULT_PARAMS, ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.config")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate a params file")
    check.add_argument("path", nargs="?", default=str(DEFAULT_PARAMS))
    args = parser.parse_args(argv)
    try:
        load_config(args.path)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
