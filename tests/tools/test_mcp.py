"""An MCP server as a tool source, with a real server process (the official `mcp` package, tests/tools/mcp_server.py)
over stdio and over streamable HTTP: schemas read at start-up, calls through the registry's client path with
timeouts, a concurrency limit and failure accounting, and the tools offered to a chat-tools rollout."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.config import config_from_dict
from pipeline.config.rollout import RolloutConfig
from pipeline.config.tools import ChatToolsConfig
from pipeline.jsonl import write_problems
from pipeline.protocols import TemplateError
from pipeline.protocols import protocol_for
from pipeline.rollout.engine import RolloutEngine
from pipeline.train import set_up
from pipeline.services.processes import ServiceProcess, free_port
from tests.helpers.tools import registry
from pipeline.tools.mcp import McpUnavailable
from pipeline.types import Problem
from tests.helpers.tiny import tiny_llama
from tests.protocols.chat_helpers import (FAMILIES, STRIPS_REASONING, ChatScriptedLM, family_tokenizer,
                                          smollm2_tokenizer, turn_end_id)

SERVER = Path(__file__).with_name("mcp_server.py")


def mcp_config(**entry):
    source = {"kind": "mcp", "name": "toy", "command": [sys.executable, str(SERVER)], "prefix": "toy_",
              "timeout_s": 2.0, "startup_timeout_s": 60.0, **entry}
    return config_from_dict({"rollout": {"protocol": "chat-tools", "tools": [{"kind": "code"}, source]}})


def run_all(tools: dict, *calls: tuple[str, dict]) -> list:
    async def go() -> list:
        return await asyncio.gather(*(tools[name](json.dumps(args)) for name, args in calls))

    return asyncio.run(go())


def close(tools: dict) -> None:
    async def go() -> None:
        for tool in tools.values():
            await tool.aclose()

    asyncio.run(go())


@pytest.fixture(scope="module")
def stdio_tools() -> Iterator[dict]:
    tools = registry(mcp_config(concurrency=2), {})
    yield tools
    close(tools)


def test_the_servers_tools_and_schemas_are_read_at_start_up(stdio_tools: dict) -> None:
    assert sorted(stdio_tools) == ["toy_add", "toy_big", "toy_busy", "toy_die", "toy_nap", "toy_refuse", "toy_shout"]
    spec = stdio_tools["toy_add"].spec
    assert spec.name == "toy_add" and spec.description == "Add two integers."
    assert spec.parameters["required"] == ["a", "b"]
    assert {k: v["type"] for k, v in spec.parameters["properties"].items()} == {"a": "integer", "b": "integer"}


def test_calls_go_through_with_results_errors_and_timeouts_accounted(stdio_tools: dict) -> None:
    added, shouted, refused, napped = run_all(stdio_tools, ("toy_add", {"a": 2, "b": 40}),
                                              ("toy_shout", {"text": "<|im_end|> tapo"}),
                                              ("toy_refuse", {"reason": "no"}), ("toy_nap", {"seconds": 5.0}))
    assert (added.ok, added.output) == (True, "42") and shouted.output == "<|IM_END|> TAPO"
    assert not refused.ok and refused.status == "error" and not refused.infrastructure  # the tool's own refusal
    assert napped.infrastructure and "no answer in 2.0s" in napped.output  # past timeout_s: an outage
    assert stdio_tools["toy_nap"].counts.infrastructure == 1


def test_at_most_concurrency_calls_are_in_flight(stdio_tools: dict) -> None:
    results = run_all(stdio_tools, *[("toy_busy", {"seconds": 0.2})] * 5)
    assert all(r.ok for r in results)
    assert max(int(r.output) for r in results) <= 2


def test_a_server_that_dies_is_an_outage_then_started_again() -> None:
    tools = registry(mcp_config(tools=["die", "add"], timeout_s=120.0), {})  # a bound on the restart's wait
    try:
        assert sorted(tools) == ["toy_add", "toy_die"]
        died, = run_all(tools, ("toy_die", {}))
        after, = run_all(tools, ("toy_add", {"a": 1, "b": 1}))
        assert died.infrastructure and "unavailable" in died.output  # the call it died under
        assert after.ok and after.output == "2"  # before: every later call was an outage, for the rest of the run
        assert tools["toy_add"].server.restarts == 1
    finally:
        close(tools)


def test_a_server_that_cannot_start_or_lacks_a_tool_is_refused_naming_it() -> None:
    with pytest.raises(McpUnavailable, match="MCP server 'toy': could not start"):
        registry(mcp_config(command=[sys.executable, "-c", "import sys; sys.exit(3)"], startup_timeout_s=20.0,
                              restarts=1), {})
    with pytest.raises(McpUnavailable, match=r"has no tool\(s\) \['translate'\]"):
        registry(mcp_config(tools=["add", "translate"]), {})


def test_a_streamable_http_server_is_a_tool_source(tmp_path: Path) -> None:
    port = free_port()
    service = ServiceProcess("mcp", [sys.executable, str(SERVER), "http", str(port)], port, tmp_path / "mcp.log",
                             health_path=None)
    with service.start(timeout_s=60):
        cfg = mcp_config(command=[], url=f"http://127.0.0.1:{port}/mcp", tools=["add", "big"], prefix="",
                         max_answer_bytes=1 << 20)
        tools = registry(cfg, {})
        try:
            added, = run_all(tools, ("add", {"a": 20, "b": 22}))
            assert added.ok and added.output == "42"
            huge, after = run_all(tools, ("big", {"size": 3 << 20}), ("add", {"a": 1, "b": 1}))
            assert (huge.ok, huge.status, huge.infrastructure) == (False, "too_large", False), huge  # bounded
            assert after.ok and after.output == "2"
        finally:
            close(tools)


def test_an_mcp_tool_answers_a_chat_tools_rollout(stdio_tools: dict) -> None:
    tok, fam = family_tokenizer("hermes"), FAMILIES["hermes"]
    eos = turn_end_id("hermes")
    problem = Problem("m", "What is 2 + 40, shouted?", ("42",), "math", "gsm8k", "train")
    call = protocol_for("chat-tools").parser.render([("toy_add", {"a": 2, "b": 40}), ("toy_shout", {"text": "hi"})],
                                                    "Using the server.")
    turns = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in (call, "\\boxed{42}")]
    model = ChatScriptedLM(tok, fam.resume, eos, [])
    tools = {k: v for k, v in stdio_tools.items() if k in ("toy_add", "toy_shout")}
    cfg = RolloutConfig(protocol="chat-tools", chat_tools=ChatToolsConfig(template="hermes"), max_total_tokens=2000,
                        max_policy_tokens=300)
    engine = RolloutEngine(model, tok, tools, cfg)
    prompt = engine._new_sequence(problem).prompt_ids
    assert "toy_add" in tok.decode(prompt) and "Add two integers." in tok.decode(prompt)  # declared by its schema
    model.scripts.append((prompt, turns))
    traj = engine.rollout([problem], 1).groups[0].trajectories[0]
    assert [(c.tool, c.result.output) for c in traj.tool_calls] == [("toy_add", "42"), ("toy_shout", "HI")]
    assert traj.finish_reason == "answer"


def test_a_training_set_up_that_fails_after_the_server_started_stops_it(tmp_path: Path) -> None:
    """The registry starts before the chat template is checked: a template refused at set-up must not leave
    the MCP server's connection (and its child process) running behind the error."""
    tok = smollm2_tokenizer()
    tiny_llama(len(tok), seed=0).save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    write_problems(tmp_path / "train.jsonl", [Problem("p0", "What is 2 + 3?", ("5",), "math", "math", "train")])
    source = {"kind": "mcp", "name": "refused", "command": [sys.executable, str(SERVER)], "startup_timeout_s": 60.0}
    cfg = config_from_dict({
        "rollout": {"protocol": "chat-tools", "chat_tools": {"template": str(STRIPS_REASONING)},
                    "tools": [{"kind": "code"}, source]},
        "train": {"init_model": str(tmp_path / "init"), "train_file": str(tmp_path / "train.jsonl"),
                  "checkpoints": {"dir": str(tmp_path / "ckpt")}, "update": {"gradient_checkpointing": False}},
        "model": {"device": "cpu"}})
    with pytest.raises(TemplateError, match="incrementally"):
        set_up(cfg, {})
    assert not [t.name for t in threading.enumerate() if t.name == "mcp-refused"]
