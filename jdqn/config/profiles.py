"""Named profiles: ``smoketest`` (the CI-sized run) and ``default``."""

from __future__ import annotations

from jdqn.config.sections import (
    Config,
    DataConfig,
    LossConfig,
    NetworkConfig,
    ReplayConfig,
    TrainConfig,
    WalkForwardConfig,
)

SMOKETEST = Config(
    data=DataConfig(),
    network=NetworkConfig(hidden=(64, 64), n_atoms=51, v_min=-240.0, v_max=240.0),
    loss=LossConfig(alpha_schedule=(0.0, 0.2)),
    replay=ReplayConfig(capacity=256),
    train=TrainConfig(n_slices=64, batch_size=64, epochs=2),
    walkforward=WalkForwardConfig(n_folds=3),
)

DEFAULT = Config(
    network=NetworkConfig(hidden=(256, 256), n_atoms=51),
    loss=LossConfig(alpha_schedule=(0.0, 0.2, 0.5, 0.5)),
    replay=ReplayConfig(capacity=100_000),
    train=TrainConfig(n_slices=64, batch_size=256, epochs=4, updates_per_iteration=1),
    walkforward=WalkForwardConfig(n_folds=3),
)

PROFILES: dict[str, Config] = {"smoketest": SMOKETEST, "default": DEFAULT}


def profile(name: str) -> Config:
    """Named profile; unknown names raise with the list of valid ones."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; valid profiles: {sorted(PROFILES)}")
    return PROFILES[name]
