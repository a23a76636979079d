"""A rollout never dies of its input, on the vLLM backend (issue 56, point 2; the hf schedulers:
tests/rollout/test_hostile_rollout.py). Needs `.venv-vllm`.

A tool answering lone surrogates made the renderer's tokenizer raise on the event loop: the row was lost and the
rollout waited for ever. Now the output is shown as U+FFFD; a reply that cannot be rendered ends its row only;
a row whose answer is lost is named and ended by the watchdog. pytest-timeout fails a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config.rollout import RolloutConfig
from pipeline.rollout import episode, watchdog
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import ToolResult
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.scripted import PROBLEM, Multiply

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # trains the tiny model, starts an engine


class Switch(Multiply):
    """The product, or (`surrogates`) the product followed by surrogates: a lone one, and a pair written as two
    code points."""

    surrogates = False
    deadline_s = 0.5  # the engine's deadline for a call is this plus the margin

    async def __call__(self, code: str) -> ToolResult:
        result = await super().__call__(code)
        if not self.surrogates:
            return result
        return ToolResult(f"{result.output} \ud83d\udc00 \ud83d", ok=True, latency_s=0.0)


def test_hostile_output_and_lost_answers_end_rows_never_the_vllm_rollout(trained_dir: Path, monkeypatch) -> None:
    from transformers import LlamaForCausalLM

    tok, tool = tiny_tokenizer(), Switch()
    config = RolloutConfig(backend="vllm", temperature=0.0, max_policy_tokens=64, max_total_tokens=512)
    engine = RolloutEngine(LlamaForCausalLM.from_pretrained(trained_dir), tok, {"code": tool}, config, seed=0)
    try:
        run = lambda: [t for g in engine.rollout([PROBLEM], 2).groups for t in g.trajectories]  # noqa: E731

        # a tool answering lone surrogates: shown and recorded as U+FFFD, the rows go on (they waited for ever)
        tool.surrogates = True
        for traj in run():
            assert traj.finish_reason != "error", traj.error
            (call,) = traj.tool_calls
            assert call.result.output == "42 \U0001f400 \ufffd"  # a pair written as two code points is its character
        tool.surrogates = False

        # a reply the renderer cannot render: that row ends with the reason, the rollout returns
        reply = engine.renderer.reply

        def raises(dialogue, segment_ids, answered):
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "a tokenizer that cannot take it")
        engine.renderer.reply = raises
        assert all(t.finish_reason == "error" and "could not be rendered" in t.error for t in run())
        engine.renderer.reply = reply

        # an answer lost on the event loop: the watchdog names the row and ends it
        monkeypatch.setattr(watchdog, "WATCHDOG_MARGIN_S", 0.0)
        spawn, lost = episode.Episodes._spawn, []

        def loses_the_first(self, seq, *args):
            if not lost:
                lost.append(self.row_label(seq))
                return None
            return spawn(self, seq, *args)
        monkeypatch.setattr(episode.Episodes, "_spawn", loses_the_first)
        trajs = run()
        ended = [t for t in trajs if t.finish_reason == "error"]
        assert len(ended) == 1 and ended[0].error.startswith(f"watchdog: row {lost[0]} waited")
        assert all(t.finish_reason != "error" for t in trajs if t is not ended[0])
    finally:
        engine.backend.close()
        engine.close()
