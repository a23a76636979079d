"""GPU servers: weights through vLLM's NCCL weight transfer, driven over HTTP by a trainer that never imports vLLM.

The trainer's sender (its rank 0) and every worker of every server form one NCCL group: the sender is rank 0, a
server's workers follow at its `rank_offset` (1 + the workers of the servers before it). The group is made with
vLLM's unique-id rendezvous (`nccl_unique_id_b64`; vLLM's `docs/training/weight_transfer/nccl.md`, "Trainer Without
vLLM over HTTP", and `examples/rl/rlhf_http_nccl_no_vllm.py`): the sender mints the id (`torch.cuda.nccl`), posts
`/init_weight_transfer_engine` to every server (they block in `ncclCommInitRank`), joins as rank 0, and answers the
one-element float32 all-reduce every vLLM worker issues right after joining. A push is then, on every paused server:
`/start_weight_update`, `/update_weights` with the names, dtypes and shapes (it blocks while the workers receive),
concurrent with one broadcast per tensor from the sender in that order, then `/finish_weight_update`. The group is
made again when the set of servers changes (a restarted server is a new member: the old group cannot take it).

Under ZeRO-3 the tensors come from the source's iterator, gathered chunk by chunk on every rank
(`pipeline.distributed.weight_sync.full_named_parameters`); ranks other than the sender only drain the same iterator
(`drain`), in lock-step, so every gather's collective completes.

Not bounded yet: NCCL calls have no deadline, so a server that dies while the group is being made or during a
broadcast leaves the sender blocked in `ncclCommInitRank` or the broadcast (the HTTP side of every call is bounded).
The GPU integration should run the data plane under a watchdog (or NCCL's own timeouts) that ends the stage.

This path has not run here (no GPU on the machines that built it); `gpu_check` is the check to run on the first
lent GPU, from `benchmarks/gpu_check.py`. What runs without CUDA is tested: the control-plane sequence against
stand-in servers with the data plane replaced (tests/inference/test_nccl_plane.py), and the start/finish routes
against a real CPU server (tests/vllm/test_server_generate.py).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import torch

from pipeline.inference import control
from pipeline.inference.layout import Layout, check_layout
from pipeline.inference.server import Server
from pipeline.inference.weights import WeightSource, on_all


class Communicator(Protocol):
    """The sender's end of the NCCL group (rank 0)."""

    def warm_up(self) -> None: ...

    def broadcast(self, tensor: torch.Tensor) -> None: ...


class TorchNccl:
    """The sender's end through `torch.cuda.nccl` (no vLLM, no torch.distributed group of the trainer's)."""

    def __init__(self, unique_id: bytes, world_size: int, device: torch.device) -> None:
        self.device = device
        with torch.cuda.device(device):
            self.comm = torch.cuda.nccl.init_rank(world_size, unique_id, 0)

    @staticmethod
    def unique_id() -> bytes:
        return torch.cuda.nccl.unique_id()

    def warm_up(self) -> None:
        # every vLLM worker all-reduces one float32 element right after joining; any other first call deadlocks
        torch.cuda.nccl.all_reduce([torch.zeros(1, dtype=torch.float32, device=self.device)], comms=[self.comm])

    def broadcast(self, tensor: torch.Tensor) -> None:
        torch.cuda.nccl.broadcast([tensor.to(self.device).contiguous()], root=0, comms=[self.comm])


Rendezvous = Callable[[bytes, int], Communicator]  # (unique id, world size) -> the sender's communicator


