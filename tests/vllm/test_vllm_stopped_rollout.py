"""`tests/rollout/test_stopped_rollout.py` on the vllm backend (needs `.venv-vllm`): a rollout stopped while a tool
has not answered ends its decoder thread, and the process exits with nothing of vLLM's left running, whether a
SIGTERM stops the stage or the awaiting caller cancels the rollout. vLLM decodes in an engine process of its own
and the engine's step loop waits on it, so this backend's decoder can be stuck where the hf one cannot."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.faults.conftest import Stage, assert_all_gone, stage_env

ROLLOUT = textwrap.dedent("""
    import asyncio, sys
    from transformers import LlamaForCausalLM
    from flows.common import stage_process
    from pipeline.config.rollout import RolloutConfig
    from pipeline.rollout.engine import RolloutEngine
    from tests.helpers.tiny import tiny_tokenizer
    from tests.vllm.scripted import PROBLEM
    from tests.helpers.unanswered import Unanswered

    model_dir, stop = sys.argv[1:]

    cfg = RolloutConfig(backend="vllm", temperature=0.0, max_policy_tokens=64, max_total_tokens=512)
    engine = RolloutEngine(LlamaForCausalLM.from_pretrained(model_dir), tiny_tokenizer(), {"code": Unanswered()},
                           cfg, seed=0)  # never closed, as by a crash
    if stop == "sigterm":
        with stage_process():
            engine.rollout([PROBLEM], 2)
    else:
        async def cancelled_at_the_first_call():
            task = asyncio.current_task()
            Unanswered.on_call = staticmethod(lambda: task.cancel())
            await engine.arollout([PROBLEM], 2)
        try:
            asyncio.run(cancelled_at_the_first_call())  # closing the loop joins the threads it started
        except asyncio.CancelledError:
            print("cancelled", flush=True)
""")


@pytest.mark.slow  # one vLLM engine per case
@pytest.mark.parametrize("stop", ["sigterm", "cancel"])
def test_a_vllm_rollout_stopped_while_a_tool_has_not_answered_ends(trained_dir: Path, tmp_path: Path,
                                                                    stop: str) -> None:
    stage = Stage([sys.executable, "-c", ROLLOUT, str(trained_dir), stop], tmp_path, stage_env())
    try:
        stage.wait_for_line("called")
        started = psutil.Process(stage.proc.pid).children(recursive=True)  # vLLM's engine process among them
        if stop == "sigterm":
            stage.proc.send_signal(signal.SIGTERM)
        try:
            code = stage.wait()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process stopped mid-rollout ({stop}) did not exit:\n{stage.output()[-3000:]}")
        assert code == (143 if stop == "sigterm" else 0), stage.output()[-3000:]
        assert stop == "sigterm" or "cancelled" in stage.output()
        assert_all_gone(started, f"vLLM's processes after a rollout stopped by {stop}")
    finally:
        stage.kill_all()
