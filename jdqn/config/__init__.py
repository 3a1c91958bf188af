"""One frozen, validated configuration tree for a jdqn run.

Every section is a frozen dataclass validated at construction (``sections``); profiles are named
instances (``profiles``); only ``parse`` turns strings into values (for the CLI's ``--set``).
"""

from jdqn.config.parse import apply_overrides, config_from_dict
from jdqn.config.profiles import DEFAULT, PROFILES, SMOKETEST, profile
from jdqn.config.sections import (
    AccelConfig,
    Config,
    DataConfig,
    EnvConfig,
    LossConfig,
    NetworkConfig,
    OptimConfig,
    OutputConfig,
    ReplayConfig,
    TrainConfig,
    WalkForwardConfig,
)

__all__ = [
    "DEFAULT",
    "PROFILES",
    "SMOKETEST",
    "AccelConfig",
    "Config",
    "DataConfig",
    "EnvConfig",
    "LossConfig",
    "NetworkConfig",
    "OptimConfig",
    "OutputConfig",
    "ReplayConfig",
    "TrainConfig",
    "WalkForwardConfig",
    "apply_overrides",
    "config_from_dict",
    "profile",
]
