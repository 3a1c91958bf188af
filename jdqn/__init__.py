"""jdqn: a JAX/XLA trainer for a distributional (C51) DQN on ES 1-minute bars, judged walk-forward.

Public API (docs/design.md §1): ``Config`` and its profiles, ``make_learner`` (the one pure learner
step), ``make_train`` (epochs as scans), ``load_policy`` (a run's saved policies,
``jdqn.evaluation.policy``).
``jdqn.run.walkforward.run_walkforward`` runs all folds x seeds into a run directory; ``jdqn.data``,
``jdqn.evaluation.env``, ``jdqn.evaluation.rollouts`` hold the rest.

The learner and training names are imported on first use (PEP 562), so ``import jdqn`` and the
modules that need no JAX (``jdqn.config``, ``jdqn.run.report``) stay light: the plot processes of a
run (``jdqn.run.report.BackgroundWrites``) import only those. Importing jdqn changes nothing in
the process: ``jdqn.configure()`` sets jdqn's XLA flags (``jdqn.accel.xla_flags``), which the
``jdqn`` command and ``run_walkforward`` do themselves.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jdqn.config import DEFAULT, SMOKETEST, Config, apply_overrides, profile

if TYPE_CHECKING:
    from jdqn.accel.xla_flags import configure
    from jdqn.agent import Learner, LearnerMetrics, LearnerState, make_learner
    from jdqn.agent.train import TrainProgram, TrainState, make_train
    from jdqn.evaluation.policy import Policy, load_policy

# Public name -> the module that defines it, imported when the name is first read.
_LAZY = {
    "configure": "jdqn.accel.xla_flags",
    "Learner": "jdqn.agent",
    "LearnerMetrics": "jdqn.agent",
    "LearnerState": "jdqn.agent",
    "make_learner": "jdqn.agent",
    "Policy": "jdqn.evaluation.policy",
    "load_policy": "jdqn.evaluation.policy",
    "TrainProgram": "jdqn.agent.train",
    "TrainState": "jdqn.agent.train",
    "make_train": "jdqn.agent.train",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jdqn' has no attribute {name!r}")


__all__ = [
    "DEFAULT",
    "SMOKETEST",
    "Config",
    "Learner",
    "LearnerMetrics",
    "LearnerState",
    "Policy",
    "TrainProgram",
    "TrainState",
    "apply_overrides",
    "configure",
    "load_policy",
    "make_learner",
    "make_train",
    "profile",
]
