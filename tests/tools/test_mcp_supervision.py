"""MCP servers are supervised: hostile servers (tests/tools/hostile_mcp.py, one per misbehaviour) against the
registry's client, each property checked by what the client returns, the processes left, the log, and CPU time
or memory (never wall time):

* a start (spawn, `initialize`, tool list) has a deadline; a server that misses it is started again a bounded
  number of times, then refused naming it, and no process of it is left, even one that ignores SIGTERM;
* a server that exits, writes a line that is not UTF-8 or not JSON-RPC, or floods its stdout, costs the calls
  in flight (outages) and is started again, logged; restarts in a row are bounded, then the server is given up;
* a 40 MB result is read in linear time and bounded memory and answered "too_large" (not an outage), the
  connection kept; a dripping result is cut at the call's deadline;
* no server outlives the process that started it (SIGKILLed) or its connection."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pipeline.config.tools import McpToolEntry
from pipeline.paths import REPO_ROOT
from pipeline.tools.mcp import McpTool, McpUnavailable, mcp_tools
from pipeline.tools.mcp_stdio import STDERR_BYTES
from pipeline.types import ToolResult

pytestmark = pytest.mark.integration  # MCP server processes

HOSTILE = Path(__file__).with_name("hostile_mcp.py")


def entry(*mode: str, **settings) -> McpToolEntry:
    return McpToolEntry(name="hostile", command=(sys.executable, str(HOSTILE), *mode),
                        **{"timeout_s": 20.0, "startup_timeout_s": 20.0, "restarts": 2} | settings)


@pytest.fixture()
def starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file each hostile server writes its pid to when it starts (they inherit PATH, HOME ... and this)."""
    path = tmp_path / "starts"
    monkeypatch.setenv("HOSTILE_MCP_STARTS", str(path))
    monkeypatch.setattr("mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS",
                        ["HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "HOSTILE_MCP_STARTS"])
    return path


def pids(starts: Path) -> list[int]:
    return [int(line) for line in starts.read_text().split()] if starts.exists() else []


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture()
def hostile(request: pytest.FixtureRequest, starts: Path) -> Iterator[McpTool]:
    """The one tool (echo) of a hostile server started with the test's `entry` (parametrized indirectly)."""
    tool, = mcp_tools(request.param)
    yield tool
    asyncio.run(tool.aclose())
    assert pids(starts) and all(gone(pid) for pid in pids(starts)), "a server outlived its connection's close"


def echo(tool: McpTool, *texts: str) -> list[ToolResult]:
    async def calls() -> list[ToolResult]:
        return [await tool(json.dumps({"text": text})) for text in texts]

    return asyncio.run(calls())


def with_server(*mode: str, **settings):
    return pytest.mark.parametrize("hostile", [entry(*mode, **settings)], indirect=True)


@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_mcp_never_initializes_is_refused_naming_it_and_leaves_no_process(starts: Path, ignores_sigterm: bool) -> None:
    mode = ("never-initializes", "--no-term") if ignores_sigterm else ("never-initializes",)
    with pytest.raises(McpUnavailable, match=r"MCP server 'hostile'.* 2 attempt\(s\).*`initialize`"):
        mcp_tools(entry(*mode, startup_timeout_s=1.0, restarts=1))
    assert len(pids(starts)) == 2  # started again once, then refused
    assert all(gone(pid) for pid in pids(starts)), "a server that never initialized outlived its start-up"


def test_mcp_that_exits_at_start_is_tried_restarts_times_then_refused(starts: Path) -> None:
    with pytest.raises(McpUnavailable, match="3 attempt.*it closed its stdout"):
        mcp_tools(entry("exits-at-start", restarts=2))
    assert len(pids(starts)) == 3


@with_server("exits-after", "2")
def test_mcp_exits_after_calls_is_restarted_and_answers_again(hostile: McpTool, starts: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    first, second, exited, after = echo(hostile, "a", "b", "c", "d")
    assert first.ok and second.ok
    assert exited.infrastructure and exited.status == "unavailable"  # the server died under the call: an outage
    assert after.ok and after.output == "d"  # started again (before: every later call was an outage)
    assert hostile.server.restarts == 1 and "closed its stdout" in caplog.text
    old, new = pids(starts)
    assert gone(old) and not gone(new)


@pytest.mark.parametrize(("mode", "logged"), [
    ("bad-utf8-after", "not UTF-8"), ("not-json-after", "not a JSON-RPC message"),
    ("floods-after", "not a JSON-RPC message"), ("notifies-after", "messages nobody asked for")])
def test_mcp_bad_line_or_flood_restarts_the_server(starts: Path, caplog: pytest.LogCaptureFixture, mode: str,
                                                    logged: str) -> None:
    tool, = mcp_tools(entry(mode, "1"))
    try:
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        ok, broken, after = echo(tool, "a", "b", "c")
        used = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        asyncio.run(tool.aclose())
    assert ok.ok and broken.infrastructure and after.ok and after.output == "c"
    assert tool.server.restarts == 1 and logged in caplog.text
    # Bounded: one warning for the whole flood (the package's reader logged a traceback per line), little CPU.
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) <= 3, caplog.text[:2000]
    assert (used.ru_utime + used.ru_stime) - (cpu.ru_utime + cpu.ru_stime) < 5.0
    assert all(gone(pid) for pid in pids(starts))


def test_mcp_restarts_in_a_row_are_bounded_then_the_server_is_given_up(starts: Path) -> None:
    tool, = mcp_tools(entry("exits-after", "0", restarts=2))  # every call kills it: no call is ever answered
    try:
        results = echo(tool, *"abcde")
    finally:
        asyncio.run(tool.aclose())
    assert all(r.infrastructure and not r.ok for r in results)
    assert "given up" in results[-1].output
    assert len(pids(starts)) == 3 and tool.server.restarts == 2  # the first start and 2 restarts, no more


@with_server("huge", "40000000", max_answer_bytes=1 << 20)
def test_huge_answer_from_mcp_is_cut_in_linear_time_and_bounded_memory(hostile: McpTool) -> None:
    echo(hostile, "warm")  # the first call's one-off costs (imports, pydantic models) are not the reader's
    tracemalloc.start()
    try:
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        first, second = echo(hostile, "a", "b")
        used = resource.getrusage(resource.RUSAGE_SELF)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for result in (first, second):
        assert (result.ok, result.status, result.infrastructure) == (False, "too_large", False)
        assert "40000100 bytes, over the limit of 1048576" in result.output
    assert hostile.server.restarts == 0  # the connection lives on
    # Before: 40 MB took 12 s of CPU (quadratic) and held 190 MB; reading it linearly takes a fraction of a second.
    assert (used.ru_utime + used.ru_stime) - (cpu.ru_utime + cpu.ru_stime) < 3.0
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held while reading"


@with_server("huge-late-id", "3000000", max_answer_bytes=1 << 20)
def test_huge_answer_from_mcp_without_a_readable_id_restarts_the_server(hostile: McpTool, starts: Path) -> None:
    cut, again = echo(hostile, "a", "b")
    assert cut.infrastructure and again.infrastructure  # no request to answer: the framing is lost, an outage
    assert len(pids(starts)) == 2  # the second call waited for the server to be started again


@with_server("drips", timeout_s=0.5)
def test_dripping_mcp_result_is_cut_at_the_calls_deadline(hostile: McpTool) -> None:
    dripped, = echo(hostile, "a" * 200)  # ~5 s of drip
    assert dripped.infrastructure and "no answer in 0.5s" in dripped.output


@with_server("lone-surrogate")
def test_mcp_result_with_a_lone_surrogate_is_valid_text_not_a_restart(hostile: McpTool) -> None:
    result, = echo(hostile, "x")
    assert result.ok and result.output == "\ufffdx"
    result.output.encode("utf-8")
    assert hostile.server.restarts == 0


def test_mcp_stderr_flood_is_capped_in_its_log() -> None:
    tool, = mcp_tools(entry("stderr-flood", str(8 * STDERR_BYTES)))
    try:
        answered, = echo(tool, "a")
    finally:
        asyncio.run(tool.aclose())
    assert answered.ok
    assert STDERR_BYTES <= Path(tool.server.log.name).stat().st_size < STDERR_BYTES + 200


def test_mcp_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A trainer killed by SIGKILL cannot close anything: the server gets a parent-death signal."""
    script = textwrap.dedent(f"""
        import sys, time
        from pipeline.config.tools import McpToolEntry
        from pipeline.tools.mcp import mcp_tools
        tool, = mcp_tools(McpToolEntry(name="h", command=({sys.executable!r}, {str(HOSTILE)!r}, "ok")))
        print(tool.server.processes[0].pid, flush=True)
        time.sleep(600)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        server = int(trainer.stdout.readline())
        assert not gone(server)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(60)
        try:
            psutil.wait_procs([psutil.Process(server)], timeout=60)
        except psutil.NoSuchProcess:
            pass
        assert gone(server)
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
