"""A training run's own folder, `<train.checkpoints.dir>/<run>/`: its checkpoints and the config they were
written under.

Checkpoints belong to one run. Runs of different configs never share a folder (the default name is a digest
of the config, `cfg-<sha256[:10]>`; the train flow names a DVC experiment's run after the experiment), so
the retention of the last checkpoints counts only this run's, and `--resume` can only continue this run:
a folder whose recorded config differs from the one resuming is refused with the differing keys named
(`ConfigMismatch`). A fresh run takes its folder over: checkpoints an earlier attempt left there are removed
(and named) before the first step, so steps of two attempts never mix. Whether a run resumes or starts afresh
is decided once, before anything loads, by `pipeline.training_run.plan` (`train.checkpoints.resume`, `--resume`).

What identifies a run is what it computes: every key of the sections training reads, except those that only
say where things go or how fast they run (`NOT_IDENTITY`), which may change between a run and its resume.
The rank count stays in (`distributed.nproc_per_node`, `nnodes`): DeepSpeed's checkpoints hold one shard a rank;
what starts the ranks and where they meet (`launcher`, `master_addr`) does not. `nproc_per_node: auto` is
recorded as the count it resolved to (`ranks_per_node`), so a resume of an 8-GPU run on a 4-GPU machine is
refused by name instead of reading 8 shards into 4 ranks; with a hostfile the count is each node's slots, which
the hostfile itself says, and `auto` stays as written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.config import RunConfig
from pipeline.config.distributed import DistributedConfig
from pipeline.model import visible_gpus
from pipeline.outputs import write_durably, write_json_durably

RUN_CONFIG = "run_config.json"
CHECKPOINTS = "checkpoints"
HISTORY = "history.jsonl"  # the run's own copy of its per-step metrics (pipeline.tracking.history)
INPUTS = "run_inputs.json"  # what the checkpoints were trained on besides the config (pipeline.training_run.inputs)
FINISHED = "finished.json"  # written once the run's final model is saved and registered
ATTEMPT_FILES = (HISTORY, INPUTS, FINISHED)  # an attempt's own records: a fresh run removes them with its checkpoints
SECTIONS = ("run", "model", "sandbox", "search", "rollout", "reward", "train", "distributed")
# Where things go, how fast they run, how much is logged: a resume may change these.
NOT_IDENTITY = (
    "run.experiment", "run.tracking_uri", "run.torch_threads", "run.deterministic",
    "model.path", "model.base_dir", "model.device",
    "sandbox.url", "sandbox.port", "sandbox.workers", "sandbox.queue_size", "sandbox.concurrency",
    "sandbox.retries", "sandbox.recover_s",
    "search.url", "search.port", "search.redis_url", "search.index_dir", "search.corpus_path", "search.cache_ttl_s",
    "search.provider_timeout_s", "search.provider_retries", "search.recover_s", "search.serper_url",
    "search.serper_api_key_env", "search.serper_rate_per_s",
    "rollout.tool_concurrency", "rollout.vllm.placement", "rollout.vllm.devices", "rollout.vllm.gpu_memory_utilization",
    "rollout.vllm.enable_sleep_mode", "rollout.vllm.push_chunk_mib",
    "reward.symbolic_workers", "reward.cache_size",
    "train.checkpoints.", "train.output_dir", "train.sample_tables.",
    "distributed.launcher", "distributed.master_addr", "distributed.python",
    "distributed.offload_optimizer", "distributed.offload_params", "distributed.collectives",
    "distributed.overlap_comm", "distributed.reduce_bucket_size", "distributed.torch_extensions_dir",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_LISTED = 20


class ConfigMismatch(ValueError):
    """`--resume` found checkpoints written under another config (the differing keys are named)."""


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def ranks_per_node(distributed: DistributedConfig) -> int | str:
    """`distributed.nproc_per_node` as this process sees it run: inside a rank, the count its launcher started
    (torchrun's LOCAL_WORLD_SIZE, DeepSpeed's LOCAL_SIZE); outside, what `auto` resolves to on this machine.
    The two agree, so the stage and its ranks name the same run folder."""
    configured = distributed.nproc_per_node
    if not distributed.enabled or configured != "auto" or distributed.hostfile:
        return configured  # one process, a count written out, or each hostfile node's slots
    launched = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE")
    return int(launched) if launched else distributed.ranks_per_node(visible_gpus()) or 1


def training_identity(cfg: RunConfig) -> dict[str, Any]:
    """{dotted key: value} of every setting that changes what the run computes (JSON values)."""
    dumped = cfg.model_dump(mode="json")
    flat = _flat({section: dumped[section] for section in SECTIONS}) | {
        "distributed.nproc_per_node": ranks_per_node(cfg.distributed)}
    return {k: v for k, v in sorted(flat.items()) if not k.startswith(NOT_IDENTITY)}


def config_name(identity: Mapping[str, Any]) -> str:
    """`cfg-<first 10 hex digits of the identity's sha256>`: the same config, the same folder."""
    blob = json.dumps(dict(identity), sort_keys=True, separators=(",", ":")).encode()
    return f"cfg-{hashlib.sha256(blob).hexdigest()[:10]}"


def safe_name(name: str) -> str:
    """A run name as one path component (a DVC experiment or a label may hold anything)."""
    cleaned = _UNSAFE.sub("-", name).strip("-.")
    if not cleaned:
        raise ValueError(f"run name {name!r} has no character usable in a folder name")
    return cleaned


def run_folder(cfg: RunConfig, name: str | None = None) -> Path:
    """`<train.checkpoints.dir>/<name>`; without a name, the config's (`config_name`)."""
    return Path(cfg.train.checkpoints.dir) / safe_name(name or config_name(training_identity(cfg)))


