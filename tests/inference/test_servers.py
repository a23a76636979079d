"""Supervision, routing, retries and the push sequence against stand-in servers (tests/inference/fake_server.py, a
process group with an "engine" child like vLLM's): a server killed mid-request is retried elsewhere, counted and
restarted, one that keeps dying is given up on loudly, and no process outlives the pool, closed or SIGKILLed.
The same properties against the real vLLM server: tests/vllm/test_server_*.py."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.inference.client import GenerateFailed, GenerateRejected, InferenceClient
from pipeline.inference.control import WeightsRefused
from pipeline.inference.layout import WeightLayoutError
from pipeline.inference.outages import InferenceOutage, ServerOutageGuard
from pipeline.inference.pool import ServerPool, Supervision
from pipeline.inference.records import Sampling
from pipeline.inference.server import ServerProcess, ServerState
from pipeline.inference.weights import FileTransport, WeightPusher, WeightSource
from pipeline.services.processes import free_port

FAKE = Path(__file__).with_name("fake_server.py")
FAST = Supervision(start_timeout_s=30.0, max_restarts=2, interval_s=0.2, unhealthy_polls=3, control_deadline_s=10.0,
                   load_deadline_s=10.0)
REPO = Path(__file__).resolve().parents[2]


def fake(name: str, logs: Path, token_delay: float = 0.0, port: int | None = None, world_size: int = 1) -> ServerProcess:
    port = port or free_port()
    return ServerProcess(name, [sys.executable, str(FAKE), "--port", str(port), "--token-delay", str(token_delay),
                                "--world-size", str(world_size)], port, logs / f"{name}.log")


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False


def wait_for(condition, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def pool_of(tmp_path: Path) -> Iterator:
    pools: list[ServerPool] = []
    messages: list[str] = []

    def make(n: int, token_delay: float = 0.0, supervision: Supervision = FAST) -> ServerPool:
        pool = ServerPool.of_processes([fake(f"fake-{i}", tmp_path, token_delay) for i in range(n)], supervision,
                                       log=messages.append)
        pool.messages = messages
        pools.append(pool)
        return pool.start(60.0)

    yield make
    for pool in pools:
        pool.close()


def test_a_started_pool_is_caught_up_and_leaves_no_process_when_closed(pool_of) -> None:
    pool = pool_of(2)
    assert [(s.state, s.version, s.generation) for s in pool.servers] == [(ServerState.READY, 0, 1)] * 2
    assert {httpx.get(s.url + "/weight_info").json()["weight_version"] for s in pool.servers} == {"0"}
    groups = [k.process.process.pid for k in pool.keepers]
    assert all(group_alive(g) for g in groups)
    pool.close()
    assert not any(group_alive(g) for g in groups)  # the "engine" children too, not only the first processes


def test_a_pinned_server_and_its_children_run_on_its_cores(tmp_path: Path) -> None:
    process = fake("pinned", tmp_path)
    process.cores = (0,)
    process.start(30.0)
    try:
        group = process.process.pid
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]
        assert len(members) >= 2  # the server and its "engine" (and the shared memory's resource tracker)
        assert all(os.sched_getaffinity(pid) == {0} for pid in members)
    finally:
        process.stop()
    assert not group_alive(group)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


async def generating(client: InferenceClient, pool: ServerPool, key: str) -> str:
    """The server `key`'s request went to, once it has generated a token of it: waited for, not slept for, so a busy
    machine cannot leave the test acting before the request started (a fresh stand-in has generated nothing else)."""
    while key not in client.router.home:
        await asyncio.sleep(0.005)
    home = client.router.home[key]
    url = next(s.url for s in pool.servers if s.name == home)
    async with httpx.AsyncClient(timeout=30) as http:
        while (await http.get(url + "/_generated")).json()["generated"] == 0:
            await asyncio.sleep(0.005)
    return home


async def test_a_server_killed_mid_request_is_retried_elsewhere_counted_and_restarted(pool_of) -> None:
    pool = pool_of(2, token_delay=0.02)
    guard = ServerOutageGuard(max_step_share=1.0, max_run_share=1.0)
    async with InferenceClient(pool, deadline_s=30.0, attempts=3, counts=guard.step) as client:
        request = asyncio.create_task(client.generate("traj", [1, 2, 3], Sampling(max_tokens=100)))
        home = await generating(client, pool, "traj")  # mid-request: 100 tokens take at least 2 s
        victim = next(k for k in pool.keepers if k.server.name == home)
        segments = victim.process.shared_memory
        os.killpg(victim.process.process.pid, signal.SIGKILL)  # its resource tracker too: nothing of it cleans up
        generation = await request
    assert generation.server != home and generation.attempts == 2 and len(generation.token_ids) == 100
    metrics = guard.check()
    assert metrics[f"inference_outages/{home}"] == 1.0 and metrics["inference/failed_requests"] == 0.0
    wait_for(lambda: victim.server.state is ServerState.READY and victim.server.restarts == 1)
    assert victim.server.generation == 2 and victim.server.version == 0
    assert segments and not any(Path(p).exists() for p in segments)  # its shared memory is not left in /dev/shm
    assert any("restarting it (1 of 2)" in m for m in pool.messages)


def test_a_restart_ends_what_the_dead_server_left_in_its_group(pool_of) -> None:
    """The first process killed alone (as the OOM killer may kill vLLM's API server) leaves its engine running in the
    group; the restart ends the whole old group, not only the first process (which is already gone)."""
    pool = pool_of(1)
    keeper = pool.keepers[0]
    group, segments = keeper.process.process.pid, keeper.process.shared_memory
    assert segments and all(Path(p).exists() for p in segments)
    os.kill(group, signal.SIGKILL)
    wait_for(lambda: keeper.server.restarts == 1 and keeper.server.state is ServerState.READY)
    assert not group_alive(group)
    assert not any(Path(p).exists() for p in segments)  # the dead server's shared memory is not left in /dev/shm


async def test_sticky_per_trajectory_and_least_loaded_for_new_ones(pool_of) -> None:
    pool = pool_of(2, token_delay=0.005)
    async with InferenceClient(pool, deadline_s=30.0, attempts=1) as client:
        first = await asyncio.gather(*[client.generate(f"t{i}", [i], Sampling(max_tokens=20)) for i in range(6)])
        assert sorted(g.server for g in first) == ["fake-0"] * 3 + ["fake-1"] * 3  # spread while in flight
        turns = await asyncio.gather(*[client.generate(f"t{i}", [i, 7, 8], Sampling(max_tokens=5)) for i in range(6)])
        assert [g.server for g in turns] == [g.server for g in first]  # every later turn on its first server


async def test_a_server_that_keeps_dying_is_given_up_and_the_run_stops_loudly(pool_of) -> None:
    pool = pool_of(1, supervision=Supervision(30.0, 1, 0.2, 3, 10.0, 10.0))
    keeper = pool.keepers[0]
    for _ in range(2):
        wait_for(lambda: keeper.server.state is ServerState.READY)
        os.killpg(keeper.process.process.pid, signal.SIGKILL)
        wait_for(lambda: keeper.server.state is not ServerState.READY)
    wait_for(lambda: keeper.server.state is ServerState.FAILED)
    assert any("not restarted again after 1 restart(s)" in m for m in pool.messages)
    guard = ServerOutageGuard(max_step_share=0.5, max_run_share=0.5)
    async with InferenceClient(pool, deadline_s=0.5, attempts=2, counts=guard.step) as client:
        with pytest.raises(GenerateFailed, match="deadline"):
            await client.generate("t", [1], Sampling(max_tokens=4))
    with pytest.raises(InferenceOutage, match="1 of 1 generate requests"):
        guard.check()


async def test_a_transient_error_on_the_only_server_is_retried_there_once_its_keeper_checked_it(pool_of) -> None:
    pool = pool_of(1)
    async with InferenceClient(pool, deadline_s=20.0, attempts=2) as client:
        generation = await client.generate("t", [999], Sampling(max_tokens=4))
    assert generation.attempts == 2 and client.counts.failures["fake-0"] == 1
    assert pool.servers[0].restarts == 0 and pool.servers[0].generation == 1  # answering: not restarted


async def test_a_request_the_server_refuses_is_the_callers_error_not_an_outage(pool_of) -> None:
    pool = pool_of(1)
    async with InferenceClient(pool, deadline_s=10.0, attempts=3) as client:
        with pytest.raises(GenerateRejected, match="prompt too long"):
            await client.generate("t", [1] * 1001, Sampling(max_tokens=4))
        assert sum(client.counts.failures.values()) == 0 and pool.servers[0].state is ServerState.READY


async def test_a_push_mid_request_pauses_loads_versions_and_resumes(pool_of, tmp_path: Path) -> None:
    pool = pool_of(1, token_delay=0.01)
    pusher = WeightPusher(pool, FileTransport(tmp_path, 10.0), control_deadline_s=10.0)
    async with InferenceClient(pool, deadline_s=30.0, attempts=1) as client:
        request = asyncio.create_task(client.generate("t", [1], Sampling(max_tokens=200)))
        await generating(client, pool, "t")  # mid-request: 200 tokens take at least 2 s
        report = await asyncio.to_thread(pusher.push, WeightSource.of_tensors({"w": torch.ones(2, 2)}), 1)
        generation = await request
    assert report.loaded == ["fake-0"] and not report.failed and report.total_s >= report.load_s
    switch = generation.versions.index(1)
    assert 0 < switch < 200 and set(generation.versions[:switch]) == {0} and set(generation.versions[switch:]) == {1}
    assert pool.current() == (1, next(tmp_path.glob("*v1.safetensors")))
    with pytest.raises(WeightLayoutError, match="shapes differ"):
        pusher.push(WeightSource.of_tensors({"w": torch.ones(3, 2)}), 2)  # refused before any server is paused
    assert pool.current()[0] == 1
    with pytest.raises(WeightsRefused, match="not the checkpoint's"):  # refused by the server's receiver
        pusher.push(WeightSource.of_tensors({"w": torch.ones(2, 2)}), 13)
    assert pool.current()[0] == 1 and not list(tmp_path.glob("*v13*"))  # nothing of it kept
    async with InferenceClient(pool, deadline_s=10.0, attempts=1) as client:  # resumed: it generates
        assert set((await client.generate("after", [1], Sampling(max_tokens=3))).versions) == {1}
    # a server that comes back (here: marked dead, as after a failed load) loads the current file before routing
    pool.servers[0].mark_dead("test")
    wait_for(lambda: pool.servers[0].generation == 2 and pool.servers[0].state is ServerState.READY)
    assert httpx.get(pool.servers[0].url + "/weight_info").json()["weight_version"] == "1"
    pusher.transport.close()
    assert not list(tmp_path.glob("*.safetensors"))


def test_weight_files_of_trainers_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale, live = (tmp_path / f"tapo-weights-{pid}-1-v3.safetensors" for pid in (gone.pid, os.getpid()))
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    FileTransport(tmp_path, 1.0)
    assert not stale.exists() and live.exists()


def test_an_external_server_is_waited_for_not_restarted(tmp_path: Path) -> None:
    process = fake("outside", tmp_path).start(30.0)
    pool = ServerPool.external([process.url], FAST, log=lambda m: None).start(30.0)
    try:
        process.stop()
        wait_for(lambda: pool.servers[0].state is ServerState.STARTING)
        process.start(30.0)  # started again elsewhere: the pool sees it and catches it up
        wait_for(lambda: pool.servers[0].state is ServerState.READY and pool.servers[0].generation == 2)
        assert pool.servers[0].restarts == 0
    finally:
        pool.close()
        process.stop()


def test_a_sigkilled_parent_leaves_no_server(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from pipeline.inference.pool import ServerPool, Supervision
        from tests.inference.test_servers import fake
        pool = ServerPool.of_processes([fake("orphan", Path({str(tmp_path)!r}))], Supervision(30.0, 0, 0.2, 3, 10.0, 10.0))
        pool.start(30.0)
        print(pool.keepers[0].process.process.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    group = int(parent.stdout.readline())
    assert group_alive(group)
    parent.kill()
    parent.wait()
    wait_for(lambda: not group_alive(group), timeout_s=20.0)
