"""Every stage's config class, gathered for `RunConfig`. Each lives in its own module."""

from pipeline.config.curate import CurateConfig
from pipeline.config.distributed import DistributedConfig
from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.model import ModelConfig
from pipeline.config.reward import RewardConfig
from pipeline.config.rollout import RolloutConfig
from pipeline.config.run import RunSection
from pipeline.config.sandbox import SandboxConfig
from pipeline.config.search import SearchConfig
from pipeline.config.sft import SFTConfig
from pipeline.config.train import TrainConfig

__all__ = [
    "CurateConfig",
    "DistributedConfig",
    "EvaluateConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunSection",
    "SandboxConfig",
    "SearchConfig",
    "SFTConfig",
    "TrainConfig",
]
