"""RL with tools: DAPO / GRPO / Dr.GRPO over tool-augmented rollouts (TAPO's training loop).

`run` reads like the algorithm: sample groups with tools -> reward -> drop uninformative
groups -> group-relative advantages -> clipped token-level loss -> update -> log/checkpoint.

Departures from the papers, and why:
1. Tool-output tokens are excluded from the loss numerator *and* denominator (TAPO's code
   zeroes their advantage but still counts them, diluting the gradient by the share of
   tool tokens).
2. The importance ratio uses the log-probs recorded at sampling time by default; the
   sampled tokens are never re-tokenized, so they are exactly the trained tokens.
3. Dynamic sampling gives up after `max_gen_rounds` and trains on what it kept (TAPO pads
   with unfiltered groups "for testing", which adds zero-advantage rows); a step with no
   informative group makes no update. Optionally (`refill_dropped_groups`) a dropped group is
   replaced inside the running rollout instead of in a further round (`pipeline.sampling.dynamic_sampling`).
4. The policy is shared in-process with the `hf` rollout backend, so weight sync is free
   (with a LoRA adapter too: the backend samples from the adapted model).
5. GRPO's KL penalty to the initial model (`kl_coef`, off by default as in DAPO) is available
   to both variants; the frozen reference is loaded from `train.init_model` (`pipeline.trainer.reference`).
6. Optionally (`anchor_dropped_tokens`, with a KL term), the openings of the groups dynamic sampling
   drops stay in the batch at zero advantage, so the KL term holds the tool choice on problems the
   policy always fails (`pipeline.rl.anchor`).
7. Each rollout batch makes ppo_epochs x ppo_mini_batches optimiser steps; a mini-batch holds whole
   groups and is normalised by its own policy tokens (verl's ppo_mini_batch_size; TRL makes one step
   per generation batch unless it repeats the batch). The logged update metrics are their mean.
   The anchored openings of 6. are spread over the mini-batches, so none trains on the KL term alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model
from tqdm import tqdm

from pipeline.rl.advantage import group_filter, token_advantages
from pipeline.rl.anchor import step_openings
from pipeline.trainer.batching import make_train_batch, mini_batch_groups
from pipeline.trainer.checkpoint import FILES as CHECKPOINT_FILES
from pipeline.trainer.checkpoint import TrainerState, load_checkpoint, resume_checkpoint, save_checkpoint
from pipeline.config import RunConfig
from pipeline.config.train import LoraFinetune
from pipeline.distributed import trainer as data_parallel
from pipeline.trainer.weights import PolicyWeights, policy_weights
from pipeline.sampling.dynamic_sampling import group_collector
from pipeline.tracking.history import MetricHistory, progress_line
from pipeline.jsonl import write_json
from pipeline.rl.loss import make_policy_loss
from pipeline.trainer.lr_schedule import lr_multiplier
from pipeline.model import AUTOCAST, load_policy, model_device
from pipeline.outputs import ensure_writable, publish_dir, staging_dir
from pipeline.sampling.problem_stream import problem_stream
from pipeline.trainer.reference import make_reference
from pipeline.tracking.registry import find_version, log_and_register
from pipeline.rollout.engine import RolloutEngine
from pipeline.session import Placement, Trainer
from pipeline.rl.tepo import tepo_variant
from pipeline.tools.factory import make_tools
from pipeline.tracking.runs import tracked_run
from pipeline.sampling.training_problems import check_prompt_budget, read_training_problems
from pipeline.tracking.train_samples import data_hash_tags, log_samples
from pipeline.types import ScoredGroup, ToolName, TrainBatch
from pipeline.trainer.update import UpdateSettings, masked_logprobs_no_grad, mean_over_updates, policy_gradient_step

CURVE_COLUMNS = ["reward/mean", "reward/accuracy", "reward/format_error_rate", "rollout/mean_policy_tokens",
                 "train/entropy", "train/kept_group_fraction"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def set_up(cfg: RunConfig, tool_urls: Mapping[ToolName, str], resume: bool) -> Trainer:
    seed_everything(cfg.run.seed)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    tc = cfg.train
    if cfg.distributed.enabled and isinstance(tc.finetune, LoraFinetune):
        raise ValueError("train.finetune: kind lora is not supported with distributed.enabled (use kind full)")
    # the variants, chosen once
    weights, tepo, collect_groups = policy_weights(tc.finetune), tepo_variant(cfg.reward), group_collector(cfg)
    informative = group_filter(tc.algorithm, tepo)
    rows = read_training_problems(tc.train_file, tc.max_train_problems)  # refused before the model loads
    # DeepSpeed moves each rank's copy to its own device; a single process uses model.device
    model, tokenizer = load_policy(tc.init_model, cfg.model.dtype, "cpu" if cfg.distributed.enabled else cfg.model.device)
    if tc.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model = weights.prepare(model)
    optimizer = torch.optim.AdamW(weights.trainable(model), lr=tc.lr, weight_decay=tc.weight_decay,
                                  betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_multiplier(tc.lr_decay, tc.warmup_steps, tc.steps, tc.min_lr_ratio))
    offered = tuple(name for name in ("code", "search") if name in tool_urls)  # what make_tools will offer
    check_prompt_budget(tc.train_file, rows, tokenizer, cfg.rollout, offered)  # before the first step
    problems = [problem for _, problem in rows]
    state = TrainerState(step=0, data_cursor=0, rollout_calls=0)
    if cfg.distributed.enabled:  # DeepSpeed data parallelism: same loop, the engine in place of the model
        return data_parallel.set_up_data_parallel(cfg, model, tokenizer, optimizer, scheduler, problems,
                                                  make_tools(cfg, tool_urls), resume, DATA_PARALLEL, weights=weights,
                                                  tepo=tepo, collect_groups=collect_groups,
                                                  informative=informative)
    checkpoint = resume_checkpoint(Path(tc.checkpoint_dir)) if resume else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, model, optimizer, scheduler)
    engine = RolloutEngine(model, tokenizer, make_tools(cfg, tool_urls), cfg.rollout, seed=cfg.run.seed)
    if checkpoint is not None:  # an engine with its own copy (vLLM) loaded the initial weights
        engine.backend.update_weights(weights.rollout_tensors(model))
    engine.calls = state.rollout_calls
    stream = problem_stream(problems, cfg.run.seed, state.data_cursor, cfg.train.balance_sources)
    reference = make_reference(cfg, model_device(model))  # for a KL term; nothing otherwise
    return Trainer(cfg, model, tokenizer, engine, optimizer, scheduler, stream, state, SINGLE_PROCESS,
                   weights, tepo, reference, collect_groups, informative)


def collect_batch(tr: Trainer) -> tuple[list[ScoredGroup], dict[str, float]]:
    """The groups to train on and the rollout metrics (the step's sampling without the dropped groups)."""
    collected = tr.collect_groups(tr)
    return collected.kept, collected.metrics


def recompute_old_logprobs(tr: Trainer, batch: TrainBatch) -> TrainBatch:
    tr.model.eval()
    old_BT = masked_logprobs_no_grad(tr.model, batch, tr.cfg.train.micro_batch_size, tr.cfg.rollout.temperature,
                                     AUTOCAST[tr.cfg.train.autocast])
    return dataclasses.replace(batch, old_logprobs_BT=old_BT)


def prepared_batch(tr: Trainer, groups: list[ScoredGroup]) -> TrainBatch:
    """One mini-batch on the model's device, normalised over its own policy tokens, with its old log-probs
    (recomputed before any update when configured) and the reference's (for a KL term)."""
    advantages = token_advantages(groups, tr.cfg.train.algorithm, tr.tepo, tr.informative)
    batch = make_train_batch(groups, advantages, tr.tokenizer.pad_token_id).to(model_device(tr.model))
    if tr.cfg.train.logprobs_source == "recompute":
        batch = recompute_old_logprobs(tr, batch)
    return tr.reference.attach(batch, tr.cfg.train.micro_batch_size, tr.cfg.rollout.temperature)


def train_step(tr: Trainer, kept: list[ScoredGroup], anchored: Sequence[ScoredGroup] = ()) -> dict[str, float]:
    """The update on the kept groups and the dropped groups' openings (`anchored`, KL only)."""
    if not kept:
        return {"train/skipped": 1.0}
    tc = tr.cfg.train
    batches = [prepared_batch(tr, groups) for groups in mini_batch_groups(kept, tc.ppo_mini_batches, anchored)]
    settings = UpdateSettings(tc.micro_batch_size, tc.grad_clip, tr.cfg.rollout.temperature, share_prefixes=True,
                              autocast=AUTOCAST[tc.autocast])
    loss = make_policy_loss(tc.algorithm, tr.cfg.rollout.max_policy_tokens)
    updates = [policy_gradient_step(tr.model, tr.optimizer, batch, loss, settings)
               for _ in range(tc.ppo_epochs) for batch in batches]
    tr.scheduler.step()
    tr.engine.backend.update_weights(tr.weights.rollout_tensors(tr.model))  # weight sync (a no-op for hf)
    return mean_over_updates(updates) | {"train/lr": tr.scheduler.get_last_lr()[0], "train/skipped": 0.0}


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], *, resume: bool = False,
        metrics_dir: Path = Path("metrics")) -> dict[str, float]:
    """Train and save the final policy to `cfg.train.output_dir`; returns the last step's metrics.

    Resumable at any point: a resume at (or past) the last step trains nothing and finishes the run as an
    uninterrupted one would have (final model saved from the checkpoint, metrics rewritten from the
    history, model registered), so its outputs equal that run's. Every output is renamed into place."""
    output_dir = Path(cfg.train.output_dir)
    ensure_writable([Path(cfg.train.checkpoint_dir), output_dir.parent, metrics_dir])  # before any compute
    tr = set_up(cfg, tool_urls, resume)
    place = tr.placement  # single process, or one rank of a data-parallel job (only rank 0 records)
    history = MetricHistory(metrics_dir / "train_history.jsonl", keep_existing=resume and tr.state.step > 0,
                            enabled=place.is_main())
    last: dict[str, float] = {}
    run_ctx = tracked_run(cfg.run, "train", cfg.model_dump(), run_id=tr.state.mlflow_run_id,
                          tags=data_hash_tags([cfg.train.train_file])) \
        if place.is_main() else contextlib.nullcontext(None)
    every = cfg.train.log_samples_every
    with run_ctx as active:
        # a progress bar with ETA on a terminal (disable=None); elsewhere (a log file, a flow's worker) one line a step
        first, run_started = tr.state.step, time.perf_counter()
        bar = tqdm(range(first, cfg.train.steps), desc="train", unit="step", disable=None)
        for step in bar:
            started = time.perf_counter()
            collected = tr.collect_groups(tr)                     # sample with tools, reward, dynamic sampling
            sampled = time.perf_counter()
            anchored = step_openings(collected.kept, collected.dropped, cfg.train.anchor_dropped_tokens)
            update_metrics = place.train_step(tr, collected.kept, anchored)  # advantages, loss, optimiser step
            seconds = {"time/rollout_seconds": sampled - started, "time/train_seconds": time.perf_counter() - sampled}
            last = collected.metrics | update_metrics | {"train/anchored_groups": float(len(anchored))} | seconds
            history.log(step, last)
            if bar.disable and place.is_main():
                print(progress_line(step, cfg.train.steps, last, time.perf_counter() - run_started,
                                    step + 1 - first), file=sys.stderr, flush=True)
            if active is not None and every and step % every == 0:
                log_samples(active.info.run_id, step, collected.seen, collected.kept, cfg.train.log_samples)
            tr.state = TrainerState(step + 1, tr.stream.cursor, tr.engine.calls, active.info.run_id if active else None)
            if (step + 1) % cfg.train.checkpoint_every == 0 or step + 1 == cfg.train.steps:
                place.save_checkpoint(tr)
        finish_run(tr, output_dir)
    tr.engine.close()
    if place.is_main():
        last = history.final_metrics(tr.state.step)  # what the uninterrupted run logged last, however resumed
        history.write_csv(metrics_dir / "train_curve.csv", CURVE_COLUMNS)
        write_json(metrics_dir / "train.json", {k: v for k, v in last.items() if not k.startswith("rollout/turns")})
        register_once(cfg, active.info.run_id, output_dir)  # new version of tapo-policy
    return last


