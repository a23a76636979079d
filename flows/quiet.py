"""Library noise a stage's log does not need, silenced where it starts (before the libraries load):
Hugging Face loading and download bars, transformers' info lines, a deprecation warning the pinned
transformers raises on every model it prepares (peft still asks for the old name), and DeepSpeed's notice
that it falls back to the CPU (the stage logs the device it uses). Errors and warnings that matter pass.
Called by the command line (`flows.cli`) before it imports a flow; the stage flows call it too (idempotent)."""

from __future__ import annotations

import logging
import os
import warnings

DEPRECATIONS = (r"`is_gradient_checkpointing` is deprecated",)
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


def _not_the_cpu_notice(record: logging.LogRecord) -> bool:
    return DEEPSPEED_CPU_NOTICE not in record.getMessage()


def quiet_libraries() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read by huggingface_hub and transformers at import
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for message in DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)
    deepspeed = logging.getLogger("DeepSpeed")  # DeepSpeed configures this logger at import; filters survive it
    if _not_the_cpu_notice not in deepspeed.filters:
        deepspeed.addFilter(_not_the_cpu_notice)
