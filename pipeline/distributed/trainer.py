"""The data-parallel branches of `pipeline.train`: set-up, update step, checkpoint, export.

`pipeline.train` calls these when `distributed.enabled`; its loop (`run`) is unchanged.
Every rank runs the same loop on the same inputs: rollouts are sampled per rank and
all-gathered (`ShardedRolloutEngine`), so scoring and dynamic sampling agree everywhere;
then each rank trains on its own whole groups and DeepSpeed reduces the gradients.

Under ZeRO-3 the trained parameters are shards, and generation with them would need a
collective per decoded token in lock-step across ranks (ranks decode different lengths),
so the `hf` rollout backend samples from a full copy that is refreshed (gathered one
parameter at a time) after every training step. Under ZeRO-0/2 the parameters are whole
on every rank and the rollout engine samples from them directly.

With the `vllm` backend each rank's engine holds its own copy of the weights (no extra copy
here): after every training step, and after a resume, the trained weights are pushed into it
(`weight_sync.push_weights`: gathered from ZeRO-3 shards chunk by chunk, or the whole
parameters under ZeRO-0/2).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from pipeline.rl.advantage import GroupFilter, token_advantages
from pipeline.trainer.batching import make_train_batch, mini_batch_groups
from pipeline.trainer.checkpoint import TrainerState
from pipeline.config import RunConfig
from pipeline.distributed import checkpointing, weight_sync
from pipeline.distributed.backend import DeepSpeedBackend, make_deepspeed_backend
from pipeline.distributed.sharding import ShardedRolloutEngine, assign_groups
from pipeline.rl.loss import make_policy_loss
from pipeline.model import AUTOCAST, model_device
from pipeline.sampling.problem_stream import problem_stream
from pipeline.session import Placement, Trainer
from pipeline.rl.tepo import Tepo
from pipeline.trainer.reference import make_reference
from pipeline.trainer.weights import PolicyWeights
from pipeline.types import Collected, ScoredGroup, TrainBatch
from pipeline.trainer.update import (UpdateSettings, apply_policy_gradient, mean_over_updates, micro_batches, padded_cat,
                             token_logprobs_and_entropy)


def set_up_data_parallel(cfg: RunConfig, model: torch.nn.Module, tokenizer, optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LRScheduler, problems: list, tools: dict, resume: bool,
                         placement: Placement, *, weights: PolicyWeights, tepo: Tepo,
                         collect_groups: Callable[[Trainer], Collected], informative: GroupFilter) -> Trainer:
    """`pipeline.train.set_up` for data parallelism: a `Trainer` whose model is the DeepSpeed engine (the
    variants are the ones `set_up` resolved)."""
    vllm = cfg.rollout.backend == "vllm"  # the engine keeps its own weights: no copy needed here
    rollout_model = copy.deepcopy(model) if cfg.distributed.zero_stage == 3 and not vllm else model
    backend = make_deepspeed_backend(model, optimizer, cfg.distributed, cfg.train.micro_batch_size,
                                     cfg.train.grad_clip, cfg.model.dtype)
    state = TrainerState(step=0, data_cursor=0, rollout_calls=0)
    loaded = checkpointing.load(backend, Path(cfg.train.checkpoint_dir), scheduler) if resume else None
    state = loaded or state
    if rollout_model is not backend.module:
        checkpointing.copy_weights_into(backend, rollout_model)
    seed = cfg.run.seed + backend.rank * cfg.distributed.rollout_seed_stride
    engine = ShardedRolloutEngine(rollout_model, tokenizer, tools, cfg.rollout, seed=seed)
    if vllm and loaded is not None:  # vLLM loaded the initial weights from disk, not the checkpoint's
        push_rollout_weights(cfg, backend, engine)
    engine.calls = state.rollout_calls
    stream = problem_stream(problems, cfg.run.seed, state.data_cursor, cfg.train.balance_sources)
    reference = make_reference(cfg, model_device(backend.engine))  # for a KL term; nothing otherwise
    return Trainer(cfg, backend.engine, tokenizer, engine, optimizer, scheduler, stream, state, placement,
                   weights, tepo, reference, collect_groups, informative)


def local_groups(kept: list[ScoredGroup], rank: int, world: int) -> tuple[list[ScoredGroup], float]:
    """This rank's whole groups, balanced by policy tokens, and its weight (0: no data, runs idle passes)."""
    costs = [float(max(sum(t.policy_token_count for t in g.group.trajectories), 1)) for g in kept]
    mine = assign_groups(costs, world)[rank]
    return ([kept[i] for i in mine], 1.0) if mine else (kept[:1], 0.0)


