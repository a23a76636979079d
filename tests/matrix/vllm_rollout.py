"""The rollout half of the matrix's vLLM sample, run in the vLLM environment (`.venv-vllm`, which holds the
rollout's dependencies only): `RolloutEngine` with `rollout.backend: vllm` samples `--collections` batches of
the params' problems with the real tool service, and the groups (the records the trainer consumes) are
pickled for the training half in the main environment (tests/matrix/test_matrix_vllm.py).

Usage: python -m tests.matrix.vllm_rollout PARAMS TOOL URL OUT.pkl
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # a small KV cache for the CPU build
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from transformers import AutoTokenizer, LlamaForCausalLM  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.jsonl import read_problems  # noqa: E402
from pipeline.rollout.engine import RolloutEngine  # noqa: E402
from tests.helpers.tools import registry  # noqa: E402


def main(params: Path, tool: str, url: str, out: Path, collections: int = 3) -> None:
    cfg = load_config(params)
    assert cfg.rollout.backend == "vllm"
    model = LlamaForCausalLM.from_pretrained(cfg.train.init_model)
    tokenizer = AutoTokenizer.from_pretrained(cfg.train.init_model)
    problems = read_problems(cfg.train.train_file)
    engine = RolloutEngine(model, tokenizer, registry(cfg, {tool: url}), cfg.rollout, seed=cfg.run.seed)
    try:
        batches = [engine.rollout(problems[i::collections][:cfg.train.sampling.prompts_per_step], cfg.rollout.group_size).groups
                   for i in range(collections)]
    finally:
        engine.backend.close()
        engine.close()
    out.write_bytes(pickle.dumps(batches))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))
