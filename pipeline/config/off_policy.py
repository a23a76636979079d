"""The off-policy loss of the asynchronous mode: decoupled PPO (pipeline.rl.off_policy says why this one).

A variant like `pipeline.config.train`'s losses (`kind` selects it), kept in its own module until the asynchronous
mode is wired into `train.algorithm`; it is not part of `LossConfig` yet, so no params file can select it."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from pipeline.config.base import StageConfig
from pipeline.config.train import FILTER_METRIC_HELP, KL_HELP, FilterMetric


class DecoupledPPOLoss(StageConfig):
    """Decoupled PPO (AReaL): DAPO's token-level clipped surrogate around the proximal policy (the trainer's
    log-probs at the start of the step), each token weighted by min(pi_prox / pi_behaviour, behaviour_weight_cap)."""

    display_name: ClassVar[str] = "decoupled PPO"
    kind: Literal["decoupled_ppo"] = "decoupled_ppo"
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range of pi_theta / pi_prox.")
    eps_high: float = Field(0.28, ge=0.0, le=1.0, description="Upper clip range of pi_theta / pi_prox (clip-higher).")
    dual_clip: float = Field(10.0, gt=1.0, description="Dual-clip bound c for negative advantages.")
    behaviour_weight_cap: float = Field(5.0, gt=1.0, le=100.0, description=(
        "Truncation of the behaviour-to-proximal importance weight pi_prox / pi_behaviour (AReaL's "
        "behav_imp_weight_cap; AReaL masks the tokens above it, we truncate them to it)."))
    dynamic_sampling: bool = Field(True, description="Drop the groups filter_metric finds uninformative and sample more.")
    filter_metric: FilterMetric = Field("accuracy", description=FILTER_METRIC_HELP)
    kl_coef: float = Field(0.0, ge=0.0, le=10.0, description=KL_HELP)
