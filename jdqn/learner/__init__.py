"""The learner: named state (``state``) and the one pure, jit-compiled step (``step``)."""

from jdqn.learner.state import (
    GUARD_REASONS,
    LEARNER_METRICS_RECORD,
    GuardRecord,
    Learner,
    LearnerMetrics,
    LearnerState,
    pack_metrics,
    unpack_metrics,
)
from jdqn.learner.step import make_learner

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
