"""The transition record shared by the environment, the replay buffer, donors and the learner."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class NStepReturn(NamedTuple):
    """What the target of a stored transition bootstraps from when ``loss.n_step`` > 1
    (Sutton & Barto, ch. 7): the discounted rewards of the ``m`` steps from bar t, with
    ``m = n_step`` or fewer where the slice ends first, and the state at bar t+m."""

    reward: jax.Array  # [] float32, sum_{k<m} gamma^k r_(t+k)
    next_features: jax.Array  # [F] float32, features at bar t+m
    next_position: jax.Array  # [] float32, position the behaviour policy held at bar t+m
    done: jax.Array  # [] float32, 1.0 when there is no bootstrap from bar t+m
    steps: jax.Array  # [] int32, m in [1, n_step]; the target's discount is gamma^m (1 - done)


class Transition(NamedTuple):
    """One environment step of one slice. Leaves gain leading batch axes ([B, ...], [C, ...]).

    The observation at bar t is ``concat(features[t], position_held)``. The price change and the
    position held before acting let HER donors recompute every other action's reward (no market
    impact). ``n_step`` is ``None`` at ``loss.n_step=1``, else the n-step return the target uses
    (``jdqn.agent.nstep``).
    """

    features: jax.Array  # [F] float32, features at bar t (computed from bars <= t)
    position: jax.Array  # [] float32, position held before acting (contracts)
    action: jax.Array  # [] int32, index into the position grid
    reward: jax.Array  # [] float32, reward_scale * (pnl - cost), index points
    next_features: jax.Array  # [F] float32, features at bar t+1
    price_change: jax.Array  # [] float32, close[t+1] - close[t], index points
    done: jax.Array  # [] float32, 1.0 when bar t+1 ends the slice (no bootstrap)
    n_step: NStepReturn | None = None


def observation(features: jax.Array, position: jax.Array) -> jax.Array:
    """Network input: features with the held position appended. [..., F] , [...] -> [..., F+1]."""
    return jnp.concatenate([features, position[..., None].astype(features.dtype)], axis=-1)


def example_transition(n_features: int, n_step: int = 1) -> Transition:
    """A zero transition with the right shapes and dtypes (for buffer initialisation)."""
    n_step_return = None
    if n_step > 1:
        n_step_return = NStepReturn(
            reward=jnp.zeros((), jnp.float32),
            next_features=jnp.zeros((n_features,), jnp.float32),
            next_position=jnp.zeros((), jnp.float32),
            done=jnp.zeros((), jnp.float32),
            steps=jnp.ones((), jnp.int32),
        )
    return Transition(
        features=jnp.zeros((n_features,), jnp.float32),
        position=jnp.zeros((), jnp.float32),
        action=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        next_features=jnp.zeros((n_features,), jnp.float32),
        price_change=jnp.zeros((), jnp.float32),
        done=jnp.zeros((), jnp.float32),
        n_step=n_step_return,
    )
