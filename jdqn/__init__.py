"""jdqn: a JAX/XLA trainer for a distributional (C51) DQN on ES 1-minute bars, judged walk-forward.

Public API (see DESIGN section 1): ``Config`` and its profiles, ``make_learner`` (the one pure
learner step), ``make_train`` (epochs as scans), ``run_walkforward`` (all folds x seeds to a run
directory). Submodules hold the rest: ``jdqn.data``, ``jdqn.env``, ``jdqn.evaluate``, ...
"""

from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides, profile
from jdqn.learner import Learner, LearnerMetrics, LearnerState, make_learner
from jdqn.train import TrainProgram, TrainState, make_train
from jdqn.walkforward import WalkForwardOutcome, run_walkforward

__all__ = [
    "DEFAULT",
    "SMOKETEST",
    "Config",
    "Learner",
    "LearnerMetrics",
    "LearnerState",
    "TrainProgram",
    "TrainState",
    "WalkForwardOutcome",
    "apply_overrides",
    "make_learner",
    "make_train",
    "profile",
    "run_walkforward",
]
