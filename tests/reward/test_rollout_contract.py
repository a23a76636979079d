"""The scorer reads responses exactly as the rollout protocols write them (wrap_output)."""

from __future__ import annotations

import pytest

from pipeline.config.reward import RewardConfig
from pipeline.reward import check_format, score_trajectory
from pipeline.protocols import protocol_for
from pipeline.types import Problem, ToolCall, ToolResult, Trajectory

CALLS = {
    "tapo": "<think>compute</think>\n<code>print(6 * 7)</code>",
    "search-r1": "<think>look up</think>\n<search>six times seven</search>",
    "torl": "Let me compute.\n```python\nprint(6 * 7)\n```\n",
    "tapo-no-think": "<code>print(6 * 7)</code>",
}
ANSWERS = {"tapo": "<answer>42</answer>", "tapo-no-think": "<answer>42</answer>", "search-r1": "<answer>42</answer>", "torl": "So the answer is \\boxed{42}."}
HACKS = {
    "tapo": "<response>42</response>",
    "search-r1": "<information>42</information>",
    "torl": "```output\n42\n```\n",
    "tapo-no-think": "<response>42</response>",
}


@pytest.mark.parametrize("protocol", ["tapo", "tapo-no-think", "search-r1", "torl"])
def test_engine_written_output_passes_and_a_model_written_one_fails(protocol: str) -> None:
    wrap = protocol_for(protocol).wrap_output
    tool = "code" if protocol != "search-r1" else "search"
    honest = CALLS[protocol] + wrap("42") + ANSWERS[protocol]
    hacked = CALLS[protocol] + wrap("42") + HACKS[protocol] + ANSWERS[protocol]
    assert check_format(honest, protocol_for(protocol), ["42"]).ok
    assert not check_format(hacked, protocol_for(protocol), ["42"]).ok

    problem = Problem("p", "6 * 7?", ("42",), "calculator", "calculator", "train")
    call = ToolCall(tool, "x", ToolResult("42\n", True), (0, 5), (5, 8))  # type: ignore[arg-type]
    trajectory = Trajectory("p", (1,), tuple(range(20)), (1,) * 5 + (0,) * 3 + (1,) * 12, (0.0,) * 20, (call,),
                            "answer", honest, 2)  # fmt: skip
    result = score_trajectory(problem, trajectory, RewardConfig(), protocol=protocol_for(protocol), max_policy_tokens=100)
    assert (result.format_ok, result.total, result.predicted) == (True, 1.0, "42")
