"""Hindsight donor transitions for trading (docs/design.md §5, step 2).

Hindsight Experience Replay (Andrychowicz et al., NeurIPS 2017) relabels stored transitions with
outcomes that were not pursued. In trading the relabelling is exact: one contract has no market
impact, so every other target position at the same bar earns the environment's reward
(``jdqn.evaluation.env.step``), known from the stored price change and the position held before
acting.
A donor is a copy of a sampled transition with another action and its reward; its next state
holds ``positions[action]`` (the learner builds it from ``next_features``). Donors carry IS
weight 1 and never write priorities.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdqn.agent.transition import Transition
from jdqn.evaluation.env import training_reward

DONOR_MODES = ("none", "best", "all")


def n_donors_for(batch_size: int, donor_fraction: float, mode: str, n_actions: int) -> int:
    """Static donor count: ``round(donor_fraction * batch_size)`` (halves to even), capped at
    ``batch_size`` rows; 0 for ``"none"``. ``"all"`` (``n_actions - 1`` donors per row) rounds
    DOWN to a multiple of ``n_actions - 1``, so donors stay within ``donor_fraction``.
    """
    _check_mode(mode)
    if batch_size < 0 or donor_fraction < 0 or n_actions < 2:
        raise ValueError(
            f"n_donors_for: need batch_size >= 0, donor_fraction >= 0, n_actions >= 2; got "
            f"{batch_size}, {donor_fraction}, {n_actions}"
        )
    if mode == "none":
        return 0
    wanted = int(round(donor_fraction * batch_size))
    if mode == "best":
        return min(wanted, batch_size)
    per_row = n_actions - 1
    return (min(wanted, batch_size * per_row) // per_row) * per_row


def donor_rewards(
    batch: Transition,
    positions: jax.Array,
    cost_points: float,
    reward_scale: float,
    hold_penalty: float | jax.Array,
    cost_scale: float | jax.Array = 1.0,
) -> jax.Array:
    """Reward of every action at each transition's bar, the environment's training reward with
    its hold charge and cost scale: ``[B, A]`` float32 (exact, no impact)."""
    positions = jnp.asarray(positions, jnp.float32)  # [A]
    price_change = jnp.asarray(batch.price_change, jnp.float32)[:, None]  # [B, 1]
    held = jnp.asarray(batch.position, jnp.float32)[:, None]  # [B, 1]
    pnl = positions[None, :] * price_change  # [B, A] index points
    cost = cost_points * jnp.abs(positions[None, :] - held)  # [B, A] index points
    reward = training_reward(pnl, cost, positions[None, :], reward_scale, hold_penalty, cost_scale)
    return reward.astype(jnp.float32)


def make_donors(
    key: jax.Array,
    batch: Transition,
    positions: jax.Array,
    cost_points: float,
    reward_scale: float,
    hold_penalty: float | jax.Array,
    mode: str,
    n_donors: int,
    cost_scale: float | jax.Array = 1.0,
) -> Transition:
    """``n_donors`` (static, from :func:`n_donors_for`) hindsight donors from ``batch``
    (leaves ``[B, ...]``); only action and reward differ from the copied rows.

    Rows are drawn uniformly WITHOUT replacement (the sampler's strata are sorted by buffer
    position, so "first rows" would be biased). ``"best"``: per row the untaken action of
    highest immediate reward (ties -> lowest index). ``"all"``: every untaken action, a row's
    donors consecutive in action order. ``"none"`` or 0 donors: an empty Transition.
    """
    _check_mode(mode)
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    n_actions = jnp.shape(positions)[0]
    if mode == "none" or n_donors == 0:
        return jax.tree.map(lambda leaf: leaf[:0], batch)
    per_row = 1 if mode == "best" else n_actions - 1
    if n_donors < 0 or n_donors % per_row or n_donors // per_row > batch_size:
        raise ValueError(
            f"make_donors: mode {mode!r} with batch {batch_size} and {n_actions} actions needs "
            f"n_donors a multiple of {per_row} and at most {batch_size * per_row}; got "
            f"{n_donors}. Use n_donors_for(...)."
        )
    n_rows = n_donors // per_row
    rows = jax.random.permutation(key, batch_size)[:n_rows]  # [R] int32, distinct
    chosen = jax.tree.map(lambda leaf: leaf[rows], batch)  # leaves [R, ...]
    charges = (cost_points, reward_scale, hold_penalty, cost_scale)
    rewards = donor_rewards(chosen, positions, *charges)  # [R, A]
    taken = jnp.asarray(chosen.action, jnp.int32)  # [R]

    if mode == "best":
        others = jnp.arange(n_actions)[None, :] != taken[:, None]  # [R, A] bool
        action = jnp.argmax(jnp.where(others, rewards, -jnp.inf), axis=1).astype(jnp.int32)
        reward = jnp.take_along_axis(rewards, action[:, None], axis=1)[:, 0]  # [R]
        return chosen._replace(action=action, reward=reward)

    # "all": the k-th other action of a row is k, shifted past the taken one.
    k = jnp.arange(n_actions - 1, dtype=jnp.int32)[None, :]  # [1, A-1]
    action = k + (k >= taken[:, None]).astype(jnp.int32)  # [R, A-1] int32
    reward = jnp.take_along_axis(rewards, action, axis=1)  # [R, A-1] float32
    repeated = jax.tree.map(lambda leaf: jnp.repeat(leaf, per_row, axis=0), chosen)
    return repeated._replace(action=action.reshape(-1), reward=reward.reshape(-1))


def _check_mode(mode: str) -> None:
    if mode not in DONOR_MODES:
        raise ValueError(f"donor mode {mode!r}: use one of {DONOR_MODES}")
