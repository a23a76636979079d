"""Command line: a single-process training checkpoint as a plain Hugging Face directory.

    python -m pipeline.export --params params.yaml runs/train/checkpoints/step-000002 models/step2

The directory is what training's final model is (tokenizer included; a LoRA adapter merged), so
`python -m flows.evaluate --model models/step2` evaluates an intermediate policy. DeepSpeed
checkpoints: `python -m pipeline.distributed.export`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.config import load_config
from pipeline.train import export_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="the params the run trained with (train.init_model, "
                                                               "train.finetune, model.dtype)")
    parser.add_argument("checkpoint", type=Path, help="a step-NNNNNN directory under <train.checkpoint_dir>/checkpoints")
    parser.add_argument("out", type=Path, help="the Hugging Face directory to write")
    args = parser.parse_args()
    print(export_checkpoint(load_config(Path(args.params)), args.checkpoint, args.out))


if __name__ == "__main__":
    main()
