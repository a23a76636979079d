"""`benchmarks/gpu_check.py --quick` (its `--tiny`): the GPU check's own code path (2 ranks through the train stage's
launcher), on the CPU. This is the benchmark's quick run in CI (tests/benchmarks/test_quick.py leaves it here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The first start on a clean checkout compiles DeepSpeed's CPU communication op (1.5-5 min).
pytestmark = pytest.mark.timeout(900)


@pytest.mark.slow
def test_gpu_check_runs_tiny_on_cpu(repo_root: Path) -> None:
    env = dict(os.environ) | {"OMP_NUM_THREADS": "1",
                              "TORCH_EXTENSIONS_DIR": str(repo_root / ".cache" / "torch_extensions")}
    for key in ("RANK", "WORLD_SIZE", "MASTER_PORT"):
        env.pop(key, None)
    res = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--quick"], cwd=repo_root, env=env,
                         capture_output=True, text=True, timeout=850)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("step_s", "generation_tokens_per_s", "training_tokens_per_s", "model_tflops_per_s_per_gpu"):
        assert figures[key] > 0, key
    assert figures["quick"] is True
    assert figures["mfu"] is None  # no GPU peak to divide by on a CPU
    assert figures["ranks"] == 2 and len(figures["peak_memory_gib"]) == 2 and min(figures["peak_memory_gib"]) > 0
    assert figures["sequences_per_step"] == 8 and figures["zero_stage"] == 2  # 2 prompts x 2 samples, each rank
    assert figures["weights_agree"] is True  # the ranks stepped the same weights
    for rank in (0, 1):  # both ranks ran every step, through the stage's launcher (its rank prefix)
        assert f"[rank{rank}]:step 1: loss" in res.stderr
    assert "grad_norm nan" not in res.stderr
