"""DeepSpeed checkpoints with exact resume, and Hugging Face export from ZeRO shards.

Layout (same as single-process runs): `<root>/checkpoints/step-NNNNNN/`, written by
`engine.save_checkpoint` (model and optimiser shards of every rank), plus one RNG file per
rank and the model's config and tokenizer (so the directory exports on its own). DeepSpeed writes into the
step's directory in place (not beside it), so completeness is the manifest's: once every rank has fsynced the
files it sees, rank 0 writes the trainer state as `state.json` (as a single-process checkpoint holds it) and then
the manifest (`pipeline.training_run.manifest`: each file's size and SHA-256) last, and fsyncs the folder. A step
directory without a manifest is torn, whatever DeepSpeed's `latest` marker says: a resume loads the newest
complete step, which the stage has verified and chosen before it launched the ranks (its plan,
`pipeline.training_run.plan`, names it on every rank's command line; every newer one is set aside), and each rank
checks its manifest, sizes and headers again before loading (`load`). The manifest lists the files rank 0 sees:
on nodes without a shared file system, the other nodes' shards are not in it.

Exports: `export_hf` gathers ZeRO-3 shards parameter by parameter (one full tensor at a
time, not the whole model) inside a running job; `export_from_checkpoint` rebuilds the fp32
weights from the shards on disk, offline, in one process
(`python -m pipeline.export CHECKPOINTS OUT`).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
import torch.distributed as dist

from pipeline.outputs import fsync_path, fsync_tree, write_durably
from pipeline.training_run.checkpoint import TrainerState, prune
from pipeline.training_run.manifest import problem, write_manifest

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel


class DeepSpeedRank(Protocol):
    """What these functions use of a rank (`pipeline.distributed.replicas.DeepSpeedRank`)."""

    model: DeepSpeedEngine

    @property
    def module(self) -> PreTrainedModel: ...
    @property
    def rank(self) -> int: ...
    @property
    def zero_stage(self) -> int: ...
    def barrier(self) -> None: ...

LATEST = "latest"


def step_tag(step: int) -> str:
    return f"step-{step:06d}"


def _rng_file(path: Path, rank: int) -> Path:
    return path / f"rng_rank{rank:03d}.pt"


def save(replicas: DeepSpeedRank, root: Path, state: TrainerState,
         scheduler: torch.optim.lr_scheduler.LRScheduler, tokenizer=None) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory."""
    save_dir, tag = root / "checkpoints", step_tag(state.step)
    path = save_dir / tag
    if replicas.rank == 0:  # what a killed attempt left under this step's name: no file of it may join this one
        shutil.rmtree(path, ignore_errors=True)
    replicas.barrier()
    path.mkdir(parents=True, exist_ok=True)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(rng, _rng_file(path, replicas.rank))
    if replicas.rank == 0:
        replicas.module.config.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    replicas.barrier()
    client = {"trainer_state": asdict(state), "scheduler": scheduler.state_dict()}
    replicas.model.save_checkpoint(str(save_dir), tag=tag, client_state=client)
    fsync_tree(path)  # every rank: its node's files on its disk before the manifest vouches for them
    replicas.barrier()
    if replicas.rank == 0:
        write_durably(path / "state.json", json.dumps(asdict(state), indent=2) + "\n")
        write_manifest(path)  # last: the step is complete (pipeline.training_run.checkpoint.is_complete)
        fsync_path(save_dir)
        prune(save_dir, state.step)
    replicas.barrier()
    return path


def is_deepspeed_checkpoint(path: Path) -> bool:
    """A step directory `save` wrote (rank 0's RNG file is its own; a single-process checkpoint has none)."""
    return _rng_file(path, 0).is_file()


def load(replicas: DeepSpeedRank, path: Path, scheduler: torch.optim.lr_scheduler.LRScheduler) -> TrainerState:
    """Collective: restore the step directory `path`, the one the run's plan chose (DeepSpeed's `latest` may name a
    torn or set-aside one, so it is not asked)."""
    damaged = problem(path, digests=False)  # the stage hashed it; each rank still refuses what changed since
    if damaged is not None:
        raise ValueError(f"{path}: {damaged}")
    save_dir, tag = path.parent, path.name
    loaded, client = replicas.model.load_checkpoint(str(save_dir), tag=tag, load_lr_scheduler_states=False)
    if loaded is None:
        raise FileNotFoundError(f"{save_dir / tag}: DeepSpeed could not load this checkpoint")
    scheduler.load_state_dict(client["scheduler"])
    rng_path = _rng_file(save_dir / tag, replicas.rank)
    if not rng_path.is_file():  # resumed on more ranks than saved: reuse rank 0's streams
        rng_path = _rng_file(save_dir / tag, 0)
    rng = torch.load(rng_path, weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return TrainerState(**client["trainer_state"])


def _full_parameters(replicas: DeepSpeedRank) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) per parameter; under ZeRO-3 each is gathered just for its turn."""
    module = replicas.module
    if replicas.zero_stage != 3:
        yield from module.named_parameters()
        return
    import deepspeed

    for name, p in module.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            yield name, p


def for_each_full_parameter(replicas: DeepSpeedRank, fn: Callable[[str, torch.Tensor], object]) -> None:
    """Collective under ZeRO-3: call `fn(name, full_tensor)` on every rank, one parameter at a time."""
    with torch.no_grad():
        for name, tensor in _full_parameters(replicas):
            fn(name, tensor)


def copy_weights_into(replicas: DeepSpeedRank, target: torch.nn.Module) -> None:
    """Push the trained weights into a plain copy of the model (the ZeRO-3 rollout model)."""
    params = dict(target.named_parameters())
    for_each_full_parameter(replicas, lambda name, t: params[name].copy_(t.to(params[name].dtype)))


def export_hf(replicas: DeepSpeedRank, tokenizer, out: Path) -> None:
    """Collective: write a plain Hugging Face directory on rank 0 (safetensors, tokenizer)."""
    state: dict[str, torch.Tensor] = {}
    keep = replicas.rank == 0

    def collect(name: str, t: torch.Tensor) -> None:
        if keep:
            state[name] = t.detach().to("cpu", copy=True)

    for_each_full_parameter(replicas, collect)
    if keep:
        persistent = replicas.module.state_dict().keys()
        state |= {n: b.detach().cpu() for n, b in replicas.module.named_buffers() if n in persistent}
        out.mkdir(parents=True, exist_ok=True)
        replicas.module.save_pretrained(out, state_dict=state, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(out)
    if dist.is_initialized():
        dist.barrier()


def export_from_checkpoint(checkpoints: Path, out: Path, tag: str | None = None) -> Path:
    """Offline: merge the ZeRO shards of `checkpoints/<tag>` (default: latest) into an HF directory."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tag = tag or (checkpoints / LATEST).read_text().strip()
    path = checkpoints / tag
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json (not a checkpoint written by pipeline.distributed)")
    state = get_fp32_state_dict_from_zero_checkpoint(str(checkpoints), tag=tag)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if unexpected or set(missing) - tied:
        raise ValueError(f"{path}: shards do not match the config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    if (path / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return out
