"""RL training: the policy-gradient variant, optimiser and schedule."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import StageConfig

LrDecay = Literal["constant", "linear", "cosine"]  # the schedule: pipeline.trainer.lr_schedule

FilterMetric = Literal["accuracy", "total"]

FILTER_METRIC_HELP = (
    "Dynamic sampling keeps a group when this differs inside it: accuracy (DAPO, and verl's filter_groups.metric "
    "acc: 0 < #correct < G, a trajectory correct when its verifier score f_T > 0.9, so a fact answer counts when "
    "its Levenshtein partial credit 1 - r exceeds 0.9) or total (the trained reward, length and code penalties "
    "included). Under reward.tepo dense a group whose tool-level advantages are not all zero is kept either way "
    "(pipeline.rl.advantage.group_filter).")
KL_HELP = "beta of a per-token KL(pi || pi_ref) penalty to the initial model (k3 estimate; 0 = off, no reference kept)."


class DAPOLoss(StageConfig):
    """DAPO: token-level loss, clip-higher, no KL by default, dynamic sampling."""

    display_name: ClassVar[str] = "DAPO"  # in the policy's row of an evaluation table
    kind: Literal["dapo"] = "dapo"
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range of the importance ratio.")
    eps_high: float = Field(0.28, ge=0.0, le=1.0, description="Upper clip range (clip-higher keeps entropy up).")
    dual_clip: float = Field(10.0, gt=1.0, description="Dual-clip bound c for negative advantages.")
    dynamic_sampling: bool = Field(True, description="Drop the groups filter_metric finds uninformative and sample more.")
    filter_metric: FilterMetric = Field("accuracy", description=FILTER_METRIC_HELP)
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description=(
        "beta of a per-token KL(pi || pi_ref) penalty to the initial model (k3 estimate); DAPO drops it (0), "
        "a small value anchors a small model's behaviour where rewards are sparse. Above 0 a frozen copy of "
        "train.init_model is kept."))


class GRPOLoss(StageConfig):
    """GRPO: sequence-mean loss, symmetric clip, optional KL to the initial model.

    `std_normalize: false` only drops the std division; the per-sequence 1/|o_i| mean stays, and with it
    the length bias Dr.GRPO removes: that is `DrGRPOLoss` (kind dr_grpo), not this."""

    display_name: ClassVar[str] = "GRPO"  # in the policy's row of an evaluation table
    kind: Literal["grpo"] = "grpo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Symmetric clip range.")
    std_normalize: bool = Field(True, description=(
        "Divide advantages by the group std (false: r - mean, with GRPO's sequence mean kept; this is not "
        "Dr.GRPO, which is kind dr_grpo)."))
    dynamic_sampling: bool = Field(False, description="Drop the groups filter_metric finds uninformative and sample more.")
    filter_metric: FilterMetric = Field("accuracy", description=FILTER_METRIC_HELP)
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description=(
        "beta of the per-token KL(pi || pi_ref) penalty to the initial model (k3 estimate, DeepSeekMath uses 0.04; "
        "0 = off, no reference model kept)."))


class DrGRPOLoss(StageConfig):
    """Dr.GRPO (Liu et al. 2025): GRPO without the std division and without the per-sequence mean; the
    token sum is divided by sequences x rollout.max_policy_tokens (a constant, as TRL's dr_grpo divides by
    max_completion_length), so a long sequence's tokens weigh as much as a short one's."""

    display_name: ClassVar[str] = "Dr.GRPO"  # in the policy's row of an evaluation table
    kind: Literal["dr_grpo"] = "dr_grpo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Symmetric clip range.")
    dynamic_sampling: bool = Field(False, description="Drop the groups filter_metric finds uninformative and sample more.")
    filter_metric: FilterMetric = Field("accuracy", description=FILTER_METRIC_HELP)
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description=KL_HELP)


AlgorithmConfig = DAPOLoss | GRPOLoss | DrGRPOLoss
LossConfig = Annotated[AlgorithmConfig, Field(discriminator="kind")]


class FullFinetune(StageConfig):
    """Train every weight of the policy."""

    kind: Literal["full"] = "full"


class LoraFinetune(StageConfig):
    """Train a LoRA adapter (peft) and freeze the base: optimiser state for a few percent of the
    weights, for machines too small for full AdamW. The final model is saved merged."""

    kind: Literal["lora"] = "lora"
    r: int = Field(16, ge=1, le=1024, description="Rank of the low-rank update.")
    alpha: float = Field(32.0, gt=0.0, description="LoRA scale numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(0.0, description=(
        "Dropout on the adapter input: 0 only. Every dropout is off in the update, so that it trains the policy the "
        "sampler sampled from (with dropout the first mini-batch's ratio is not 1; pipeline.model.without_dropout)."))
    target_modules: tuple[str, ...] = Field(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), min_length=1,
        description="Names of the linear layers that get an adapter (Llama/Qwen/SmolLM naming).",
    )

    @field_validator("dropout")
    @classmethod
    def _no_dropout(cls, value: float) -> float:
        if value != 0.0:
            raise ValueError("must be 0: every dropout is off in the update, so that it trains the policy the sampler "
                             "sampled from (with dropout the first mini-batch's importance ratio is not 1)")
        return value


FinetuneConfig = Annotated[FullFinetune | LoraFinetune, Field(discriminator="kind")]


class OptimizerSection(StageConfig):
    """AdamW and its learning-rate schedule (`pipeline.trainer.lr_schedule`)."""

    lr: float = Field(1e-6, gt=0.0, lt=1.0, description="AdamW peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps.")
    lr_decay: LrDecay = Field("constant", description=(
        "After warm-up: constant (DAPO), or linear / cosine decay over the run's steps to min_lr_ratio x lr "
        "(pipeline.trainer.lr_schedule)."))
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="The decay's floor, a share of lr (unused when constant).")
    weight_decay: float = Field(0.1, ge=0.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0.0, description="Max global gradient norm.")


class UpdateSection(StageConfig):
    """How one rollout batch trains the policy: passes, mini-batches, the forward's precision, the old
    log-probs and the loss mask (`pipeline.trainer.update`)."""

    ppo_epochs: int = Field(1, ge=1, description="Passes over each rollout batch.")
    ppo_mini_batches: int = Field(
        1, ge=1, description=(
            "Optimiser steps per pass: the kept groups split into this many mini-batches of whole groups (at most "
            "one per kept group; the anchored openings of dropped groups are spread over them).")
    )
    micro_batch_size: int = Field(4, ge=1, description="Trajectories per forward/backward.")
    gradient_checkpointing: bool = Field(True, description="Trade compute for memory in the training forward.")
    autocast: Literal["none", "bfloat16", "auto"] = Field("none", description=(
        "Mixed precision of the training forward (policy, reference, recomputed old log-probs): bfloat16 runs its "
        "matrix products under torch.autocast; auto does so where the training device multiplies bf16 natively (a "
        "CUDA GPU with bf16, a CPU with AVX512 or AMX) and runs in model.dtype elsewhere (on an AVX2-only CPU a bf16 "
        "product is emulated, ~80x slower; pipeline.model.training_autocast); weights, gradients, optimiser state and the output head stay in "
        "model.dtype (float32), and rollouts are sampled in it. On a CPU with AVX512-BF16 the update is ~1.5x "
        "faster; the update's log-probs then differ from the sampler's by ~0.014 nats a token on average, "
        "noise the importance ratio carries with logprobs_source rollout; logprobs_source recompute removes it "
        "(the old log-probs then come from the update's own forward: ratio exactly 1 before the first step, "
        "benchmarks/autocast_logprob_gap.py; pipeline.trainer.update.forward_precision)."))
    logprobs_source: Literal["rollout", "recompute"] = Field(
        "rollout", description=(
            "Old log-probs for the importance ratio: as sampled, or recomputed before the update by the update's own "
            "forward (one no-grad pass per mini-batch; under autocast this removes the sampler/trainer "
            "precision gap exactly).")
    )
    mask_tool_output: bool = Field(True, description=(
        "Exclude the tokens a tool returned from the loss (TAPO, ToRL: needed for stable training). False trains on "
        "them too, as if the policy had written them: the ablation of the masking claim (their old log-probs must "
        "then be recomputed: logprobs_source recompute)."))


class SamplingSection(StageConfig):
    """Which problems a step samples and what dynamic sampling does with the groups it drops
    (`pipeline.sampling`)."""

    prompts_per_step: int = Field(2, ge=1, description="Problems per rollout batch (each sampled group_size times).")
    max_gen_rounds: int = Field(3, ge=1, description=(
        "Dynamic sampling: most rollout rounds spent filling one batch (with refill_dropped_groups: at most "
        "prompts_per_step x max_gen_rounds problems drawn)."))
    refill_dropped_groups: bool = Field(False, description=(
        "Dynamic sampling: replace a dropped group with the next problem inside the running rollout, instead of "
        "a further round after it (continuous schedule; under data parallelism each rank refills from its share of "
        "the step's window of prompts_per_step x max_gen_rounds problems and the unused ones are skipped; "
        "pipeline.sampling.dynamic_sampling)."))
    balance_sources: bool = Field(
        False, description="Draw problems round-robin over their sources, so every step mixes them (a uniform draw otherwise)."
    )
    max_train_problems: int = Field(0, ge=0, description="Use at most this many training problems (0 = all).")
    anchor_dropped_tokens: int = Field(0, ge=0, le=4096, description=(
        "KL anchor on dropped groups: the first N response tokens of each group dynamic sampling drops stay in the "
        "batch at zero advantage, so only the KL term (train.algorithm.kl_coef > 0) acts on them; it holds the "
        "opening (where the tool is chosen) on problems whose groups are all-wrong. 0 = off (pipeline.rl.anchor)."))


class CheckpointSection(StageConfig):
    """Where a run's resumable checkpoints go, how often, and when a run resumes (`pipeline.training_run`)."""

    every: int = Field(2, ge=1, description="Save a resumable checkpoint every N steps (and at the end).")
    dir: str = Field("runs/train", min_length=1, description=(
        "Where training runs keep their folders: a run's resumable checkpoints go in <dir>/<run>/checkpoints, "
        "<run> being the DVC experiment's name or a digest of the training config (pipeline.training_run.folder; not a "
        "DVC output: large and transient)."))
    resume: Literal["auto", "never"] = Field("auto", description=(
        "auto: a run started again after it was interrupted (a kill, an OOM, a stopped dvc repro) resumes from its "
        "latest complete checkpoint when that was written under the same config, code, problems and initial model "
        "and the run had not finished; otherwise it trains from step 0 and says why (pipeline.training_run.plan). "
        "never: always from step 0. The command line's --resume resumes whatever the inputs, naming those that changed."))
    log_full: bool = Field(False, description=(
        "Log the run's last checkpoint whole (weights, optimiser state, RNG: ~3x the model in float32) to MLflow, so "
        "training can resume from the tracking server; by default only every checkpoint's metadata and the final "
        "model in model.dtype are logged."))


