"""Where the tests find the vLLM environment (`scripts/setup_vllm.sh`): TAPO_VLLM_PYTHON, else `.venv-vllm`."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.paths import REPO_ROOT

VLLM_PYTHON = Path(os.environ.get("TAPO_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python"))
