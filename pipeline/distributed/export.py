"""Command line: merge DeepSpeed ZeRO shards into a Hugging Face directory.

    python -m pipeline.distributed.export runs/train/checkpoints models/policy [--tag step-000004]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.distributed.checkpointing import export_from_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", type=Path, help="the directory holding step-NNNNNN/ and latest")
    parser.add_argument("out", type=Path, help="the Hugging Face directory to write")
    parser.add_argument("--tag", default=None, help="a step-NNNNNN tag (default: latest)")
    args = parser.parse_args()
    print(export_from_checkpoint(args.checkpoints, args.out, args.tag))


if __name__ == "__main__":
    main()
