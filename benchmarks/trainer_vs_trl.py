"""Seconds per RL step on CPU: our trainer vs TRL's GRPOTrainer with its DAPO loss, in one run.

Same model (the SmolLM2-135M-Instruct safetensors copy in models/base, or --model), same
problems (calculator questions, prompted through the same chat template and system prompt),
same batch (P prompts x G completions), completion cap, learning rate, fp32, no gradient
checkpointing and no tools (TRL cannot run ours). Ours: `pipeline.train.set_up`, then
the sampler's `collect` + `update` per step, DAPO loss with dynamic sampling off (TRL has none,
and resampling would make our steps do more work). TRL: `GRPOTrainer(loss_type="dapo",
epsilon_high=0.28, beta=0, use_cpu=True)`; its step time is taken between the trainer's
step-begin and step-end callbacks (generation happens inside the step there too).
The first step of each side is a warm-up and is reported but not averaged.

Our side's config is params.yaml with `TRL_RECIPE` (everything TRL's step does differently from the main job's
recipe: no KL and no anchored openings, no dynamic sampling or refill, one update on the whole batch, a constant
learning rate, float32) and the sizes, loaded strictly (`benchmarks.harness.derive`): a params.yaml that no longer
takes them stops the benchmark at once, naming the keys.

Last line: JSON with seconds per step of each and "ratio" = TRL / ours (higher = we are faster).
    python benchmarks/trainer_vs_trl.py [--steps 3] [--prompts 2] [--group 4] [--max-tokens 64] [--quick]
Needs TRL (`pip install -e .[bench]`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.preset_run import preset_run, workspace
from pipeline.config import RunConfig
from pipeline.data.calculator import generate
from pipeline.jsonl import write_problems
from pipeline.paths import REPO_ROOT
from pipeline.reward import verify
from pipeline.protocols import TapoProtocol
from pipeline.train import set_up, update

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
# What TRL's GRPOTrainer(loss_type="dapo", beta=0) does per step, against the main job's recipe: DAPO's clip range
# without KL (so no anchored openings) and without dynamic sampling (so no refill, one generation round), one
# optimiser step on the whole batch, a constant learning rate without warm-up or weight decay (TrainingArguments'
# defaults), the update in float32, problems in file order. The algorithm mapping is replaced whole: a key params.yaml
# adds to it later takes its class default here, not the main job's tuning.
TRL_RECIPE = {
    "train.algorithm": {"kind": "dapo", "eps_low": 0.2, "eps_high": 0.28, "dynamic_sampling": False, "kl_coef": 0.0},
    "train.sampling.anchor_dropped_tokens": 0, "train.sampling.refill_dropped_groups": False, "train.sampling.max_gen_rounds": 1,
    "train.update.ppo_epochs": 1, "train.update.ppo_mini_batches": 1, "train.optimizer.lr": 1e-6, "train.optimizer.warmup_steps": 0,
    "train.optimizer.lr_decay": "constant", "train.optimizer.weight_decay": 0.0, "train.optimizer.grad_clip": 1.0, "train.update.autocast": "none",
    "train.update.logprobs_source": "rollout", "train.update.gradient_checkpointing": False, "train.sampling.balance_sources": False,
    "model.dtype": "float32", "rollout.temperature": 1.0, "rollout.top_p": 1.0,
}
QUICK = {"steps": 2, "prompts": 1, "group": 2, "max_tokens": 8}


def ours_config(args: argparse.Namespace, train_file: Path, work: Path) -> RunConfig:
    """Our side's config: params.yaml with TRL's recipe and the benchmark's sizes, working under `work`."""
    return harness.derive(TRL_RECIPE | {
        "run.seed": 0, "run.tracking_uri": f"sqlite:///{work / 'mlruns.db'}", "train.init_model": args.model,
        "train.train_file": str(train_file), "train.steps": args.steps, "train.sampling.prompts_per_step": args.prompts,
        "train.update.micro_batch_size": args.prompts * args.group, "train.checkpoints.dir": str(work / "ckpt"),
        "train.output_dir": str(work / "policy"), "rollout.group_size": args.group,
        "rollout.max_policy_tokens": args.max_tokens, "rollout.max_total_tokens": 4096,
        "rollout.max_batch_sequences": args.prompts * args.group,
    }, harness.base_params(args.quick))


