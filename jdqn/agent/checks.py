"""The learner step's debug-mode value checks at its component boundaries (docs/design.md,
section 9): each names the component and tensor; with debug off they are no-ops
(``jdqn.agent.debug.boundaries``)."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jdqn.agent import losses
from jdqn.agent.batch import Batch
from jdqn.agent.state import LearnerState


def check_state(checks: Any, state: LearnerState, schedule: jax.Array, clocked: bool) -> None:
    """Debug: the stored parameters are finite, and a given clock is the own step counter."""
    checks.finite("learner_state", "params", state.params)
    checks.finite("learner_state", "target_params", state.target_params)
    if clocked:
        offset = (state.step - schedule).astype(jnp.float32)
        checks.within("learner_state", "step_minus_clock", offset, 0.0, 0.0)


def check_batch(checks: Any, batch: Batch) -> None:
    checks.within("replay", "is_weights", batch.is_weights, 0.0, 1.0)
    checks.finite("batch", "observation", batch.obs)
    checks.finite("batch", "next_observation", batch.next_obs)
    checks.finite("batch", "reward", batch.reward)
    checks.finite("batch", "price_change", batch.transitions.price_change)


def _q_range(net: Any) -> tuple[float, float]:
    """Q's range, with slack for float32 rounding of sum_i p_i z_i (p sums to 1 within 1e-6)."""
    slack = 1e-4 * (net.v_max - net.v_min)
    return net.v_min - slack, net.v_max + slack


def check_target(checks: Any, target: losses.TdTarget, net: Any) -> None:
    low, high = _q_range(net)
    checks.within("online_network", "q_next", target.q_next, low, high)
    checks.within("target_network", "q_star", target.q_star, low, high)
    checks.distribution("projection", "projected_target", target.projected, 1e-4)
    checks.distribution("label_smoothing", "target", target.distribution, 1e-4)
    checks.within("scalar_target", "y", target.y, net.v_min, net.v_max)


def check_online(
    checks: Any, loss_values: jax.Array, online: losses.OnlinePass, parts: tuple[str, ...], net: Any
) -> None:
    checks.within("online_network", "log_probs", online.log_probs, -math.inf, 0.0)
    checks.within("online_network", "q", online.q, *_q_range(net))
    for i, name in enumerate(parts):
        checks.finite("loss", f"loss_{name}", loss_values[i])
