"""The learner: named state (``state``) and the one pure, jit-compiled step (``step``)."""

from jdqn.learner.state import (
    GUARD_REASONS,
    GuardRecord,
    Learner,
    LearnerMetrics,
    LearnerState,
)
from jdqn.learner.step import make_learner

__all__ = [
    "GUARD_REASONS",
    "GuardRecord",
    "Learner",
    "LearnerMetrics",
    "LearnerState",
    "make_learner",
]