def ours(args: argparse.Namespace, train_file: Path, work: Path) -> tuple[list[float], list[float]]:
    """Per-step seconds and mean completion tokens of our trainer."""
    tr = set_up(ours_config(args, train_file, work), {})
    seconds, lengths = [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        collected = tr.sampler.collect(tr.rollouts, tr.stream, tr.reward, tr.keep)  # as pipeline.train.run
        update(tr, collected.kept)
        rollout_metrics = collected.metrics
        seconds.append(time.perf_counter() - t0)
        lengths.append(rollout_metrics["rollout/mean_policy_tokens"])
        print(f"ours step {len(seconds)}: {seconds[-1]:.2f} s, {lengths[-1]:.1f} tokens/completion", flush=True)
    tr.engine.close()
    return seconds, lengths


def calculator_reward(completions, answers, **_) -> list[float]:
    """1 for a correct <answer>, 0 otherwise (the same verifier our trainer uses)."""
    out = []
    for completion, gold in zip(completions, answers, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        found = ANSWER.search(text)
        out.append(verify("calculator", found.group(1).strip(), [gold]) if found else 0.0)
    return out


def trl(args: argparse.Namespace, problems: list, work: Path) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    protocol = TapoProtocol()
    data = Dataset.from_list([{"prompt": protocol.messages(p, ()), "answers": p.answers[0]} for p in problems])
    seconds: list[float] = []
    lengths: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            seconds.append(time.perf_counter() - self.t0)
            print(f"trl step {len(seconds)}: {seconds[-1]:.2f} s", flush=True)

        def on_log(self, _args, _state, _control, logs=None, **__):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    config = GRPOConfig(
        output_dir=str(work / "trl"), loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0,
        num_generations=args.group, per_device_train_batch_size=args.prompts * args.group,
        gradient_accumulation_steps=1, max_completion_length=args.max_tokens, max_steps=args.steps,
        learning_rate=1e-6, lr_scheduler_type="constant", use_cpu=True, bf16=False, gradient_checkpointing=False,
        temperature=1.0, top_p=1.0, report_to="none", logging_steps=1, save_strategy="no", seed=0,
        shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    trainer = GRPOTrainer(model=model, reward_funcs=calculator_reward, args=config, train_dataset=data,
                          processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    return seconds, lengths


def steady(seconds: list[float]) -> float:
    """Mean seconds per step after the first (warm-up) step."""
    return statistics.mean(seconds[1:] if len(seconds) > 1 else seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model dir (default: models/base; --quick: the tiny one)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = harness.parse(parser, argv, QUICK)
    with workspace(None, args.quick) as ws, tempfile.TemporaryDirectory() as tmp:
        args.model = args.model or str(preset_run(ws).sft if args.quick else REPO_ROOT / "models" / "base")
        if not (Path(args.model) / "config.json").is_file():
            sys.exit(f"{args.model}: no model directory (python -m flows.prepare_model writes models/base)")
        problems = generate(max(8, args.steps * args.prompts), seed=0)
        work = Path(tmp)
        write_problems(work / "train.jsonl", problems)
        ours_s, ours_len = ours(args, work / "train.jsonl", work)
        trl_s, trl_len = trl(args, problems, work)
    result = {
        "model": Path(args.model).name, "steps": args.steps, "prompts": args.prompts, "group": args.group,
        "max_completion_tokens": args.max_tokens, "torch_threads": torch.get_num_threads(),
        "ours_s_per_step": round(steady(ours_s), 3), "trl_s_per_step": round(steady(trl_s), 3),
        "ours_steps_s": [round(s, 3) for s in ours_s], "trl_steps_s": [round(s, 3) for s in trl_s],
        "ours_mean_completion_tokens": round(statistics.mean(ours_len), 1),
        "trl_mean_completion_tokens": round(statistics.mean(trl_len), 1) if trl_len else None,
        "ratio": round(steady(trl_s) / steady(ours_s), 3),
    }
    harness.last_line(result, args.quick)


if __name__ == "__main__":
    main()
