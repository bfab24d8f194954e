"""The typed experiment config: schema, YAML loading with overrides, key-path errors.

`YamlLimits` (from `trainer.bounded_yaml`) are the bounds on any YAML from users."""

from trainer.bounded_yaml import UNSTORABLE, YamlLimits, unstorable_message
from trainer.config.errors import ConfigError, ConfigIssue
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
    "UNSTORABLE",
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigIssue",
    "CriticConfig",
    "EnvConfig",
    "ExperimentConfig",
    "ModelConfig",
    "RewardFilterConfig",
    "RolloutConfig",
    "RunnerConfig",
    "YamlLimits",
    "apply_override",
    "dump_config",
    "load_config",
    "parse_yaml",
    "unstorable_message",
    "validate_config",
]
