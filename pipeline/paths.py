"""Where things are: the repository root and the shared benchmark data beside it."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """Real benchmark files (never copied into the repo).

    `TAPO_SHARED_DATA` overrides; otherwise `../shared/data` beside the repository.
    """
    env = os.environ.get("TAPO_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"
