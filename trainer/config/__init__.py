"""The typed experiment config: schema, YAML loading with overrides, key-path errors."""

from trainer.config.errors import ConfigError, ConfigProblem
from trainer.config.loading import (
    apply_override,
    dump_config,
    load_config,
    parse_yaml,
    validate_config,
)
from trainer.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    CriticConfig,
    EnvConfig,
    ExperimentConfig,
    ModelConfig,
    RewardFilterConfig,
    RolloutConfig,
    RunnerConfig,
)

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigProblem",
    "CriticConfig",
    "EnvConfig",
    "ExperimentConfig",
    "ModelConfig",
    "RewardFilterConfig",
    "RolloutConfig",
    "RunnerConfig",
    "apply_override",
    "dump_config",
    "load_config",
    "parse_yaml",
    "validate_config",
]