class OutageLimits(StageConfig):
    """When tool outages stop the run (`pipeline.tools.outages`)."""

    max_step_share: float = Field(0.5, ge=0.0, le=1.0, description=(
        "Stop the run, naming the service, when more than this share of one tool service's calls in a step failed "
        "for infrastructure reasons (refused, 5xx, no answer in time; not the policy's own errors), before the step "
        "trains; 0 = stop at the first such failure. Groups that read an outage are never trained on "
        "(pipeline.tools.outages)."))
    max_run_share: float = Field(0.2, ge=0.0, le=1.0, description=(
        "The same limit over all of a service's calls in the run so far (since the last start or resume)."))


class SampleTables(StageConfig):
    """Tables of sample trajectories logged to MLflow while training (`pipeline.tracking.train_samples`)."""

    every: int = Field(1, ge=0, description="Log a table of sample trajectories to MLflow every N steps (0 = never).")
    trajectories: int = Field(4, ge=1, le=256, description="Trajectories per sample table.")


class TrainConfig(StageConfig):
    """The train stage: what trains (variant, weights, start and end), and a section per concern."""

    algorithm: LossConfig = Field(default_factory=DAPOLoss, description="Policy-gradient variant (a typed choice, resolved once).")
    finetune: FinetuneConfig = Field(default_factory=FullFinetune, description="Which weights train: all, or a LoRA adapter (a typed choice, resolved once).")
    init_model: str = Field("models/sft", min_length=1, description="Model directory RL starts from (the base or SFT model).")
    train_file: str = Field("data/curated/train.jsonl", min_length=1, description="Curated training problems.")
    steps: int = Field(4, ge=1, description="Training steps (one rollout batch each; update.ppo_epochs x update.ppo_mini_batches optimiser steps per batch).")
    output_dir: str = Field("models/policy", min_length=1, description="The final model, a Hugging Face directory.")
    sampling: SamplingSection = Field(default_factory=SamplingSection, description="The problems a step samples; dynamic sampling.")
    update: UpdateSection = Field(default_factory=UpdateSection, description="How a rollout batch trains the policy.")
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection, description="AdamW and its schedule.")
    checkpoints: CheckpointSection = Field(default_factory=CheckpointSection, description="Resumable checkpoints and resume.")
    outages: OutageLimits = Field(default_factory=OutageLimits, description="When tool outages stop the run.")
    sample_tables: SampleTables = Field(default_factory=SampleTables, description="Sample trajectories logged to MLflow.")

    @model_validator(mode="after")
    def _anchor_needs_kl_and_dropping(self) -> TrainConfig:
        if self.sampling.anchor_dropped_tokens and not (self.algorithm.kl_coef > 0 and self.algorithm.dynamic_sampling):
            raise ValueError("train.sampling.anchor_dropped_tokens > 0 needs train.algorithm.kl_coef > 0 and "
                             "train.algorithm.dynamic_sampling true (it anchors dropped groups with the KL term)")
        return self

    @model_validator(mode="after")
    def _refill_needs_dropping(self) -> TrainConfig:
        if self.sampling.refill_dropped_groups and not self.algorithm.dynamic_sampling:
            raise ValueError("train.sampling.refill_dropped_groups needs train.algorithm.dynamic_sampling true "
                             "(it replaces the groups dynamic sampling drops)")
        return self


# Where the keys of train's one flat section went when it was split by concern (a params file written before that
# is told, key by key, where each moved: pipeline.config reports them beside "unknown key")
MOVED_KEYS: dict[str, str] = {
    **{f"train.{k}": f"train.{section}.{k}" for section, model in (
        ("optimizer", OptimizerSection), ("update", UpdateSection), ("sampling", SamplingSection))
       for k in model.model_fields},
    "train.checkpoint_every": "train.checkpoints.every", "train.checkpoint_dir": "train.checkpoints.dir",
    "train.resume": "train.checkpoints.resume", "train.log_full_checkpoints": "train.checkpoints.log_full",
    "train.max_step_outage_share": "train.outages.max_step_share",
    "train.max_run_outage_share": "train.outages.max_run_share",
    "train.log_samples_every": "train.sample_tables.every", "train.log_samples": "train.sample_tables.trajectories",
}
