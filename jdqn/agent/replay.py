"""Proportional prioritized experience replay on device (Schaul et al., ICLR 2016).

Pure, jit-able and vmappable functions over a named :class:`ReplayState`: :func:`replay_init`,
:func:`replay_add` (ring insert at the running max priority), :func:`replay_sample` (stratified
proportional sampling with importance-sampling weights) and :func:`replay_update`.

Sampling without a sum tree: one dense pass over the priorities suits GPUs better than pointer
chasing (and a tree would need rebuilding whenever alpha changes). A float32 prefix sum over
1,000,000 slots resolves a slot's probability only to about ``C * 2**-24`` of itself, so the
search has two levels: the block of ``~sqrt(C)`` slots (a power of two) from the prefix sums of
the block masses (stratified: one uniform draw in each of ``B`` equal segments of the total),
then the slot from the prefix sums of that block alone, with a fresh draw. In exact arithmetic
slot ``i`` is drawn with probability ``p_i^alpha / sum_j p_j^alpha``; safety does not depend on
rounding (:func:`_first_positive_above`). ``replay_sample`` costs one O(C) pass plus
O(B sqrt(C)); ``replay_update`` is O(B); ``python -m benchmarks.replay`` times them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jdqn.agent.transition import Transition


class ReplayState(NamedTuple):
    """Ring buffer of transitions with one raw priority per slot."""

    transitions: Transition  # leaves [C, ...]
    priorities: jax.Array  # [C] float32, raw priority p (0 = never written)
    next_index: jax.Array  # [] int32 ring write position
    size: jax.Array  # [] int32 slots written (written slots are exactly [0, size))
    max_priority: jax.Array  # [] float32, running max of priorities ever written
    inserted: jax.Array  # [] int32, transitions ever inserted (identifies each slot's occupant)


def replay_init(capacity: int, example: Transition) -> ReplayState:
    """Empty buffer of ``capacity`` slots shaped like ``example`` (see ``example_transition``)."""
    if capacity < 1:
        raise ValueError(f"replay_init: capacity must be >= 1; got {capacity}")
    transitions = jax.tree.map(
        lambda leaf: jnp.zeros((capacity, *jnp.shape(leaf)), jnp.asarray(leaf).dtype), example
    )
    return ReplayState(
        transitions=transitions,
        priorities=jnp.zeros((capacity,), jnp.float32),
        next_index=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        # Schaul et al. start new transitions at p = 1 before any TD error is known.
        max_priority=jnp.ones((), jnp.float32),
        inserted=jnp.zeros((), jnp.int32),
    )


def _capacity(state: ReplayState) -> int:
    return state.priorities.shape[-1]


def replay_add(state: ReplayState, batch: Transition) -> ReplayState:
    """Ring-insert ``n`` transitions (leaves ``[n, ...]``) at the current max priority.

    ``n`` is static and at most capacity, so the written slots are distinct; overwritten slots
    lose their old priority. Writes start at slot 0, so the written slots are ``[0, size)``.
    """
    capacity = _capacity(state)
    leaves = jax.tree.leaves(batch)
    n = leaves[0].shape[0]
    for buffer_leaf, leaf in zip(jax.tree.leaves(state.transitions), leaves, strict=True):
        if leaf.shape[0] != n or leaf.shape[1:] != buffer_leaf.shape[1:]:
            raise ValueError(
                f"replay_add: every leaf needs shape [n={n}, *{buffer_leaf.shape[1:]}]; got "
                f"{leaf.shape}. Pass a Transition with one leading batch axis."
            )
    if n > capacity:
        raise ValueError(
            f"replay_add: {n} transitions do not fit a buffer of capacity {capacity}; "
            "add in chunks of at most capacity rows or raise replay.capacity"
        )
    if n == 0:
        return state
    slots = (state.next_index + jnp.arange(n, dtype=jnp.int32)) % capacity  # [n] int32, distinct
    transitions = jax.tree.map(
        lambda buffer_leaf, leaf: buffer_leaf.at[slots].set(leaf.astype(buffer_leaf.dtype)),
        state.transitions,
        batch,
    )
    priorities = state.priorities.at[slots].set(state.max_priority)
    return ReplayState(
        transitions=transitions,
        priorities=priorities,
        next_index=((state.next_index + n) % capacity).astype(jnp.int32),
        size=jnp.minimum(state.size + n, capacity).astype(jnp.int32),
        max_priority=state.max_priority,
        inserted=(state.inserted + n).astype(jnp.int32),
    )


def replay_serials(state: ReplayState, indices: jax.Array) -> jax.Array:
    """Insertion serial of the transition now in each written slot, [B] int32: the last ``s``
    with ``s % C == i`` and ``s < inserted``. Unlike the slot it is new for every transition, so
    randomness keyed on it (bootstrap masks) is fresh when a slot is overwritten."""
    capacity = _capacity(state)
    indices = jnp.asarray(indices, jnp.int32)
    return (indices + capacity * ((state.inserted - 1 - indices) // capacity)).astype(jnp.int32)


def _block_size(capacity: int) -> int:
    """Smallest power of two >= sqrt(capacity) (16 for 256, 1024 for 1,000,000)."""
    half_log2 = ((capacity - 1).bit_length() + 1) // 2  # ceil(ceil(log2 C) / 2)
    return 1 << half_log2


def _prefix_top(mass: jax.Array, cumulative: jax.Array) -> jax.Array:
    """Largest prefix sum at a positive-mass entry (0 if none): the top a draw must stay below."""
    return jnp.max(jnp.where(mass > 0, cumulative, 0.0), axis=-1)


def _first_positive_above(mass: jax.Array, cumulative: jax.Array, position: jax.Array) -> jax.Array:
    """Smallest ``i`` with ``mass[i] > 0`` and ``cumulative[i] > position``; int32.

    ``mass``/``cumulative`` are ``[n]`` (shared) or ``[B, n]`` (one row per draw), ``position``
    ``[B]``. With exact prefix sums this is ``searchsorted(c, position, side='right')``, but
    ``jnp.cumsum`` is evaluated as a parallel tree, so in float32 a zero-mass slot can sit on a
    strict increase (or the sums decrease): hence the explicit zero-mass test. The caller clamps
    ``position`` strictly below ``top = max{c[k] : mass[k] > 0}`` (:func:`_prefix_top`,
    :func:`_below`), so the ``k`` attaining ``top`` is a hit: the result always has positive
    mass. Rounding can at worst make a tiny mass unreachable, never a zero-mass (or unwritten,
    NaN) slot reachable. O(B n) branch-free compares, cheap for n ~ sqrt(C).
    """
    if mass.ndim == 1:
        mass, cumulative = mass[None, :], cumulative[None, :]
    hit = (mass > 0) & (cumulative > position[:, None])  # [B, n] bool
    # The first hit as a min over the hits' indices, not argmax: XLA's argmax is a (value,
    # index) reduction, several times slower than a min at many vmapped learners on the GPU.
    # No hit (an empty buffer) gives 0, as argmax does.
    n = hit.shape[-1]
    first = jnp.min(jnp.where(hit, jnp.arange(n, dtype=jnp.int32), n), axis=-1)
    return jnp.where(first < n, first, 0).astype(jnp.int32)


def _below(x: jax.Array, limit: jax.Array) -> jax.Array:
    """Clamp ``x`` strictly below ``limit`` (> 0): float32 products can round up onto it."""
    return jnp.minimum(x, jnp.nextafter(limit, jnp.zeros_like(limit)))


def _sample_with_uniforms(
    state: ReplayState,
    block_uniforms: jax.Array,  # [B] float32 in [0, 1), one per stratum
    slot_uniforms: jax.Array,  # [B] float32 in [0, 1), one per draw inside the chosen block
    alpha: float | jax.Array,
    beta: float | jax.Array,
) -> tuple[jax.Array, Transition, jax.Array]:
    """:func:`replay_sample` with the uniform draws given (tests drive the extremes)."""
    capacity = _capacity(state)
    batch_size = block_uniforms.shape[0]
    block = _block_size(capacity)
    n_blocks = -(-capacity // block)

    priorities = state.priorities
    written = priorities > 0  # [C] bool; unwritten slots are exactly 0, NaN counts as 0
    log_p = jnp.log(jnp.where(written, priorities, 1.0))  # [C] float32
    # exp(alpha log p) is p^alpha (cheaper than pow on CPU); where() keeps unwritten slots at
    # exactly 0, where 0**0 == 1 would make them sampleable for alpha == 0.
    mass = jnp.where(written, jnp.exp(alpha * log_p), 0.0).astype(jnp.float32)  # [C]
    mass_blocks = jnp.pad(mass, (0, n_blocks * block - capacity)).reshape(n_blocks, block)

    block_mass = mass_blocks.sum(axis=1)  # [n_blocks] > 0 iff the block has a positive slot
    block_cumulative = jnp.cumsum(block_mass)  # [n_blocks]
    total = _prefix_top(block_mass, block_cumulative)  # [] float32, ~ sum_j p_j^alpha
    # Stratified: segment k of the total mass is [k, k+1) * total / B.
    strata = jnp.arange(batch_size, dtype=jnp.float32)
    block_position = _below((strata + block_uniforms) * (total / batch_size), total)  # [B]
    chosen_block = _first_positive_above(block_mass, block_cumulative, block_position)  # [B]

    rows = mass_blocks[chosen_block]  # [B, block] float32, each with a positive entry
    row_cumulative = jnp.cumsum(rows, axis=-1)  # [B, block]
    row_top = _prefix_top(rows, row_cumulative)  # [B] > 0
    slot_position = _below(slot_uniforms * row_top, row_top)  # [B]
    in_block = _first_positive_above(rows, row_cumulative, slot_position)  # [B] int32
    # Padding slots have zero mass and are never chosen, so the index is always < capacity.
    indices = (chosen_block * block + in_block).astype(jnp.int32)  # [B]

    # w_i = (N P(i))^-beta / max_j w_j = (P(i) / min_j P(j))^-beta over the batch; N and the
    # total cancel, and in log space nothing overflows even for wildly different priorities.
    # The difference is taken on log p itself: subtracting from a product (alpha * log p) lets XLA
    # contract it into an FMA whose rounding residual makes the top weight 0.9999999, not 1.
    log_p_drawn = log_p[indices]  # [B] float32
    log_weights = -(alpha * beta) * (log_p_drawn - jnp.min(log_p_drawn))  # [B] <= 0
    # An empty buffer (total == 0) has nothing to sample: weight 0 so nothing is learnt from it.
    is_weights = jnp.where(total > 0, jnp.exp(log_weights), 0.0).astype(jnp.float32)
    batch = jax.tree.map(lambda leaf: leaf[indices], state.transitions)
    return indices, batch, is_weights


def replay_sample(
    state: ReplayState,
    key: jax.Array,
    batch_size: int,
    alpha: float | jax.Array,
    beta: float | jax.Array,
) -> tuple[jax.Array, Transition, jax.Array]:
    """Stratified proportional sample: ``(indices [B] int32, batch [B, ...], is_weights [B])``.

    ``P(i) = p_i^alpha / sum_j p_j^alpha``; ``w_i = (size * P(i))^-beta / max_j w_j`` with the max
    over the batch (Schaul et al. 2016, Algorithm 1), in (0, 1]. Never returns an unwritten or
    zero-priority slot; an empty buffer gives slot 0 with weight 0. Needs ``sum p^alpha`` below
    float32's max, which :func:`replay_update`'s ``priority_max`` guarantees.
    """
    block_key, slot_key = jax.random.split(key)
    block_uniforms = jax.random.uniform(block_key, (batch_size,), jnp.float32)
    slot_uniforms = jax.random.uniform(slot_key, (batch_size,), jnp.float32)
    return _sample_with_uniforms(state, block_uniforms, slot_uniforms, alpha, beta)


def replay_update(
    state: ReplayState,
    indices: jax.Array,
    priorities: jax.Array,
    valid: jax.Array | None,
    priority_eps: float,
    priority_max: float,
) -> ReplayState:
    """Write ``p = clip(nan_to_num(priorities) + eps, eps, priority_max)`` at ``indices``
    (Schaul et al., ICLR 2016: TD errors plus eps; NaN -> eps, +inf -> ``priority_max``).

    Rows with ``valid [B] bool`` False (HER donors) and indices outside ``[0, size)`` never
    write, so an unwritten slot never becomes sampleable. A duplicated index keeps the LARGEST
    of its new priorities (deterministic, order-free). ``max_priority`` takes the max of itself
    and the written priorities.
    """
    capacity = _capacity(state)
    indices = jnp.asarray(indices, jnp.int32)
    valid = jnp.ones(indices.shape, bool) if valid is None else jnp.asarray(valid, bool)
    valid = valid & (indices >= 0) & (indices < state.size)  # [B] bool
    new_priorities = jnp.clip(
        jnp.nan_to_num(jnp.asarray(priorities, jnp.float32), nan=0.0) + priority_eps,
        priority_eps,
        priority_max,
    ).astype(jnp.float32)  # [B]
    # Invalid rows point past the end and are dropped by the scatter.
    targets = jnp.where(valid, indices, capacity)  # [B] int32
    # Two scatters make duplicates deterministic: reset each target slot, then keep the max of
    # its new values (scatter-set with duplicate indices has an unspecified winner).
    cleared = state.priorities.at[targets].set(0.0, mode="drop")
    updated = cleared.at[targets].max(new_priorities, mode="drop")
    written_max = jnp.max(jnp.where(valid, new_priorities, 0.0), initial=0.0)
    return state._replace(
        priorities=updated,
        max_priority=jnp.maximum(state.max_priority, written_max).astype(jnp.float32),
    )