def finish_run(tr: Trainer, output_dir: Path) -> None:
    """The final model, written beside `output_dir` and renamed into place (collective under data parallelism:
    rank 0 writes), so a kill while saving leaves the old model or none, never half of one."""
    main = tr.placement.is_main()
    staging = staging_dir(output_dir) if main else output_dir
    tr.placement.save_final_model(tr, staging)
    if main:
        publish_dir(staging, output_dir)


def register_once(cfg: RunConfig, run_id: str, model_dir: Path) -> None:
    """A new version of tapo-policy, unless this run already registered these weights (a run killed after
    registering and then resumed registers nothing twice)."""
    known = find_version(cfg.run, str(model_dir))
    if known is not None and known.run_id == run_id:
        print(f"{model_dir}: already registered as version {known.version} by run {run_id}", file=sys.stderr)
        return
    log_and_register(cfg.run, run_id, model_dir)


def save_final_model(tr: Trainer, path: Path) -> None:
    """A plain Hugging Face directory (tokenizer and chat template included) for transformers and vLLM.

    A LoRA adapter is merged into the base weights first (in place: the last use of the model)."""
    save_policy(tr.weights, tr.model, tr.tokenizer, path)


def save_policy(weights: PolicyWeights, model: torch.nn.Module, tokenizer, path: Path) -> None:
    weights.export(model).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def export_checkpoint(cfg: RunConfig, checkpoint: Path, out: Path) -> Path:
    """A single-process checkpoint (`<train.checkpoint_dir>/checkpoints/step-NNNNNN`) written as the final
    model is (`save_final_model`), to evaluate or serve an intermediate policy.

    The model is rebuilt as `set_up` builds it (train.init_model, then the finetune variant, so a LoRA
    adapter is merged on export) and the checkpoint's weights are loaded into it; a mismatch raises.
    DeepSpeed checkpoints have their own exporter (`python -m pipeline.distributed.export`)."""
    missing = [name for name in CHECKPOINT_FILES if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{checkpoint}: no {', '.join(missing)} (not a complete single-process training "
                                "checkpoint; a `.tmp` one was torn by a kill while saving)")
    weights = policy_weights(cfg.train.finetune)
    model, tokenizer = load_policy(cfg.train.init_model, cfg.model.dtype, "cpu")
    model = weights.prepare(model)
    load_model(model, str(checkpoint / "model.safetensors"))
    staging = staging_dir(out)
    save_policy(weights, model, tokenizer, staging)
    return publish_dir(staging, out)  # whole or absent, as the final model


def save_single_process_checkpoint(tr: Trainer) -> None:
    save_checkpoint(Path(tr.cfg.train.checkpoint_dir), tr.state, tr.model, tr.optimizer, tr.scheduler)


SINGLE_PROCESS = Placement(train_step, save_single_process_checkpoint, save_final_model, lambda: True)
DATA_PARALLEL = Placement(data_parallel.data_parallel_train_step, data_parallel.save_checkpoint,
                          data_parallel.save_final_model, data_parallel.is_main_process)
