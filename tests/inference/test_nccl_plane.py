"""The NCCL weight push's control plane without CUDA: against stand-in servers that block in the "NCCL" routes as
vLLM's workers do (init until the trainer joins the group, update until its broadcast has arrived), with the data
plane replaced by a recorder. A transport that waited for a blocking route before taking its own part would leave
the stand-in to answer 500 after its wait, and these tests fail (no hang)."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import pytest
import torch

from pipeline.inference.nccl import NCCLTransport
from pipeline.inference.pool import ServerPool
from pipeline.inference.server import ServerState
from pipeline.inference.weights import WeightPusher, WeightSource
from tests.inference.test_servers import FAST, fake, wait_for

UID = bytes(range(128))


class Recorder:
    """The sender's end: records the group it was asked to make and what it broadcast; tells the stand-in workers
    they joined / received (what NCCL would do)."""

    def __init__(self, urls: list[str], tensors: int) -> None:
        self.urls, self.tensors = urls, tensors
        self.groups: list[int] = []
        self.sent: list[tuple[int, ...]] = []
        self.warmed = 0

    def rendezvous(self, uid: bytes, world: int) -> Recorder:
        assert uid == UID
        self.groups.append(world)
        self._tell("/_joined")
        return self

    def warm_up(self) -> None:
        self.warmed += 1

    def broadcast(self, tensor: torch.Tensor) -> None:
        self.sent.append(tuple(tensor.shape))
        if len(self.sent) % self.tensors == 0:
            self._tell("/_received")

    def _tell(self, route: str) -> None:
        for url in self.urls:
            httpx.post(url + route, json={})


def calls(url: str) -> list[str]:
    return [route for route, _ in httpx.get(url + "/_calls").json() if not route.startswith("/_")]


@pytest.fixture
def pool(tmp_path: Path):
    pool = ServerPool.of_processes([fake("gpu-0", tmp_path, world_size=2), fake("gpu-1", tmp_path)], FAST,
                                   log=lambda m: None)
    pool.transport = "nccl"
    yield pool.start(60.0)
    pool.close()


def test_a_push_makes_the_group_once_and_runs_vllms_sequence(pool: ServerPool) -> None:
    source = WeightSource.of_tensors({"w": torch.ones(2, 2), "b": torch.zeros(3)})
    recorder = Recorder([s.url for s in pool.servers], tensors=2)
    transport = NCCLTransport(20.0, device=torch.device("cpu"), rendezvous=recorder.rendezvous, unique_id=lambda: UID)
    pusher = WeightPusher(pool, transport, control_deadline_s=20.0)
    pusher._layout = {"w": ((2, 2), "F32"), "b": ((3,), "F32")}
    for version in (1, 2):
        report = pusher.push(source, version)
        assert not report.failed and sorted(report.loaded) == ["gpu-0", "gpu-1"]
    assert recorder.groups == [4] and recorder.warmed == 1  # trainer + 2 + 1 workers, made once
    assert recorder.sent == [(2, 2), (3,)] * 2
    push = ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update", "/update_weight_version",
            "/resume"]
    for server in pool.servers:
        seen = calls(server.url)
        first = seen.index("/pause")
        assert seen[first:] == [push[0], "/init_weight_transfer_engine", *push[1:], *push]
        assert httpx.get(server.url + "/weight_info").json()["weight_version"] == "2"
    inits = [body["init_info"] for s in pool.servers for route, body in httpx.get(s.url + "/_calls").json()
             if route == "/init_weight_transfer_engine"]
    assert [(i["rank_offset"], i["world_size"]) for i in inits] == [(1, 4), (3, 4)]
    assert base64.b64decode(inits[0]["nccl_unique_id_b64"]) == UID
    update = next(body for route, body in httpx.get(pool.servers[0].url + "/_calls").json() if route == "/update_weights")
    assert update["update_info"] == {"names": ["w", "b"], "dtype_names": ["float32", "float32"],
                                     "shapes": [[2, 2], [3]]}


def test_a_restarted_server_waits_unrouted_and_the_next_push_makes_a_new_group(pool: ServerPool) -> None:
    source = WeightSource.of_tensors({"w": torch.ones(2, 2)})
    recorder = Recorder([s.url for s in pool.servers], tensors=1)
    pusher = WeightPusher(pool, NCCLTransport(20.0, device=torch.device("cpu"), rendezvous=recorder.rendezvous,
                                              unique_id=lambda: UID), control_deadline_s=20.0)
    pusher._layout = {"w": ((2, 2), "F32")}
    pusher.push(source, 1)
    pool.loaded(1, None)
    victim = pool.servers[1]
    victim.mark_dead("test")
    wait_for(lambda: victim.generation == 2 and victim.state is ServerState.STALE)
    assert victim not in pool.ready() and victim.version == 0  # the checkpoint's weights: not routed to
    assert not pusher.push(source, 2).failed
    assert victim.state is ServerState.READY and victim.version == 2
    assert recorder.groups == [4, 4]  # a new member: the group was made again
