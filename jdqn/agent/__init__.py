"""The agent: the learner's math (networks, losses, surgery, replay, donors, n-step returns, the
dense stack), its named state (``state``), the one pure, jit-compiled step (``step``) and the
program that trains it (``train``: epochs as scans).

The step's names are imported on first use (PEP 562), so importing one of the math modules (which
the speed seam, ``jdqn.accel``, does) does not import the step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jdqn.agent.state import (
        GUARD_REASONS,
        LEARNER_METRICS_RECORD,
        GuardRecord,
        Learner,
        LearnerMetrics,
        LearnerState,
        pack_metrics,
        unpack_metrics,
    )
    from jdqn.agent.step import make_learner


def __getattr__(name: str) -> Any:
    if name == "make_learner":
        return importlib.import_module("jdqn.agent.step").make_learner
    if name in __all__:  # the others are the state module's
        return getattr(importlib.import_module("jdqn.agent.state"), name)
    raise AttributeError(f"module 'jdqn.agent' has no attribute {name!r}")


__all__ = [
    "GUARD_REASONS",
    "LEARNER_METRICS_RECORD",
    "GuardRecord",
    "Learner",
    "LearnerMetrics",
    "LearnerState",
    "make_learner",
    "pack_metrics",
    "unpack_metrics",
]
