"""RL with tools: DAPO / GRPO / Dr.GRPO over tool-augmented rollouts (TAPO's training loop).

`run` reads like the algorithm: sample groups with tools -> reward -> drop uninformative
groups -> group-relative advantages -> clipped token-level loss -> update -> log/checkpoint.
Each variant (the loss, TEPO, the filter, the sampler, full or LoRA weights, the old log-probs'
source, the reference) is a type chosen once in `set_up`; the step calls it and never asks which.

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
8. One step for one process and for data parallelism: the step runs against `Replicas`
   (`pipeline.trainer.replicas`: `OneProcess`, or one rank of DeepSpeed, `DeepSpeedReplicas`) and over
   rollouts that are this process's own or all-gathered from every rank (`ShardedRollouts`). verl and
   TRL delegate the placement to a framework; torchtune writes one recipe per placement. Here the
   two differ only in where gradients go, which of a mini-batch's whole groups a rank trains on, how
   weights reach the rollout engine and how checkpoints are written: the four methods the interface
   names, so a second copy of the step would repeat everything else. Each sequence's sampler is seeded by its
   place in the whole batch, not by the rank that samples it (verl seeds each rank apart), so N ranks sample,
   and train, what one process would (`pipeline.distributed.sharding`).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from pipeline.config import RunConfig, load_config
from pipeline.config.train import LoraFinetune
from pipeline.distributed.launch import die_with_launcher, leave_process_group
from pipeline.model import enable_activation_checkpointing, load_policy, model_device, training_forward
from pipeline.repeatable import make_repeatable
from pipeline.outputs import ensure_writable, publish_dir, staging_dir, write_json_durably
from pipeline.rl.advantage import GroupFilter, advantages_of, group_filter, token_advantages
from pipeline.rl.anchor import step_openings
from pipeline.rl.loss import PolicyLoss, make_policy_loss
from pipeline.rl.tepo import Tepo, tepo_variant
from pipeline.rollout.engine import RolloutEngine
from pipeline.sampling.dynamic_sampling import (Collected, GroupReward, Rollouts, Sampler, group_reward, outage_metrics,
                                               sampler_for)
from pipeline.sampling.problem_stream import ProblemStream, problem_stream
from pipeline.sampling.training_problems import check_prompt_budget, read_training_problems
from pipeline.tools.base import tool_specs
from pipeline.tools.factory import close_now, make_tools
from pipeline.tools.outages import OutageGuard
from pipeline.tracking.headline import write_train_headline
from pipeline.tracking.history import TRAIN_HISTORY, MetricHistory, StepProgress
from pipeline.tracking.model_record import training_record
from pipeline.tracking.registry import find_version, log_and_register
from pipeline.tracking.runs import STAGE_RUN_ENV, tracked_run
from pipeline.tracking.traces import finish_traces, log_step_traces
from pipeline.tracking.train_samples import log_samples
from pipeline.trainer.batching import make_train_batch, mini_batch_groups
from pipeline.training_run.checkpoint import TrainerState
from pipeline.trainer.lr_schedule import lr_multiplier
from pipeline.trainer.reference import Reference, make_reference
from pipeline.trainer.replicas import OneProcess, Replicas
from pipeline.training_run.folder import mark_finished
from pipeline.training_run.plan import RunPlan, plan_run, take_folder
from pipeline.trainer.update import (RecomputedLogprobs, SampledLogprobs, UpdateSettings, apply_policy_gradient,
                                     mean_over_updates, old_logprobs_source, update_settings)
from pipeline.trainer.weights import PolicyWeights, policy_weights
from pipeline.types import ToolName, ScoredGroup, TrainBatch

CURVE_COLUMNS = ["reward/mean", "reward/accuracy", "reward/format_error_rate", "rollout/mean_policy_tokens",
                 "train/entropy", "train/kept_group_fraction"]


@dataclass(frozen=True)
class Training:
    """What the loop holds, built once by `set_up`; the run's progress is the loop's `TrainerState`."""

    cfg: RunConfig
    tokenizer: Any
    replicas: Replicas  # one process, or this rank of a data-parallel job
    scheduler: torch.optim.lr_scheduler.LRScheduler
    engine: RolloutEngine  # this process's sampler, with the tools
    rollouts: Rollouts  # the engine, or the engine's share of every rank's rollouts
    stream: ProblemStream
    sampler: Sampler  # dynamic sampling in rounds, by refill, or by refill per rank
    reward: GroupReward  # rule-based rewards (+ TEPO sparse)
    keep: GroupFilter  # dynamic sampling's filter, or keep all
    tepo: Tepo  # TEPO off, sparse or dense
    loss: PolicyLoss  # DAPO, GRPO or Dr.GRPO
    old_logprobs: SampledLogprobs | RecomputedLogprobs
    reference: Reference  # frozen initial model for a KL term, or nothing
    settings: UpdateSettings
    outages: OutageGuard  # the run's tool-outage counts
    start: TrainerState  # where this run starts (a resume's checkpoint, or step 0)
    plan: RunPlan  # this run's folder, identity, inputs and the checkpoint it started from


def set_up(cfg: RunConfig, tool_urls: Mapping[ToolName, str], plan: RunPlan | None = None) -> Training:
    """Everything the loop holds, for the run `plan` says (none: a fresh run in the config's folder)."""
    make_repeatable(cfg.run.seed, cfg.run.deterministic)  # before the model loads
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    tc, plan = cfg.train, plan or plan_run(cfg)
    if cfg.distributed.enabled and isinstance(tc.finetune, LoraFinetune):
        raise ValueError("train.finetune: kind lora is not supported with distributed.enabled (use kind full)")
    rows = read_training_problems(tc.train_file, tc.sampling.max_train_problems)  # refused before the model loads
    weights, tepo = policy_weights(tc.finetune), tepo_variant(cfg.reward)
    # DeepSpeed moves each rank's copy to its own device; a single process uses model.device. One process trains
    # float32 master weights whatever model.dtype is (its forward runs in model.dtype: pipeline.model)
    held = weights.held_dtype(cfg.model.dtype, deepspeed=cfg.distributed.enabled)
    model, tokenizer = load_policy(tc.init_model, held, "cpu" if cfg.distributed.enabled else cfg.model.device)
    if tc.update.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model = weights.prepare(model)
    optimizer = torch.optim.AdamW(weights.trainable(model), lr=tc.optimizer.lr, weight_decay=tc.optimizer.weight_decay, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_multiplier(tc.optimizer.lr_decay, tc.optimizer.warmup_steps, tc.steps, tc.optimizer.min_lr_ratio))
    tools = make_tools(cfg.rollout.tools, cfg.sandbox, cfg.search, tool_urls)  # the registry: an MCP server is started and its schemas read here
    try:  # before the first step, with the schemas a chat template declares
        check_prompt_budget(tc.train_file, rows, tokenizer, cfg.rollout, tuple(tools), tool_specs(tools))
        replicas, rollout_model = placed(cfg, model, optimizer, weights)
        if replicas.is_main:
            take_folder(plan)  # a fresh run removes an earlier attempt's checkpoints; the config and inputs recorded
        start = replicas.load_checkpoint(plan.start_from, scheduler) if plan.start_from is not None else None
        # the protocol binds here: a chat template it cannot render token-exactly is refused. One seed on every
        # rank: trajectories are keyed by their place in the batch (pipeline.distributed.sharding)
        engine = RolloutEngine(rollout_model, tokenizer, tools, cfg.rollout, seed=cfg.run.seed)
    except BaseException:  # the registry's servers do not outlive a set-up that failed
        close_now(tools)
        raise
    if start is not None:  # the engine sampled from the initial weights (vLLM loaded them; a ZeRO-3 copy holds them)
        replicas.sync(engine)
    start = start or TrainerState(step=0, data_cursor=0, rollout_calls=0)
    engine.rollouts_started = start.rollout_calls
    keep = group_filter(tc.algorithm, tepo)
    device = model_device(replicas.model)
    autocast = training_forward(cfg.model.dtype, held, tc.update.autocast, device)  # `auto`: bf16 where the device has it
    print(f"train.update.autocast {tc.update.autocast}, model.dtype {cfg.model.dtype}: the update's forward in {autocast or held} "
          f"over {held} weights on {device}", file=sys.stderr, flush=True)
    settings = update_settings(tc.update.micro_batch_size, tc.optimizer.grad_clip, cfg.rollout.temperature, replicas, autocast)
    return Training(
        cfg, tokenizer, replicas, scheduler, engine, sharded(engine) if cfg.distributed.enabled else engine,
        problem_stream([problem for _, problem in rows], cfg.run.seed, start.data_cursor, tc.sampling.balance_sources),
        sampler_for(tc.sampling, cfg.rollout, cfg.distributed.enabled), group_reward(cfg.reward, cfg.rollout, tepo), keep, tepo, make_policy_loss(tc.algorithm, cfg.rollout.max_policy_tokens),
        old_logprobs_source(tc.update.logprobs_source), make_reference(tc.algorithm, tc.init_model, device, held), settings,
        OutageGuard(tc.outages.max_step_share, tc.outages.max_run_share), start, plan)


def placed(cfg: RunConfig, model: PreTrainedModel, optimizer: torch.optim.Optimizer,
           weights: PolicyWeights) -> tuple[Replicas, PreTrainedModel]:
    """Where the update runs, and the model rollouts sample from."""
    if not cfg.distributed.enabled:
        return OneProcess(model, optimizer, cfg.train.optimizer.grad_clip, weights), model
    from pipeline.distributed.checkpointing import copy_weights_into
    from pipeline.distributed.replicas import deepspeed_replicas  # DeepSpeed is imported only when used

    # Under ZeRO-3 the trained parameters become shards: an in-process backend samples from a full copy (vLLM has
    # its own)
    copied = copy.deepcopy(model) if cfg.distributed.zero_stage == 3 and cfg.rollout.generation.in_process else None
    replicas = deepspeed_replicas(model, optimizer, cfg.distributed, cfg.train.update.micro_batch_size,
                                  cfg.train.optimizer.grad_clip, cfg.model.dtype, cfg.rollout)
    if copied is not None:  # the copy holds the weights as the engine trains them (DeepSpeed may have cast them)
        # beside the rank's shards: its GPU, not the CPU it was loaded on (the ignore: transformers' typed wrapper
        # of Module.to names the model where the device goes)
        copied.to(model_device(replicas.module))  # type: ignore[arg-type]
        copy_weights_into(replicas, copied)
    return replicas, copied if copied is not None else replicas.module


def sharded(engine: RolloutEngine) -> Rollouts:
    from pipeline.distributed.sharding import ShardedRollouts

    return ShardedRollouts(engine)


def prepared_batch(t: Training, groups: list[ScoredGroup]) -> tuple[TrainBatch, float]:
    """This process's share of one mini-batch on the model's device, with its group-relative advantages,
    its old log-probs (recomputed before any update when configured) and the reference's (for a KL term),
    and its weight (0: a rank without data this mini-batch, which still runs as many passes)."""
    mine, weight = t.replicas.share(groups)
    advantages = token_advantages(mine, t.cfg.train.algorithm, t.tepo, t.keep)
    batch = make_train_batch(mine, advantages, t.tokenizer.pad_token_id, t.cfg.train.update.mask_tool_output
                             ).to(model_device(t.replicas.module))
    batch = t.old_logprobs.attach(t.replicas, batch, t.settings)
    return t.reference.attach(batch, t.settings), weight


def update(t: Training, kept: list[ScoredGroup], anchored: Sequence[ScoredGroup] = ()) -> dict[str, float]:
    """Advantages, the clipped token-level loss and ppo_epochs x mini-batches optimiser steps on the kept
    groups and the dropped groups' openings (`anchored`, KL only); then the rollout engine's weights."""
    if not kept:  # the same on every rank: rollouts are all-gathered
        return {"train/skipped": 1.0}
    tc = t.cfg.train
    lr = t.scheduler.optimizer.param_groups[0]["lr"]  # the rate these updates step with (not the next step's)
    batches = [prepared_batch(t, groups) for groups in mini_batch_groups(kept, tc.update.ppo_mini_batches, anchored)]
    updates = [apply_policy_gradient(t.replicas, batch, t.loss, t.settings, weight)
               for _ in range(tc.update.ppo_epochs) for batch, weight in batches]
    t.scheduler.step()
    t.replicas.sync(t.engine)  # weight sync (a no-op for hf in one process: it samples from the trained model)
    return mean_over_updates(updates) | {"train/lr": lr, "train/skipped": 0.0}


def sample(t: Training, step: int) -> Collected:
    """One step's groups: sampled with tools, rewarded, and kept or dropped by dynamic sampling; raises (before any
    training) when tool outages pass their limits."""
    collected = t.sampler.collect(t.rollouts, t.stream, t.reward, t.keep)
    collected.metrics.update(outage_metrics(t.outages, collected, step))
    return collected


@dataclass(frozen=True)
class StepRecords:
    """Where a step is recorded: the metrics history, the progress bar and the MLflow run (rank 0's only)."""

    history: MetricHistory
    progress: StepProgress
    run_id: str | None


def record_step(t: Training, records: StepRecords, step: int, collected: Collected,
                anchored: Sequence[ScoredGroup], metrics: dict[str, float]) -> None:
    """The step's metrics in the history and on the bar; under data parallelism what each rank trained on; sample
    tables and a few groups as traces in MLflow."""
    records.history.log(step, metrics)
    records.progress.show(step, metrics)
    if t.cfg.distributed.enabled:  # every rank says what it trained on: the load balance, in the stage's log
        print(rank_share(t, step, collected.kept, anchored), file=sys.stderr, flush=True)
    tc = t.cfg.train
    if records.run_id is not None and tc.sample_tables.every and step % tc.sample_tables.every == 0:
        log_samples(records.run_id, step, collected.seen, collected.kept, tc.sample_tables.trajectories)
    log_step_traces(t.cfg.run.traces, records.run_id, step, collected,
                    lambda groups: advantages_of(groups, tc.algorithm))  # a few groups, turn by turn


def checkpoint_if_due(t: Training, history: MetricHistory, step: int, run_id: str | None) -> TrainerState:
    """The run's state after `step`, saved as a checkpoint every `train.checkpoints.every` steps and at the last
    (collective under data parallelism), with the digest of the history it was saved after."""
    state = TrainerState(step + 1, t.stream.cursor, t.engine.rollouts_started, run_id)
    if (step + 1) % t.cfg.train.checkpoints.every == 0 or step + 1 == t.cfg.train.steps:
        state = replace(state, history_sha256=history.digest(step + 1))
        t.replicas.save_checkpoint(t.plan.folder, state, t.scheduler, t.tokenizer)
    return state


def run(cfg: RunConfig, tool_urls: Mapping[ToolName, str], plan: RunPlan | None = None, *,
        metrics_dir: Path = Path("metrics")) -> dict[str, float]:
    """Train and save the final policy to `cfg.train.output_dir`; returns the last step's metrics. Checkpoints
    go to the run's own folder; the plan names it and the checkpoint the run starts from (the train stage makes
    it, `pipeline.training_run.plan`; without one, a fresh run in the config's folder).

    Resumable at any point: a resume at (or past) the last step trains nothing and finishes the run as an
    uninterrupted one would have (final model saved from the checkpoint, metrics rewritten from the
    history, model registered), so its outputs equal that run's. Every output is renamed into place."""
    output_dir, tc = Path(cfg.train.output_dir), cfg.train
    plan = plan or plan_run(cfg, metrics_dir=metrics_dir)
    ensure_writable([plan.folder, output_dir.parent, metrics_dir])  # before any compute
    t = set_up(cfg, tool_urls, plan)
    last: dict[str, float] = {}
    state, main = t.start, t.replicas.is_main  # under data parallelism only rank 0 records
    history = MetricHistory(metrics_dir / TRAIN_HISTORY, resume_at=state.step, enabled=main,
                            run_copy=plan.history)
    # under a stage flow the run it opened (tagged with DVC's hash of each input) is adopted; a resumed attempt's
    # run is its own, never the killed one's reopened (pipeline.tracking.runs)
    earlier = state.mlflow_run_id if state.step else None
    run_ctx = tracked_run(cfg.run, "train", cfg.model_dump(), resumed_from=earlier, resumed_at=state.step) \
        if main else contextlib.nullcontext(None)
    with run_ctx as active:
        history.log_earlier_steps()  # the steps before the checkpoint: this run then holds every step once
        run_id = active.info.run_id if active is not None else None
        steps = StepProgress(state.step, tc.steps, enabled=main)  # a bar on a terminal, else a line a step
        for step in steps:
            started = time.perf_counter()
            collected = sample(t, step)  # groups sampled with tools and rewarded; the uninformative ones dropped
            sampled = time.perf_counter()
            anchored = step_openings(collected.kept, collected.dropped, tc.sampling.anchor_dropped_tokens)
            update_metrics = update(t, collected.kept, anchored)  # advantages, batches, loss, optimiser steps, sync
            last = collected.metrics | update_metrics | {"train/anchored_groups": float(len(anchored)),
                                                         "time/rollout_seconds": sampled - started,
                                                         "time/train_seconds": time.perf_counter() - sampled}
            record_step(t, StepRecords(history, steps, run_id), step, collected, anchored, last)
            state = checkpoint_if_due(t, history, step, run_id)
        finish_run(t, output_dir)
        t.engine.close()
        # inside the MLflow run (main's: the other ranks have none): an attempt killed before its records are
        # written is not FINISHED
        if active is not None:
            finish_traces()  # the steps' traces, written while it trained
            last = record_run(t, history, state.step, metrics_dir, active.info.run_id, earlier)
    return last


def record_run(t: Training, history: MetricHistory, steps_done: int, metrics_dir: Path, run_id: str,
               earlier: str | None) -> dict[str, float]:
    """The run's records once its model is saved: the last step's metrics and the curve from the history (what
    the uninterrupted run logged, however resumed), the headline, the registered model, the finished marker."""
    cfg = t.cfg
    last = history.final_metrics(steps_done)
    history.write_csv(metrics_dir / "train_curve.csv", CURVE_COLUMNS)
    write_json_durably(metrics_dir / "train.json", {k: v for k, v in last.items() if not k.startswith("rollout/turns")})
    write_train_headline(metrics_dir, history.rows, CURVE_COLUMNS[:3], cfg.run, run_id)
    register_once(cfg, run_id, Path(cfg.train.output_dir), t.plan.folder, earlier)  # new version of tapo-policy
    mark_finished(t.plan.folder, steps_done)  # `train.checkpoints.resume: auto` trains a finished run again, never resumes it
    return last


def rank_share(t: Training, step: int, kept: list[ScoredGroup], anchored: Sequence[ScoredGroup]) -> str:
    """This rank's part of a step: the groups and policy tokens of each mini-batch it trained on."""
    shares = [t.replicas.share(groups) for groups in mini_batch_groups(kept, t.cfg.train.update.ppo_mini_batches, anchored)]
    mine = [g for groups, weight in shares if weight > 0 for g in groups]
    tokens = sum(tr.policy_token_count for g in mine for tr in g.group.trajectories)
    return (f"rank {t.replicas.rank} of {t.replicas.world}: step {step + 1}: trained on {len(mine)} of "
            f"{len(kept) + len(anchored)} groups, {tokens} policy tokens")


def finish_run(t: Training, output_dir: Path) -> None:
    """The final model, written beside `output_dir` and renamed into place (collective under data parallelism:
    rank 0 writes), so a kill while saving leaves the old model or none, never half of one."""
    staging = staging_dir(output_dir) if t.replicas.is_main else output_dir
    t.replicas.save_model(t.tokenizer, staging)
    if t.replicas.is_main:
        publish_dir(staging, output_dir)


def register_once(cfg: RunConfig, run_id: str, model_dir: Path, run_dir: Path, earlier: str | None = None) -> None:
    """A new version of tapo-policy, unless this run, or the attempt it resumed (`earlier`), already registered
    these weights (a run killed after registering and then resumed registers nothing twice)."""
    known = find_version(cfg.run, str(model_dir))
    if known is not None and known.run_id in (run_id, earlier):
        print(f"{model_dir}: already registered as version {known.version} by run {run_id}", file=sys.stderr)
        return
    log_and_register(cfg.run, run_id, model_dir, **training_record(cfg.train, cfg.rollout, cfg.model.dtype, run_dir))


def main(argv: Sequence[str] | None = None) -> None:
    """One rank of a data-parallel training, as the train stage starts it (`pipeline.distributed.launch`).
    Everything it needs is on the command line: a launcher on another node passes on little of the environment."""
    parser = argparse.ArgumentParser(description="One rank of the train stage (started by python -m flows.train).")
    parser.add_argument("--params", required=True, help="the stage's params file")
    parser.add_argument("--plan", required=True, help="the run's plan, as the stage made it "
                        "(pipeline.training_run.plan: its folder and the checkpoint every rank starts from)")
    parser.add_argument("--tool-url", action="append", default=[], metavar="TOOL=URL",
                        help="a tool service the stage started (repeatable)")
    parser.add_argument("--stage-run", default="", help="the MLflow run the stage opened (rank 0 logs into it)")
    parser.add_argument("--metrics-dir", default="metrics", type=Path)
    parser.add_argument("--output-dir", default=None, help="where the final model goes (default: train.output_dir)")
    args = parser.parse_args(argv)
    try:
        plan = RunPlan.decoded(args.plan)
    except ValueError as err:
        parser.error(str(err))
    die_with_launcher()
    if args.stage_run:
        os.environ[STAGE_RUN_ENV] = args.stage_run
    urls = dict(item.split("=", 1) for item in args.tool_url)
    cfg = load_config(args.params)
    if args.output_dir is not None:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"output_dir": args.output_dir})})
    run(cfg, urls, plan, metrics_dir=args.metrics_dir)
    leave_process_group()  # not after a failure: the launcher stops the ranks then


if __name__ == "__main__":
    main()
