"""Synchronous user tools run on their own bounded threads (`pipeline.tools.threads.ToolThreads`), so one tool
cannot starve another, a hung call is the tool's failure (an outage), a tool whose every thread is hung answers
further calls at once ("saturated"), and nothing waits for a hung thread: not the rollout's event loop when it
closes, not the interpreter when it exits. Before, the event loop's default executor was shared by every tool:
8 calls into a hanging tool held it, and every later call of every synchronous tool timed out, charged to the
policy; and `asyncio.run` joined the hung threads when the rollout's loop closed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from pipeline.config.tools import PythonToolEntry
from pipeline.paths import REPO_ROOT
from pipeline.tools.user import PythonTool
from pipeline.types import ToolResult
from tests.tools import user_functions

pytestmark = pytest.mark.integration  # hung tools and an interpreter's exit, in child processes

ANY = {"type": "object"}


def tool(function: str, **settings) -> PythonTool:
    return PythonTool(PythonToolEntry(name=function, function=f"tests.tools.user_functions:{function}",
                                      description="A test tool.", parameters=ANY, **settings))


@pytest.fixture(autouse=True)
def release_hung_calls() -> Iterator[None]:
    user_functions.RELEASE.clear()
    user_functions.CALLS["hang"] = 0
    yield
    user_functions.RELEASE.set()


async def calls(target: PythonTool, n: int, **arguments) -> list[ToolResult]:
    return await asyncio.gather(*(target(json.dumps(arguments)) for _ in range(n)))


def test_hanging_sync_tool_does_not_starve_another_tool() -> None:
    hanging, lookup = tool("hang", timeout_s=0.3, concurrency=2), tool("lookup", timeout_s=5.0)

    async def go() -> tuple[list[ToolResult], list[ToolResult]]:
        stuck = await calls(hanging, 8)  # as many as the shared default executor had threads, and more
        return stuck, await calls(lookup, 8, word="tapo")

    stuck, answered = asyncio.run(go())
    assert all(r.infrastructure and r.status in ("timeout", "saturated") for r in stuck), stuck
    assert all(r.ok and r.output == "tapo: sense 1" for r in answered), answered  # before: all timed out


def test_hanging_sync_tool_is_the_tools_failure_then_saturated_answers_at_once() -> None:
    hanging = tool("hang", timeout_s=0.3, concurrency=2)

    async def go() -> tuple[list[ToolResult], list[ToolResult]]:
        first = await calls(hanging, 2)
        return first, await calls(hanging, 3)

    first, later = asyncio.run(go())
    assert all(r.status == "timeout" and r.infrastructure and "did not finish in 0.3s" in r.output for r in first)
    # Both threads are held past their deadline: the next calls are refused without running or waiting.
    assert all(r.status == "saturated" and r.infrastructure for r in later), later
    assert user_functions.CALLS["hang"] == 2
    assert hanging._threads.hung == 2
    user_functions.RELEASE.set()  # the hung calls return: the tool's threads are free again


def test_hanging_sync_tool_gives_its_threads_back_when_its_calls_return() -> None:
    hanging = tool("hang", timeout_s=0.3, concurrency=1)
    stuck, = asyncio.run(calls(hanging, 1))
    assert stuck.status == "timeout"
    user_functions.RELEASE.set()
    # the released call returns on its own thread, whenever the machine schedules it: wait for that, not a time
    deadline = time.monotonic() + 30
    while hanging._threads.hung and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hanging._threads.hung == 0, "the released call never gave its thread back"
    answered, = asyncio.run(calls(hanging, 1, seconds=0.0))
    assert answered.ok and answered.output == "released"


def test_hanging_sync_tool_call_waits_for_a_live_thread() -> None:
    """A call that finds every thread busy with calls still within their deadline waits for one (it is not
    refused): a slow call is not a hung one."""
    slow = tool("slow", timeout_s=10.0, concurrency=1)
    results = asyncio.run(calls(slow, 3, seconds=0.05))
    assert all(r.ok for r in results), results


@pytest.mark.parametrize(("function", "error"), [("stops", "RuntimeError: StopIteration"),
                                                 ("exits", "RuntimeError: SystemExit")])
def test_sync_tool_raising_what_asyncio_cannot_carry_is_its_error(function: str, error: str) -> None:
    """StopIteration cannot be set on an asyncio future (the call waited for its timeout, charged to the policy),
    and SystemExit would end the rollout's loop: both are the tool's error, shown to the model."""
    result = asyncio.run(tool(function, timeout_s=30.0)("{}"))
    assert (result.ok, result.status, result.infrastructure) == (False, "error", False)
    assert result.output.startswith(error)


def test_huge_answer_from_a_python_tool_is_cut_as_too_large() -> None:
    result = asyncio.run(tool("huge", max_answer_bytes=1024)(json.dumps({"n": 5000})))
    assert (result.status, result.infrastructure) == ("too_large", False) and len(result.output) < 200


def test_python_tool_answering_a_lone_surrogate_gives_valid_text() -> None:
    result = asyncio.run(tool("lone_surrogate")(json.dumps({"word": "x"})))
    assert result.ok and result.output == "\ufffdx"


def test_hanging_sync_tool_does_not_hold_the_loop_or_the_interpreter_at_exit() -> None:
    """A rollout's `asyncio.run` returns, and the process exits, with a call still hung (before: the loop's
    closing joined the default executor's threads, for ever)."""
    script = textwrap.dedent("""
        import asyncio, json
        from pipeline.config.tools import PythonToolEntry
        from pipeline.tools.user import PythonTool
        tool = PythonTool(PythonToolEntry(name="hang", function="tests.tools.user_functions:hang",
                                          description="Hangs.", parameters={"type": "object"}, timeout_s=0.2))
        result = asyncio.run(tool(json.dumps({})))
        print(result.status, flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "timeout", done.stderr[-2000:]
