"""`CodeSandboxClient` against the real sandbox: ToRL-style output, statuses, never an exception."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.config.sandbox import SandboxConfig
from pipeline.services.processes import free_port
from pipeline.tools.base import Tool
from pipeline.tools.code import CodeSandboxClient, model_output
from tests.sandbox.support import Sandbox


def test_model_output_appends_the_error_line_after_stdout() -> None:
    assert model_output("1\n", None) == "1\n"
    assert model_output("", None) == ""
    assert model_output("1\n", "ZeroDivisionError: division by zero") == "1\nZeroDivisionError: division by zero"
    assert model_output("1", "ValueError: x") == "1\nValueError: x"
    assert model_output("", "ValueError: x") == "ValueError: x"


async def test_client_is_a_tool_and_reports_results(sandbox: Sandbox) -> None:
    client = CodeSandboxClient(sandbox.url, timeout_s=2.0)
    try:
        assert isinstance(client, Tool) and client.name == "code"
        ok, failed, silent, slow = await asyncio.gather(
            client("print(6 * 7)"), client("print('partial')\n1/0"), client("x = 1"), client("while True: pass"))
    finally:
        await client.aclose()
    assert (ok.ok, ok.status, ok.output, ok.error) == (True, "ok", "42\n", None)
    assert (failed.ok, failed.status) == (False, "error")
    assert failed.output == "partial\nZeroDivisionError: division by zero"
    assert (silent.ok, silent.output) == (True, "")
    assert (slow.ok, slow.status) == (False, "timeout") and "TimeoutError" in slow.output
    assert ok.latency_s > 0


async def test_unreachable_service_is_a_failure_not_an_exception() -> None:
    client = CodeSandboxClient(f"http://127.0.0.1:{free_port()}", retries=1)
    try:
        result = await client("print(1)")
    finally:
        await client.aclose()
    assert (result.ok, result.status) == (False, "unavailable")
    assert "unavailable" in result.output


async def test_too_large_code_is_rejected(sandbox: Sandbox) -> None:
    client = CodeSandboxClient(sandbox.url)
    try:
        result = await client("#" * 70_000)
    finally:
        await client.aclose()
    assert (result.ok, result.status) == (False, "rejected")


async def test_from_config_uses_the_sandbox_section(sandbox: Sandbox) -> None:
    cfg = SandboxConfig(timeout_s=1.5, memory_mb=256, concurrency=3, retries=1)
    client = CodeSandboxClient.from_config(cfg, sandbox.url)
    try:
        assert (client.timeout_s, client.memory_mb, client.retries) == (1.5, 256, 1)
        results = await asyncio.gather(*(client(f"print({i})") for i in range(6)))
    finally:
        await client.aclose()
    assert [r.output for r in results] == [f"{i}\n" for i in range(6)]


def test_bad_client_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="URL"):
        CodeSandboxClient("")
    with pytest.raises(ValueError, match="concurrency"):
        CodeSandboxClient("http://127.0.0.1:1", concurrency=0)


def test_server_args_follow_the_config() -> None:
    args = SandboxConfig(workers=3, queue_size=9).server_args()
    assert args[:4] == ["--workers", "3", "--queue-size", "9"]


@pytest.mark.parametrize("ranks", [1, 2, 8])
def test_a_sandbox_for_several_training_ranks_is_sized_for_them(ranks: int) -> None:
    args = SandboxConfig(workers=3, queue_size=9, max_timeout_s=7.0).server_args(ranks)
    assert args[:4] == ["--workers", str(3 * ranks), "--queue-size", str(9 * ranks)]  # per rank: each samples
    assert args[4:6] == ["--max-timeout-s", "7.0"]  # limits on one request do not scale
