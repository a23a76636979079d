"""`tests/rollout/test_stopped_rollout.py` on the vllm backend (needs `.venv-vllm`): a rollout stopped while a tool
has not answered ends its decoder thread, and the process exits with nothing of vLLM's left running, whether a
SIGTERM stops the stage or the awaiting caller cancels the rollout. vLLM decodes in an engine process of its own
and the engine's step loop waits on it, so this backend's decoder can be stuck where the hf one cannot."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.stopped_rollout import STOPS, assert_a_stopped_rollout_ends

ROLLOUT = textwrap.dedent("""
    import sys
    from transformers import LlamaForCausalLM
    from pipeline.config.rollout import RolloutConfig
    from pipeline.rollout.engine import RolloutEngine
    from tests.helpers.stopped_rollout import Unanswered, stop_mid_rollout
    from tests.helpers.tiny import tiny_tokenizer
    from tests.vllm.scripted import PROBLEM

    model_dir, stop = sys.argv[1:]
    cfg = RolloutConfig(backend="vllm", temperature=0.0, max_policy_tokens=64, max_total_tokens=512)
    engine = RolloutEngine(LlamaForCausalLM.from_pretrained(model_dir), tiny_tokenizer(), {"code": Unanswered()},
                           cfg, seed=0)
    stop_mid_rollout(engine, [PROBLEM], 2, stop)
""")


@pytest.mark.slow  # one vLLM engine per case
@pytest.mark.parametrize("stop", STOPS)
def test_a_vllm_rollout_stopped_while_a_tool_has_not_answered_ends(trained_dir: Path, tmp_path: Path,
                                                                    stop: str) -> None:
    assert_a_stopped_rollout_ends([sys.executable, "-c", ROLLOUT, str(trained_dir), stop], tmp_path, stop)
