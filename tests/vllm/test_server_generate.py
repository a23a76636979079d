"""The inference servers against vLLM's real CPU server (needs `.venv-vllm`): two servers, each pinned to one core,
started once for the module (a start takes 35-150 s on a loaded 2-core machine).

Token ids in and out exactly (the log-probs returned are the HF model's own for the returned ids at the sampling
temperature; greedy ids are the HF model's argmax), stop strings and stop tokens, sticky routing across the turns
of a trajectory (its server's prefix cache holds the earlier turns), a weight push mid-request (pause with mode
keep: the sequence goes on, its later tokens carry the new version), the NCCL routes' control plane that a CPU server
can run, a server killed mid-request (retried on the other one, restarted, caught up to the current weights), and no
process left after close."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
import torch.nn.functional as F

from pipeline.inference import control
from pipeline.inference.client import InferenceClient
from pipeline.inference.layout import WeightLayoutError
from pipeline.inference.pool import ServerPool, Supervision
from pipeline.inference.records import Generation, Sampling
from pipeline.inference.server import LaunchSpec, ServerState
from pipeline.inference.weights import FileTransport, WeightPusher, WeightSource
from pipeline.services.processes import free_port
from tests.helpers.tiny import tiny_tokenizer
from tests.vllm.tiny_vllm import load_tiny, tiny_model

pytestmark = pytest.mark.timeout(1200)

LOGPROB_ATOL = 2e-4  # measured: at most 1e-5 in float32 (6e-6 at T = 1, 1e-5 at T = 0.7)
PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [100, 3, 250, 17, 9], [7] * 12]


@pytest.fixture(scope="module")
def pool(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    logs = tmp_path_factory.mktemp("servers")
    specs = [LaunchSpec(f"vllm-{i}", tiny_dir, free_port(), logs, python=sys.executable,
                        cores=(i,), max_model_len=1024, kv_cache_gib=1, seed=i,
                        extra_args=("--weight-transfer-config", '{"backend": "nccl"}'))
             for i in range(2)]
    messages: list[str] = []
    pool = ServerPool.launched(specs, Supervision(start_timeout_s=600.0, max_restarts=2, interval_s=1.0,
                                                  unhealthy_polls=30), log=messages.append)
    pool.messages = messages
    started = time.perf_counter()
    pool.start()
    pool.start_s = time.perf_counter() - started
    yield pool
    pool.close()


def run(coro):
    return asyncio.run(coro)


async def generate_all(pool: ServerPool, requests: list[tuple[str, list[int], Sampling]]) -> list[Generation]:
    async with InferenceClient(pool, deadline_s=600.0, attempts=3) as client:
        return await asyncio.gather(*[client.generate(k, ids, s) for k, ids, s in requests])


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], sampled: tuple[int, ...], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + list(sampled)])
    logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    logp = F.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(sampled)[:, None])[:, 0]


def test_the_servers_are_pinned_and_caught_up(pool: ServerPool) -> None:
    print(f"\nstart of 2 pinned servers: {pool.start_s:.1f} s")
    for i, keeper in enumerate(pool.keepers):
        group = keeper.process.process.pid
        members = [int(p) for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]
        assert len(members) >= 3  # API server, engine core, worker
        assert all(os.sched_getaffinity(pid) == {i} for pid in members)
        assert control.weight_version(keeper.server.url, 10.0) == "0"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_ids_and_logprobs_are_the_models_own(pool: ServerPool, tiny_dir: Path, temperature: float) -> None:
    hf = load_tiny(tiny_dir)
    started = time.perf_counter()
    gens = run(generate_all(pool, [(f"t{i}", p, Sampling(max_tokens=64, temperature=temperature, seed=i,
                                                         ignore_eos=True)) for i, p in enumerate(PROMPTS * 4)]))
    print(f"\n16 sequences x 64 tokens at T={temperature}: {time.perf_counter() - started:.2f} s")
    worst = 0.0
    for prompt, g in zip(PROMPTS * 4, gens, strict=True):
        assert len(g.token_ids) == len(g.logprobs) == len(g.versions) == 64 and g.finish_reason == "length"
        diff = (torch.tensor(g.logprobs) - hf_logprobs(hf, prompt, g.token_ids, temperature)).abs().max()
        worst = max(worst, float(diff))
    print(f"largest |log-prob - HF's| at T={temperature}: {worst:.2e}")
    assert worst < LOGPROB_ATOL


def test_greedy_ids_are_the_models_argmax(pool: ServerPool, tiny_dir: Path) -> None:
    hf = load_tiny(tiny_dir)
    (g,) = run(generate_all(pool, [("g", PROMPTS[0], Sampling(max_tokens=20, temperature=0.0, ignore_eos=True))]))
    ids = list(PROMPTS[0])
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(g.token_ids) == ids[len(PROMPTS[0]):]


def test_stop_strings_and_stop_tokens_keep_the_sampled_ids(pool: ServerPool) -> None:
    tok = tiny_tokenizer()
    free = run(generate_all(pool, [("s", PROMPTS[2], Sampling(max_tokens=40, seed=3, ignore_eos=True))]))[0]
    text = tok.decode(list(free.token_ids))
    stop = text[len(text) // 2:len(text) // 2 + 2]  # two characters the unconstrained run writes mid-way
    cut, by_token = run(generate_all(pool, [
        ("s1", PROMPTS[2], Sampling(max_tokens=40, seed=3, ignore_eos=True, stop=(stop,))),
        ("s2", PROMPTS[2], Sampling(max_tokens=40, seed=3, ignore_eos=True, stop_token_ids=(free.token_ids[5],)))]))
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)]  # the same draws, cut after the stop's token
    assert stop in tok.decode(list(cut.token_ids)) and stop not in tok.decode(list(cut.token_ids[:-1]))
    first = free.token_ids.index(free.token_ids[5])
    assert by_token.token_ids == free.token_ids[:first + 1] and by_token.stop_reason == free.token_ids[5]


def test_a_trajectory_stays_on_its_server_across_turns(pool: ServerPool) -> None:
    # prompts longer than the CPU build's 128-token KV blocks, so a later turn finds the earlier ones cached
    prompts = {f"traj{i}": [10 + i] + list(range(20, 170)) for i in range(4)}

    async def three_turns() -> dict[str, list[Generation]]:
        turns: dict[str, list[Generation]] = {k: [] for k in prompts}
        context = dict(prompts)
        async with InferenceClient(pool, deadline_s=600.0, attempts=1) as client:
            for turn in range(3):
                gens = await asyncio.gather(*[client.generate(k, context[k], Sampling(max_tokens=8, seed=turn))
                                              for k in prompts])
                for k, g in zip(prompts, gens):
                    turns[k].append(g)
                    context[k] = context[k] + list(g.token_ids) + [300, 301, 302]  # a "tool output"
        return turns

    turns = run(three_turns())
    homes = {k: {g.server for g in gs} for k, gs in turns.items()}
    assert all(len(h) == 1 for h in homes.values())  # every turn on the first turn's server
    assert sorted(h.pop() for h in homes.values()) == ["vllm-0", "vllm-0", "vllm-1", "vllm-1"]  # new ones spread
    assert all(g.cached_prompt_tokens >= 128 for gs in turns.values() for g in gs[1:])


def test_a_push_mid_request_keeps_the_sequence_and_versions_its_tokens(pool: ServerPool, tiny_dir: Path,
                                                                      tmp_path: Path) -> None:
    pusher = WeightPusher(pool, FileTransport(Path("/dev/shm"), 600.0), control_deadline_s=120.0)
    new_model = tiny_model(len(tiny_tokenizer()), seed=1)

    async def push_mid_request() -> tuple[Generation, object]:
        async with InferenceClient(pool, deadline_s=600.0, attempts=1) as client:
            request = asyncio.create_task(client.generate("long", PROMPTS[0],
                                                          Sampling(max_tokens=LONG, seed=5, ignore_eos=True)))
            await _running_on_its_home(client, pool, "long")  # pushed mid-request, however fast the machine
            report = await asyncio.to_thread(pusher.push, WeightSource.of_module(new_model), 1)
            return await request, report

    generation, report = run(push_mid_request())
    print(f"\npush of the tiny model ({report.bytes / 2**20:.1f} MiB): {report.as_metrics()}")
    assert sorted(report.loaded) == ["vllm-0", "vllm-1"] and not report.failed
    assert len(generation.token_ids) == LONG and generation.finish_reason == "length"
    switch = generation.versions.index(1)
    assert 0 < switch < LONG and set(generation.versions[switch:]) == {1} and set(generation.versions[:switch]) == {0}
    # the tokens before the push are the old model's own
    old = hf_logprobs(load_tiny(tiny_dir), PROMPTS[0], generation.token_ids[:switch], 1.0)
    assert float((torch.tensor(generation.logprobs[:switch]) - old).abs().max()) < LOGPROB_ATOL
    # a new request samples from the new weights only
    (fresh,) = run(generate_all(pool, [("fresh", PROMPTS[1], Sampling(max_tokens=32, seed=1, ignore_eos=True))]))
    assert set(fresh.versions) == {1}
    new = hf_logprobs(new_model, PROMPTS[1], fresh.token_ids, 1.0)
    assert float((torch.tensor(fresh.logprobs) - new).abs().max()) < LOGPROB_ATOL
    # wrong shapes are refused before any server is paused; the servers keep version 1
    wrong = {n: (torch.zeros(3, 3) if n.endswith("norm.weight") else p) for n, p in new_model.named_parameters()}
    with pytest.raises(WeightLayoutError, match="shapes differ"):
        pusher.push(WeightSource.of_tensors(wrong), 2)
    assert {control.weight_version(s.url, 10.0) for s in pool.servers} == {"1"} and pool.current()[0] == 1
    pool.pusher = pusher  # the restart test catches a server up from its file


def test_the_nccl_routes_control_plane_runs_on_a_cpu_server(pool: ServerPool) -> None:
    """What a CPU server can run of the NCCL push (no NCCL group on a CPU): start and finish a weight update with no
    tensor; the finish sets the version, the weights stay as they were."""
    url = pool.servers[0].url
    sampling = Sampling(max_tokens=16, seed=9, ignore_eos=True)
    (before,) = run(generate_all(pool, [("n0", PROMPTS[3], sampling)]))
    control.pause(url, 60.0)
    control.call(url, "/start_weight_update", 60.0)
    control.call(url, "/finish_weight_update", 60.0, body={"weight_version": "1"})
    control.resume(url, 60.0)
    assert control.weight_version(url, 10.0) == "1" and control.world_size(url, 10.0) == 1
    (after,) = run(generate_all(pool, [("n0", PROMPTS[3], sampling)]))
    assert after.server == before.server and after.token_ids == before.token_ids
    assert max(abs(a - b) for a, b in zip(after.logprobs, before.logprobs)) < 1e-5


LONG = 1000  # tokens: the longest request the servers' max_model_len (1024) takes, so it is running when killed


async def _running_on_its_home(client: InferenceClient, pool: ServerPool, key: str) -> str:
    """The server `key`'s request went to, once that server says a request is running (its /metrics): waited for,
    not slept for, so a fast machine cannot finish the request before the test acts on it."""
    while key not in client.router.home:
        await asyncio.sleep(0.005)
    home = client.router.home[key]
    url = next(s.url for s in pool.servers if s.name == home)
    async with httpx.AsyncClient(timeout=30) as http:
        while True:
            metrics = (await http.get(url + "/metrics")).text
            running = [line for line in metrics.splitlines() if line.startswith("vllm:num_requests_running")]
            if any(float(line.rsplit(" ", 1)[1]) > 0 for line in running):
                return home
            await asyncio.sleep(0.01)


def test_a_server_killed_mid_request_is_retried_restarted_and_caught_up(pool: ServerPool) -> None:
    async def kill_mid_request() -> tuple[Generation, str]:
        async with InferenceClient(pool, deadline_s=600.0, attempts=3) as client:
            request = asyncio.create_task(client.generate("victim", PROMPTS[1],
                                                          Sampling(max_tokens=LONG, seed=2, ignore_eos=True)))
            home = await _running_on_its_home(client, pool, "victim")  # killed mid-request, however fast the machine
            keeper = next(k for k in pool.keepers if k.server.name == home)
            pool.segments = keeper.process.shared_memory
            os.killpg(keeper.process.process.pid, signal.SIGKILL)
            generation = await request
            assert client.counts.failures[home] == 1 and client.counts.failed_requests == 0
            return generation, home

    generation, home = run(kill_mid_request())
    assert generation.server != home and generation.attempts == 2 and len(generation.token_ids) == LONG
    victim = next(s for s in pool.servers if s.name == home)
    end = time.monotonic() + 900
    while not (victim.state is ServerState.READY and victim.generation == 2):
        assert time.monotonic() < end and victim.state is not ServerState.FAILED, victim
        time.sleep(1.0)
    assert victim.restarts == 1 and any(f"{home} " in m and "restarting it (1 of 2)" in m for m in pool.messages)
    assert control.weight_version(victim.url, 10.0) == "1"  # it loaded the current file before it was routed to
    assert pool.segments and not any(Path(p).exists() for p in pool.segments)  # vLLM's shared memory not left
    other = next(s for s in pool.servers if s.name != home)
    sampling = Sampling(max_tokens=32, seed=4, ignore_eos=True)
    with httpx.Client(timeout=120) as http:  # the restarted server holds the same weights as the other one
        answers = [http.post(s.url + "/inference/v1/generate", json=sampling.body(PROMPTS[2], f"r{i}")).json()
                   for i, s in enumerate((victim, other))]
    assert answers[0]["choices"][0]["token_ids"] == answers[1]["choices"][0]["token_ids"]
    pool.pusher.transport.close()


def test_close_leaves_no_server_process(pool: ServerPool) -> None:
    groups = [k.process.process.pid for k in pool.keepers]
    pool.close()
    for group in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
    assert not list(Path("/dev/shm").glob(f"tapo-weights-{os.getpid()}-*"))