def recorded_identity(folder: Path) -> dict[str, Any] | None:
    path = folder / RUN_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise ConfigMismatch(f"{path}: not the JSON a run writes ({err}); the config its checkpoints were written "
                             "under is unknown") from None


def differences(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """`key: <recorded> in the checkpoints, <current> now` for each key whose value differs (or one side lacks)."""
    missing = object()
    lines = []
    for key in sorted(set(recorded) | set(current)):
        old, new = recorded.get(key, missing), current.get(key, missing)
        if old != new:
            show = lambda v: "(absent)" if v is missing else json.dumps(v)  # noqa: E731
            lines.append(f"{key}: {show(old)} in the checkpoints, {show(new)} now")
    return lines


def saved_checkpoints(folder: Path) -> list[Path]:
    """Everything under the folder's checkpoints/ (complete, torn, DeepSpeed's `latest` marker)."""
    root = folder / CHECKPOINTS
    return sorted(root.iterdir()) if root.is_dir() else []


def check_resumable(folder: Path, identity: Mapping[str, Any]) -> None:
    """Raise `ConfigMismatch` unless the folder's checkpoints were written under `identity` (or it has none)."""
    if not saved_checkpoints(folder):
        return
    recorded = recorded_identity(folder)
    if recorded is None:
        raise ConfigMismatch(f"--resume: {folder / CHECKPOINTS} has no {RUN_CONFIG}: the config its checkpoints "
                             "were written under is unknown, so they are not resumed. Train afresh (without "
                             "--resume), or move them into the folder of the run that wrote them")
    diff = differences(recorded, identity)
    if diff:
        shown = diff[:MAX_LISTED] + ([f"... and {len(diff) - MAX_LISTED} more"] if len(diff) > MAX_LISTED else [])
        raise ConfigMismatch(f"--resume: the checkpoints in {folder / CHECKPOINTS} were written under another "
                             f"config ({folder / RUN_CONFIG}); {len(diff)} key(s) differ: " + "; ".join(shown)
                             + ". Resume with the params they were written with, or train afresh without --resume")


def take(folder: Path, identity: Mapping[str, Any], *, resume: bool) -> None:
    """Make `folder` this run's (the main process, before the first step; a resume has passed
    `check_resumable`): a fresh run removes the checkpoints an earlier attempt left (naming them) and that
    attempt's records (`ATTEMPT_FILES`); the config is recorded beside the checkpoints."""
    stale = [] if resume else saved_checkpoints(folder)
    if stale:
        print(f"train: a fresh run in {folder} removes the checkpoints an earlier attempt left: "
              f"{', '.join(p.name for p in stale)}", file=sys.stderr, flush=True)
        shutil.rmtree(folder / CHECKPOINTS)
    folder.mkdir(parents=True, exist_ok=True)
    for name in () if resume else ATTEMPT_FILES:
        (folder / name).unlink(missing_ok=True)
    write_durably(folder / RUN_CONFIG, json.dumps(dict(identity), indent=2, sort_keys=True) + "\n")


def mark_finished(folder: Path, step: int) -> None:
    """Once the run's final model is saved and registered: `train.checkpoints.resume: auto` trains it again, never resumes it."""
    write_json_durably(folder / FINISHED, {"step": step})
