"""Proportional prioritized experience replay on device (Schaul et al., ICLR 2016).

Four pure functions over a named :class:`ReplayState`: :func:`replay_init`, :func:`replay_add`
(ring insert at the running max priority), :func:`replay_sample` (stratified proportional
sampling with importance-sampling weights) and :func:`replay_update` (new priorities for the
sampled rows). All are jit-able and vmappable over a leading seed/fold axis; no Python branching
on traced values.

Sampling without a sum tree. GPUs and XLA prefer one dense pass over the priorities to a
pointer-chasing tree (and a sum tree would have to be rebuilt whenever alpha changes), so each
sample recomputes prefix sums. A single float32 prefix sum over 1,000,000 slots resolves a slot's
probability only to about ``C * 2**-24`` of itself (+-6%), so the search has two levels: slots are
cut into blocks of ``~sqrt(C)`` (a power of two); the block is chosen from the prefix sums of the
block masses (stratified: ``B`` equal segments of the total mass, one uniform draw per segment),
then the slot inside the block from the prefix sums of that block alone, with a fresh uniform
draw (sums of at most ``sqrt(C)`` terms: relative resolution ``~sqrt(C) * 2**-24``). In exact
arithmetic the marginal probability of slot ``i`` is ``p_i^alpha / sum_j p_j^alpha``. Safety does
not depend on rounding at all: see :func:`_first_positive_above`.

Cost (C = capacity, B = batch, F = features per row):

- ``replay_sample``: O(C) elementwise work (``p^alpha`` and the block sums: one read of the
  priorities), O(sqrt(C)) prefix sum over blocks, O(B sqrt(C)) for the in-block prefix sums and
  the two compare-all searches, O(B F) gathers. Per sampled transition O(C / B + sqrt(C)); the
  O(C) pass dominates at large C.
- ``replay_update``: O(B) (two scatters and a max), independent of C (with the state donated, as
  in the learner, the scatter is in place).
- ``replay_add`` of n rows: O(n F).

``python -m benchmarks.replay`` times sample and update per call and inside a ``lax.scan``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jdqn.transition import Transition


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

    ``n`` is static and must be <= capacity (checked at trace time), so the ``n`` written slots
    are distinct. Overwritten slots lose their old priority. Because writes start at slot 0 and
    advance, the written slots are always exactly ``[0, size)``.
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
    """Insertion serial of the transition now in each written slot, [B] int32.

    Slot i holds the last transition whose serial s satisfies s % C == i and s < inserted. Unlike
    the slot itself, the serial is new for every transition, so per-transition randomness keyed on
    it (ensemble bootstrap masks) is fresh when a slot is overwritten. O(B).
    """
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

    ``mass``/``cumulative`` are ``[n]`` (shared by all draws) or ``[B, n]`` (one row per draw);
    ``position`` is ``[B]``. With exact prefix sums this is ``searchsorted(c, position,
    side='right')``: ``c[i-1] <= position < c[i]`` forces ``mass[i] > 0``. In float32 that
    argument breaks: ``jnp.cumsum`` lowers to a reduce-window that XLA evaluates as a parallel
    tree, so ``c[i]`` and ``c[i-1]`` are rounded through different partial sums and a zero-mass
    slot can sit on a strict increase (or the sums can even decrease). So the zero-mass test is
    made explicit instead of relying on rounding.

    Why the result is always a positive-mass slot: the caller clamps ``position`` strictly below
    ``top = max{c[k] : mass[k] > 0}`` (:func:`_prefix_top`, :func:`_below`), so the ``k`` attaining
    ``top`` satisfies both conditions; the hit set is non-empty and the result is its first
    element, which has ``mass > 0`` by construction. Rounding can at worst make a tiny positive
    mass unreachable, never a zero-mass (or unwritten, NaN) slot reachable. Cost O(B n) compares,
    which is cheap for n ~ sqrt(C) and branch-free.
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
    # exp(alpha log p) is p^alpha (and ~2x cheaper than pow on CPU); where() keeps unwritten slots
    # at exactly 0, where 0**0 == 1 would make them sampleable for alpha == 0.
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
    over the sampled batch (Schaul et al. 2016, Algorithm 1), so weights lie in (0, 1]. Never
    returns a slot that was never written or has zero priority (see
    :func:`_first_positive_above`).
    Precondition: at least one written slot with a finite positive priority; sampling an empty
    buffer returns slot 0 with weight 0. Priorities must be finite with
    ``sum p^alpha`` < float32 max, which :func:`replay_update` guarantees via ``priority_max``.
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
    """Write ``p = clip(nan_to_num(priorities) + eps, eps, priority_max)`` at ``indices``.

    Proportional prioritisation (Schaul et al., ICLR 2016): priorities are TD errors plus eps.

    ``indices [B] int32`` come from :func:`replay_sample`; ``priorities [B]`` are usually
    ``|y - Q|``. Rows with ``valid [B] bool`` False (HER donors) never write, nor do indices
    outside the written range ``[0, size)`` (so an unwritten slot can never become sampleable).
    NaN maps to ``eps``, +inf to ``priority_max``, negatives to ``eps``. Duplicate indices: the
    slot keeps the LARGEST of its new priorities (deterministic, order-free; the transition is
    revisited sooner rather than later). ``max_priority`` becomes the max of itself and the written
    priorities. O(B).
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
