"""Hindsight donor transitions for trading (docs/design.md §5, step 2).

Hindsight Experience Replay (Andrychowicz et al., NeurIPS 2017) relabels stored transitions with
outcomes that were not pursued. In trading the relabelling is exact rather than a goal
substitution: one contract has no market impact, so at the same bar every other target position
earns a reward known from the stored price change and the position held before acting,

    reward(a) = reward_scale * (positions[a] * price_change
                                - cost_points * |positions[a] - position|)

which is the environment's reward (``jdqn.env.step``) for that bar, position and action. A donor
is a copy of a sampled transition with another action, that action's reward, and the next state
that action leads to: the same ``next_features`` with ``positions[action]`` held (the learner
builds the next observation as ``observation(next_features, positions[action])``; the
``position`` field stays the position held before acting). Donors carry IS weight 1 and never
write priorities; that is the learner's job.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdqn.transition import Transition

DONOR_MODES = ("none", "best", "all")


def n_donors_for(batch_size: int, donor_fraction: float, mode: str, n_actions: int) -> int:
    """Static donor count for a batch: ``int(round(donor_fraction * batch_size))``, then capped.

    ``"none"`` -> 0. ``"best"`` (one donor per chosen row) -> at most ``batch_size``. ``"all"``
    (every other action of a chosen row, ``n_actions - 1`` donors per row) -> at most
    ``batch_size * (n_actions - 1)``, rounded DOWN to a multiple of ``n_actions - 1`` so the
    donors stay "up to donor_fraction of the batch". Python's ``round`` rounds halves to even.
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
    batch: Transition, positions: jax.Array, cost_points: float, reward_scale: float
) -> jax.Array:
    """Reward of every action at each transition's bar: ``[B, A]`` float32 (exact, no impact)."""
    positions = jnp.asarray(positions, jnp.float32)  # [A]
    price_change = jnp.asarray(batch.price_change, jnp.float32)[:, None]  # [B, 1]
    held = jnp.asarray(batch.position, jnp.float32)[:, None]  # [B, 1]
    pnl = positions[None, :] * price_change  # [B, A] index points
    cost = cost_points * jnp.abs(positions[None, :] - held)  # [B, A] index points
    return (reward_scale * (pnl - cost)).astype(jnp.float32)


def make_donors(
    key: jax.Array,
    batch: Transition,
    positions: jax.Array,
    cost_points: float,
    reward_scale: float,
    mode: str,
    n_donors: int,
) -> Transition:
    """``n_donors`` (static) hindsight donors from ``batch`` (leaves ``[B, ...]``).

    Rows are drawn uniformly WITHOUT replacement by ``key`` (a fixed "first rows" rule would tie
    donors to the sampler's stratum order, which is sorted by buffer position).

    - ``"best"``: one donor per chosen row (``n_donors <= B`` rows), with the action of highest
      immediate reward among the actions NOT taken (ties -> lowest action index).
    - ``"all"``: every action other than the one taken, for ``n_donors / (A - 1)`` rows
      (``n_donors`` must be a multiple of ``A - 1``); donors of one row are consecutive, in
      increasing action order.
    - ``"none"`` or ``n_donors == 0``: an empty Transition (leading dim 0).

    Features, position (held before acting), next_features, price_change and done are copied;
    action and reward are replaced. Use :func:`n_donors_for` to get a valid ``n_donors``.
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
    rewards = donor_rewards(chosen, positions, cost_points, reward_scale)  # [R, A]
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