class NCCLTransport:
    """A `pipeline.inference.weights.Transport` for GPU servers started with `--weight-transfer-config
    '{"backend": "nccl"}'` (`LaunchSpec.nccl`)."""

    def __init__(self, deadline_s: float, *, device: torch.device | None = None,
                 rendezvous: Rendezvous | None = None, unique_id: Callable[[], bytes] | None = None) -> None:
        self.deadline_s = deadline_s
        device = device or torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        self.rendezvous = rendezvous or (lambda uid, world: TorchNccl(uid, world, device))
        self.unique_id = unique_id or TorchNccl.unique_id
        self.members: tuple[tuple[str, int], ...] = ()
        self.communicator: Communicator | None = None

    def prepare(self, source: WeightSource, version: int, layout: Layout) -> None:
        check_layout(layout, source.shapes)  # nothing to write: the tensors travel during the load

    def load(self, servers: list[Server], source: WeightSource, version: int, prepared: Path | None) -> dict[str, str]:
        failed = self._join(servers)
        servers = [s for s in servers if s.name not in failed]
        failed |= on_all(servers, lambda s: control.call(s.url, "/start_weight_update", self.deadline_s))
        servers = [s for s in servers if s.name not in failed]
        names = list(source.shapes)
        info = {"names": names, "dtype_names": [str(source.dtypes[n]).removeprefix("torch.") for n in names],
                "shapes": [list(source.shapes[n]) for n in names]}
        with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
            # the workers block in /update_weights until the last tensor has arrived
            updates = {s.name: pool.submit(control.call, s.url, "/update_weights", self.deadline_s,
                                           body={"update_info": info}) for s in servers}
            self._broadcast(source, names)
        for name, future in updates.items():
            if future.exception() is not None:
                failed[name] = f"{type(future.exception()).__name__}: {future.exception()}"
        servers = [s for s in servers if s.name not in failed]
        failed |= on_all(servers, lambda s: control.call(s.url, "/finish_weight_update", self.deadline_s))
        if failed:
            self.members = ()  # a member that failed mid-transfer leaves the group unusable: make it again next time
        return failed

    def finish(self, prepared: Path | None) -> None:
        pass

    def discard(self, prepared: Path | None) -> None:
        pass

    def _broadcast(self, source: WeightSource, names: list[str]) -> None:
        communicator = self.communicator
        assert communicator is not None  # `_join` made it (or raised)
        sent = 0
        for name, tensor in source.tensors():
            if sent >= len(names) or name != names[sent] or tuple(tensor.shape) != source.shapes[name]:
                raise ValueError(f"the source yielded {name!r} {tuple(tensor.shape)} where the servers expect "
                                 f"{names[sent] if sent < len(names) else 'nothing more'}: the transfer is broken")
            communicator.broadcast(tensor)
            sent += 1
        if sent != len(names):
            raise ValueError(f"the source yielded {sent} of {len(names)} tensors; the servers wait for the rest")

    def _join(self, servers: list[Server]) -> dict[str, str]:
        """Make the group anew when its members changed; per server, why it could not join."""
        members = tuple((s.name, s.generation) for s in servers)
        if members == self.members and self.communicator is not None:
            return {}
        sizes = [control.world_size(s.url, self.deadline_s) for s in servers]
        world, uid = 1 + sum(sizes), self.unique_id()
        offsets = [1 + sum(sizes[:i]) for i in range(len(servers))]
        payload = [{"nccl_unique_id_b64": base64.b64encode(uid).decode(), "rank_offset": off, "world_size": world}
                   for off in offsets]
        with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
            joins = {s.name: pool.submit(control.call, s.url, "/init_weight_transfer_engine", self.deadline_s,
                                         body={"init_info": p}) for s, p in zip(servers, payload)}
            self.communicator = self.rendezvous(uid, world)  # blocks until every worker has joined
            self.communicator.warm_up()
        failed = {n: f"{type(f.exception()).__name__}: {f.exception()}" for n, f in joins.items() if f.exception()}
        self.members = () if failed else members
        return failed


def drain(source: WeightSource) -> None:
    """A non-sender rank's part in a push under ZeRO-3: the same gathers, in the same order, nothing sent."""
    for _ in source.tensors():
        pass


def gpu_check(model_dir: Path, *, server_gpus: tuple[int, ...], trainer_gpu: int, log_dir: Path,
              python: str = ".venv-vllm/bin/python", tokens: int = 64, sequences: int = 16) -> dict[str, float]:
    """The first check to run on GPUs (benchmarks/gpu_check.py): a server on `server_gpus`, the trainer on
    `trainer_gpu` (not among them); generate, push perturbed weights over NCCL, generate again (the log-probs move,
    the versions say 1), push the originals back (the same seeds sample the same tokens with the first log-probs,
    version 2). Timings and the three checks as a dict."""
    import asyncio
    import time

    from transformers import AutoModelForCausalLM

    from pipeline.inference.client import InferenceClient
    from pipeline.inference.pool import ServerPool, Supervision
    from pipeline.inference.records import Sampling
    from pipeline.inference.server import LaunchSpec
    from pipeline.inference.weights import WeightPusher
    from pipeline.services.processes import free_port

    if trainer_gpu in server_gpus:
        raise ValueError("the trainer's GPU must not be one of the server's")
    device = torch.device("cuda", trainer_gpu)
    # transformers' typed wrapper of Module.to names the model where the device goes
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device)  # type: ignore[arg-type]
    spec = LaunchSpec("gpu-check", Path(model_dir), free_port(), log_dir, python=python, gpus=server_gpus, nccl=True,
                      max_model_len=1024)
    started = time.perf_counter()
    with ServerPool.launched([spec], Supervision(start_timeout_s=900, max_restarts=0)) as pool:
        pool.start()
        report = {"start_s": time.perf_counter() - started}
        pusher = WeightPusher(pool, NCCLTransport(600.0, device=device), control_deadline_s=120.0)

        async def sample(key: str) -> list:
            async with InferenceClient(pool, deadline_s=600.0, attempts=1) as client:
                return await asyncio.gather(*[client.generate(f"{key}{i}", [1, 2, 3, 4 + i],
                                                              Sampling(tokens, seed=i, ignore_eos=True))
                                              for i in range(sequences)])

        t = time.perf_counter()
        before = asyncio.run(sample("a"))
        report["generate_s"] = time.perf_counter() - t
        originals = {n: p.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        report["push_s"] = pusher.push(WeightSource.of_module(model), 1).total_s
        moved = asyncio.run(sample("b"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(originals[n])
        report["push_back_s"] = pusher.push(WeightSource.of_module(model), 2).total_s
        restored = asyncio.run(sample("c"))
    report["versions_ok"] = float(all(set(g.versions) == {1} for g in moved) and
                                  all(set(g.versions) == {2} for g in restored))
    report["logprobs_moved"] = float(max(abs(a - b) for x, y in zip(before, moved) for a, b in zip(x.logprobs, y.logprobs)))
    report["logprobs_restored"] = float(max(abs(a - b) for x, y in zip(before, restored)
                                            for a, b in zip(x.logprobs, y.logprobs)))
    return report


__all__ = ["Communicator", "NCCLTransport", "TorchNccl", "drain", "gpu_check"]
