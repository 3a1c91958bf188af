"""n-step returns of the collected slices (Sutton & Barto, ch. 7; Hessel et al., AAAI 2018, use
n = 3 with C51), formed before insertion (docs/design.md §5, step 4).

The trainer keeps each slice's last ``n - 1`` one-step transitions (oldest first). Once bar
t+n-1 is stepped, the transition from bar t gets the discounted rewards of the behaviour policy's
``m = n`` steps and the state at bar t+m; a slice's last ``n - 1`` transitions are completed at
the epoch's last iteration with ``m`` the steps left. The stored ``done`` of the last step
decides whether the target bootstraps from bar t+m, as for one step. The one-step fields stay:
HER donors relabel the action at bar t, which changes every later position, so they stay
one-step (``jdqn.agent.batch``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.agent.transition import NStepReturn, Transition, example_transition


def gamma_powers(gamma: float, n: int) -> np.ndarray:
    """``[gamma^0, ..., gamma^n]`` computed in float64 and rounded once: ``[n + 1]`` float32
    (``gamma^1`` is exactly ``float32(gamma)``, the one-step discount)."""
    return (np.float64(gamma) ** np.arange(n + 1)).astype(np.float32)


def fold(window: Transition, positions: jax.Array, discounts: jax.Array) -> Transition:
    """The n-step transition from the first step of ``window``, one slice's consecutive one-step
    transitions (leaves ``[L, ...]``, oldest first): the discounted sum of the rewards up to the
    first ``done`` (inclusive) or the window's end, ``m`` those steps, the state after the last
    of them and its ``done``. The one-step fields are the first step's. ``discounts``:
    :func:`gamma_powers`, at least ``L`` of them."""
    length = window.reward.shape[0]
    # step k counts when no step before it ended the episode
    alive = jnp.cumprod(jnp.concatenate([jnp.ones((1,), jnp.float32), 1.0 - window.done[:-1]]))
    counted = alive > 0  # [L] bool
    powers = discounts[:length]  # [L] float32
    reward = jnp.sum(jnp.where(counted, powers * window.reward, 0.0))  # [] float32
    steps = jnp.sum(counted).astype(jnp.int32)  # [] int32, m
    last = steps - 1
    first = jax.tree.map(lambda leaf: leaf[0], window)
    return first._replace(
        n_step=NStepReturn(
            reward=reward,
            next_features=window.next_features[last],
            next_position=jnp.asarray(positions, jnp.float32)[window.action[last]],
            done=window.done[last],
            steps=steps,
        )
    )


def append(pending: Transition, transition: Transition) -> Transition:
    """The window ``[n, S, ...]``: the pending ``[n - 1, S, ...]`` steps, then this one
    ``[S, ...]``."""
    return jax.tree.map(lambda old, new: jnp.concatenate([old, new[None]]), pending, transition)


def pending_after(window: Transition) -> Transition:
    """The steps to keep for the next iteration: the window less its oldest. ``[n - 1, S, ...]``."""
    return jax.tree.map(lambda leaf: leaf[1:], window)


def init_pending(n_step: int, n_slices: int, n_features: int) -> Transition:
    """Zero pending steps ``[n - 1, S, ...]``; the trainer reads a step only once it has been
    stepped in the current epoch."""
    zeros = example_transition(n_features)
    return jax.tree.map(
        lambda leaf: jnp.zeros((n_step - 1, n_slices, *leaf.shape), leaf.dtype), zeros
    )


def completed(window: Transition, positions: jax.Array, discounts: jax.Array) -> Transition:
    """The n-step transitions from the window's oldest step, one per slice: ``[S, ...]``."""
    return jax.vmap(fold, in_axes=(1, None, None))(window, positions, discounts)


def flushed(
    window: Transition, positions: jax.Array, discounts: jax.Array, count: int
) -> Transition:
    """At the slices' end, the transitions from the window's last ``count`` steps (static), each
    with the steps left before the end: ``[count * S, ...]``, by bar, then slice."""
    n = window.reward.shape[0]
    tails = [
        completed(jax.tree.map(lambda leaf, j=j: leaf[j:], window), positions, discounts)
        for j in range(n - count, n)
    ]
    return jax.tree.map(lambda *leaves: jnp.concatenate(leaves), *tails)


def inserts_in_epoch(offset: int, n_step: int, iterations_per_epoch: int) -> int:
    """Transitions per slice inserted up to and including iteration ``offset`` (0-based) of an
    epoch: none while the first window fills, one per iteration from ``n_step - 1``, and the
    rest of the slice at its end."""
    if offset >= iterations_per_epoch - 1:
        return iterations_per_epoch
    return max(offset - n_step + 2, 0)