def recompute_old_logprobs(backend: DeepSpeedBackend, batch: TrainBatch, micro: int, temperature: float,
                           autocast: torch.dtype | None) -> TrainBatch:
    """Like `pipeline.train.recompute_old_logprobs`, with as many forwards on every rank (ZeRO-3 gathers in each)."""
    parts = micro_batches(batch, micro)
    n_passes = backend.all_reduce_max(len(parts))
    backend.model.eval()
    with torch.no_grad():
        out = [token_logprobs_and_entropy(backend.model, parts[min(i, len(parts) - 1)], temperature,
                                          with_entropy=False, autocast=autocast)[0] for i in range(n_passes)]
    old_BT = padded_cat(out[: len(parts)], batch.input_ids_BT.shape[1])
    return dataclasses.replace(batch, old_logprobs_BT=old_BT * batch.loss_mask_BT)


def data_parallel_train_step(tr: Trainer, kept: list[ScoredGroup],
                             anchored: Sequence[ScoredGroup] = ()) -> dict[str, float]:
    """`pipeline.train.train_step` across ranks: each mini-batch's whole groups spread over the ranks,
    with the mini-batch's global token denominator."""
    if not kept:  # identical on every rank: the rollouts were all-gathered
        return {"train/skipped": 1.0}
    backend = DeepSpeedBackend(tr.model)
    tc = tr.cfg.train
    batches = [local_batch(tr, backend, groups) for groups in mini_batch_groups(kept, tc.ppo_mini_batches, anchored)]
    # Rows run padded here: the packed prefix tree's dense [P, P] mask is measured on CPU only, and this
    # path is for GPUs, where an arbitrary mask rules out the flash-attention kernel (not measured there).
    settings = UpdateSettings(tc.micro_batch_size, tc.grad_clip, tr.cfg.rollout.temperature,
                              autocast=AUTOCAST[tc.autocast])
    loss = make_policy_loss(tc.algorithm, tr.cfg.rollout.max_policy_tokens)
    updates = [apply_policy_gradient(backend, batch, loss, settings, weight)
               for _ in range(tc.ppo_epochs) for batch, weight in batches]
    tr.scheduler.step()
    if tr.cfg.rollout.backend == "vllm":  # every rank's engine gets the new weights
        push_rollout_weights(tr.cfg, backend, tr.engine)
    elif tr.engine.model is not backend.module:  # hf under ZeRO-3: refresh the rollout copy
        checkpointing.copy_weights_into(backend, tr.engine.model)
    return mean_over_updates(updates) | {"train/lr": tr.scheduler.get_last_lr()[0], "train/skipped": 0.0}


def local_batch(tr: Trainer, backend: DeepSpeedBackend, groups: list[ScoredGroup]) -> tuple[TrainBatch, float]:
    """This rank's share of one mini-batch (with old and reference log-probs) and its weight (0: no data)."""
    tc = tr.cfg.train
    mine, weight = local_groups(groups, backend.rank, backend.world)
    batch = make_train_batch(mine, token_advantages(mine, tc.algorithm, tr.tepo, tr.informative),
                             tr.tokenizer.pad_token_id).to(model_device(backend.module))
    if tc.logprobs_source == "recompute":
        batch = recompute_old_logprobs(backend, batch, tc.micro_batch_size, tr.cfg.rollout.temperature,
                                       AUTOCAST[tc.autocast])
    return tr.reference.attach(batch, tc.micro_batch_size, tr.cfg.rollout.temperature), weight  # a local frozen copy


def push_rollout_weights(cfg: RunConfig, backend: DeepSpeedBackend, engine) -> None:
    """Collective under ZeRO-3: the trained weights, full, into this rank's vLLM engine."""
    weight_sync.push_weights(backend.module, engine.backend, chunk_bytes=cfg.rollout.vllm.push_chunk_mib * 2**20)


def save_checkpoint(tr: Trainer) -> Path:
    """Collective: a DeepSpeed checkpoint of the trainer (what `pipeline.train.run` saves every N steps)."""
    return checkpointing.save(DeepSpeedBackend(tr.model), Path(tr.cfg.train.checkpoint_dir), tr.state,
                              tr.scheduler, tr.tokenizer)


def save_final_model(tr: Trainer, path: Path) -> None:
    """Collective: rank 0 writes the Hugging Face directory, gathered from ZeRO shards when needed."""
    checkpointing.export_hf(DeepSpeedBackend(tr.model), tr.tokenizer, path)


def is_main_process() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
