"""Hostile policy output through chat-tools, for every scheduler of the hf backend (issue 56, points 2 and 4).

The red-team cases, as scripted turns: a lone surrogate written as a JSON escape in a call's arguments and
echoed by the tool (the tokenizer raised in the renderer's reply: the rollout raised or waited for ever), and a
call whose argument is catastrophic for the schema's pattern under a backtracking engine. Each ends with a defined
reward, and the rollout returns. (Arguments nested past any bound: tests/protocols/test_tool_arguments.py.)
"""

from __future__ import annotations

import asyncio
import json

import pytest

from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig
from pipeline.reward.score import score_trajectory
from pipeline.rollout.engine import RolloutEngine
from pipeline.types import Problem, ToolResult, ToolSpec
from tests.protocols.chat_helpers import FAMILIES, ChatScriptedLM, family_tokenizer, turn_end_id

pytestmark = pytest.mark.timeout(180)

SCHEDULES = {"on-arrival": {"readmit_after_steps": 0}, "clocked": {"readmit_after_steps": 2},
             "turn-synchronous": {"schedule": "turn-synchronous"}}
PROBLEM = Problem("p0", "Echo a word.", ("ok",), "fact", "fact", "train")
ECHO = ToolSpec("echo", "Echo a word.", {"type": "object", "required": ["word"],
                                          "properties": {"word": {"type": "string", "pattern": "^(a+)+$|^\\S*$"}}},
                origin="MCP server 'echo'")


class Echo:
    name, spec = "echo", ECHO

    def __init__(self) -> None:
        self.received: list[str] = []

    async def __call__(self, call_input: str) -> ToolResult:
        self.received.append(call_input)
        await asyncio.sleep(0)
        return ToolResult(json.loads(call_input)["word"], ok=True)

    async def aclose(self) -> None:
        pass


def call(arguments: str) -> str:
    return f'<tool_call>\n{{"name": "echo", "arguments": {arguments}}}\n</tool_call>'


TURNS = {
    "lone surrogate, echoed": [call('{"word": "\\ud83d"}'), "It is \\boxed{ok}."],
    "catastrophic pattern": [call('{"word": "' + "a" * 60 + '! "}'), "It is \\boxed{ok}."],
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
@pytest.mark.parametrize("case", sorted(TURNS))
def test_hostile_calls_end_with_a_defined_reward_and_the_rollout_returns(schedule: str, case: str) -> None:
    tok, fam, eos = family_tokenizer("hermes"), FAMILIES["hermes"], turn_end_id("hermes")
    config = RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template=fam.template, parser=fam.parser),
                           max_policy_tokens=3000, max_total_tokens=6000, max_tool_calls=2, max_turns=3,
                           **SCHEDULES[schedule])
    scripts = [tok(t, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [eos] for t in TURNS[case]]
    model, echo = ChatScriptedLM(tok, fam.resume, eos, []), Echo()
    with RolloutEngine(model, tok, {"echo": echo}, config) as engine:
        model.scripts.append((engine._new_sequence(PROBLEM).prompt_ids, scripts))
        result = engine.rollout([PROBLEM], 2)
    for traj in result.groups[0].trajectories:
        reward = score_trajectory(PROBLEM, traj, RewardConfig(), protocol=engine.protocol, max_policy_tokens=3000)
        assert isinstance(reward.total, float)
        if case == "lone surrogate, echoed":  # the parser refuses the call, or the tool gets valid text back
            (made,) = traj.tool_calls
            assert traj.finish_reason == "answer", traj.error
            assert made.result.status == "malformed" or made.result.output == "\ufffd"
            assert all(json.loads(r) == {"word": "\ufffd"} for r in echo.received)
        else:  # refused as malformed: the pattern is matched in linear time
            assert traj.finish_reason in ("answer", "error") and not reward.format_ok
            assert echo.received == []
