"""C51 categorical projection (Bellemare, Dabney & Munos 2017, Algorithm 1) as a Pallas GPU kernel.

For one row, with atoms ``z_i = v_min + i*dz``::

    Tz_j = clip(r + g*z_j, v_min, v_max)
    m_i  = sum_j p_j * clip(1 - |Tz_j - z_i| / dz, 0, 1)

where ``g`` already holds ``gamma^n * (1 - done)``. This hat-kernel form keeps the mass of a
source that lands exactly on an atom (the floor/ceil textbook version drops it).

Implementations, chosen by ``impl`` in :func:`c51_project`:

- ``"reference"`` / ``"xla_hat"``: the formula above in jnp, ``[B, N, N]`` hat weights summed
  over sources (as rlax and Dopamine write it). O(N^2) per row; the reference.
- ``"xla_scatter"``: lower atom ``l_j = floor(b_j)`` and fraction, two scatter-adds. O(N).
- ``"pallas"``: the Triton-lowered Pallas kernel below. O(N) per row, no atomics.
- ``"interpret"``: the same Pallas kernel in interpret mode (CPU CI).
- ``"auto"``: ``"pallas"`` when the default backend is a GPU, ``"reference"`` otherwise.

How the kernel is O(N), with no atomics and no scratch. In atom units the sources sit at
``b_j = clip(c + g*j, 0, N-1)`` with ``c = (r - (1-g)*v_min)/dz``, monotone in ``j``; source ``j``
gives ``p_j*(1 - f_j)`` to its lower neighbour ``l_j = min(floor(b_j), N-2)`` and ``p_j*f_j`` to
``l_j + 1`` (``f_j = b_j - l_j``; a source on an atom gives it everything). Visited in the order
in which ``b`` rises (``j`` ascending for ``g >= 0``, descending for ``g < 0``), ``l`` never
decreases, so one thread per row sweeps its sources once holding just two accumulators, the
masses of atoms ``cur`` and ``cur + 1``; when ``l`` moves past ``cur`` those atoms are final and
are stored, each exactly once. Rounding cannot break the order: ``base + |g|*q`` is monotone in
``q`` under round-to-nearest (with or without FMA contraction), and so are clip and floor.
Atoms no source reaches are zero: each program first writes its rows' block (zeros; NaN for a
row with a non-finite probability, reward or discount, so the guard sees it), a barrier, then
the sweep, which skips such rows. HBM sees one read of ``p`` and one write of ``m``; the
sweep's per-row loads hit the lines the block pass just brought in, and its scattered 4-byte
stores merge in L2 over the zeros.

The Pallas Triton backend is deprecated upstream from jax 0.11 (it still lowers and runs on the
H200 with jax 0.11.2 and emits a ``DeprecationWarning`` at lowering); the pure-jnp paths need no
GPU.
"""

from __future__ import annotations

import functools
from typing import Literal, cast

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

Impl = Literal["auto", "pallas", "interpret", "reference", "xla_hat", "xla_scatter"]
IMPLS: tuple[str, ...] = ("auto", "pallas", "interpret", "reference", "xla_hat", "xla_scatter")

# Default Pallas launch: rows per program (one row per thread when rows = 32 * warps) and the
# Triton warp count. Tuned on the H200 (BENCHMARKS.md, "C51 projection (issue 5)").
DEFAULT_BLOCK_ROWS = 128
DEFAULT_NUM_WARPS = 4
# Atoms per column chunk of the block pass: bounds its registers ([R, C] values per program).
_CHUNK_ELEMENTS = 8192


def _support(n_atoms: int, v_min: float, v_max: float) -> float:
    """Validates the static support and returns the atom spacing dz."""
    if n_atoms < 2:
        raise ValueError(f"c51_project: need at least 2 atoms, got {n_atoms}")
    if not v_min < v_max:
        raise ValueError(f"c51_project: need v_min < v_max, got {v_min} >= {v_max}")
    return (v_max - v_min) / (n_atoms - 1)


# --------------------------------------------------------------------------------------------
# Pure-jnp formulations.
# --------------------------------------------------------------------------------------------


def c51_project_reference(
    probs: jax.Array, rewards: jax.Array, discounts: jax.Array, v_min: float, v_max: float
) -> jax.Array:
    """C51 projection, hat-kernel form (Bellemare et al. 2017; as rlax.categorical_l2_project).

    probs [B, N] float32, rewards [B], discounts [B] (gamma^n * (1 - done)) -> [B, N] float32.
    """
    n_atoms = probs.shape[-1]
    dz = _support(n_atoms, v_min, v_max)
    atoms = jnp.linspace(v_min, v_max, n_atoms, dtype=jnp.float32)  # [N]
    target_atoms = jnp.clip(
        rewards[:, None] + discounts[:, None] * atoms[None, :], v_min, v_max
    )  # [B, N] float32, Tz_j
    # [B, N(i), N(j)]: written as a product summed over j so XLA fuses it into one reduction
    # instead of materialising the weights (4 bytes * B * N^2 would not fit at large B).
    hat = jnp.clip(1.0 - jnp.abs(target_atoms[:, None, :] - atoms[None, :, None]) / dz, 0.0, 1.0)
    return jnp.sum(hat * probs[:, None, :], axis=-1)


def _project_xla_scatter(
    probs: jax.Array, rewards: jax.Array, discounts: jax.Array, v_min: float, v_max: float
) -> jax.Array:
    """C51 projection as two scatter-adds onto the lower and upper neighbour atoms. O(N)."""
    batch, n_atoms = probs.shape
    dz = _support(n_atoms, v_min, v_max)
    atoms = jnp.linspace(v_min, v_max, n_atoms, dtype=jnp.float32)  # [N]
    target_atoms = jnp.clip(rewards[:, None] + discounts[:, None] * atoms[None, :], v_min, v_max)
    b = (target_atoms - v_min) / dz  # [B, N] float32, in [0, N-1]
    # floor + fraction (not floor/ceil): a source exactly on an atom puts all its mass there.
    lower = jnp.clip(jnp.floor(b), 0, n_atoms - 1).astype(jnp.int32)  # [B, N]
    upper_weight = b - lower  # [B, N] float32, in [0, 1]
    upper = jnp.minimum(lower + 1, n_atoms - 1)  # at b = N-1 the weight is 0 anyway
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, n_atoms))
    out = jnp.zeros((batch, n_atoms), jnp.float32)
    out = out.at[rows, lower].add(probs * (1.0 - upper_weight))
    return out.at[rows, upper].add(probs * upper_weight)


# --------------------------------------------------------------------------------------------
# The Pallas kernel.
# --------------------------------------------------------------------------------------------


def _c51_kernel(
    probs_ref,
    rewards_ref,
    discounts_ref,
    *refs,
    n_atoms: int,
    chunk: int,
    block_rows: int,
    v_min: float,
    dz: float,
    barrier: bool,
):
    """One program projects ``block_rows`` rows; refs are whole arrays, indexed by hand."""
    out_ref = refs[-1]  # refs = (out,) or (poison_in, out) when the output is aliased
    batch = probs_ref.shape[0]
    row0 = pl.program_id(0) * block_rows
    rows = row0 + jnp.arange(block_rows, dtype=jnp.int32)  # [R]
    row_ok = rows < batch  # [R]
    reward = plgpu.load(rewards_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    discount = plgpu.load(discounts_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    reward = reward.astype(jnp.float32)  # [R]
    discount = discount.astype(jnp.float32)  # [R]

    # Block pass, coalesced, in column chunks of ``chunk`` atoms: find rows with a non-finite
    # probability (NaN/inf must not become finite garbage), then write zeros (NaN for such
    # rows and for a NaN reward or discount) over the whole block.
    def block_cols(start):
        cols = start + jnp.arange(chunk, dtype=jnp.int32)  # [C]
        valid = row_ok[:, None] & (cols < n_atoms)[None, :]  # [R, C]
        # Index arrays, not a slice: the last chunk may run past the row's N atoms (masked).
        return (rows[:, None], cols[None, :]), valid

    bad = jnp.isnan(reward) | jnp.isnan(discount)  # [R]
    for start in range(0, n_atoms, chunk):
        index, valid = block_cols(start)
        probs = plgpu.load(probs_ref.at[index], mask=valid, other=0.0)  # [R, C]
        bad = bad | (jnp.sum(jnp.where(jnp.isfinite(probs), 0, 1), axis=1) > 0)
    fill = jnp.where(bad, jnp.nan, 0.0)[:, None]  # [R, 1]
    for start in range(0, n_atoms, chunk):
        index, valid = block_cols(start)
        plgpu.store(out_ref.at[index], jnp.broadcast_to(fill, valid.shape), mask=valid)
    if barrier:  # the sweep's stores (one thread per row) must land after every block store
        plgpu.debug_barrier()

    # The sweep. Source order q: j = q for g >= 0, j = N-1-q for g < 0, so that the unclipped
    # position u(q) = base + |g|*q rises with q.
    ascending = discount >= 0.0  # [R]
    start_u = (reward - (1.0 - discount) * v_min) / dz  # [R], u of source j = 0
    base = jnp.where(ascending, start_u, start_u + discount * (n_atoms - 1))  # [R]
    slope = jnp.abs(discount)  # [R]
    live = row_ok & ~bad  # [R]

    def store(atom, value, mask):
        plgpu.store(out_ref.at[rows, atom], value, mask=live & mask)

    def source(q, carry):
        cur, mass_lo, mass_hi = carry  # [R] int32, [R], [R]: atoms cur and cur+1 so far
        j = jnp.where(ascending, q, n_atoms - 1 - q)  # [R] int32
        p = plgpu.load(probs_ref.at[rows, j], mask=live, other=0.0)  # [R]
        b = jnp.clip(base + slope * q.astype(jnp.float32), 0.0, n_atoms - 1.0)  # [R]
        lower = jnp.minimum(jnp.floor(b), n_atoms - 2.0)  # [R], float
        frac = b - lower  # [R] in [0, 1]
        lower = lower.astype(jnp.int32)
        # l >= cur. Atoms below l are final: store cur, and cur+1 too when l jumped past it
        # (only for |g| > 1; the atoms jumped over keep their zero).
        store(cur, mass_lo, lower > cur)
        store(cur + 1, mass_hi, lower > cur + 1)
        zero = jnp.zeros_like(mass_lo)
        kept_lo = jnp.where(lower == cur, mass_lo, jnp.where(lower == cur + 1, mass_hi, zero))
        kept_hi = jnp.where(lower == cur, mass_hi, zero)
        return lower, kept_lo + p * (1.0 - frac), kept_hi + p * frac

    zeros = jnp.zeros((block_rows,), jnp.float32)
    init = (jnp.zeros((block_rows,), jnp.int32), zeros, zeros)
    cur, mass_lo, mass_hi = jax.lax.fori_loop(0, n_atoms, source, init)
    everything = jnp.ones((block_rows,), jnp.bool_)
    store(cur, mass_lo, everything)
    store(cur + 1, mass_hi, everything)


def c51_project_pallas(
    probs: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    v_min: float,
    v_max: float,
    *,
    interpret: bool,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_warps: int = DEFAULT_NUM_WARPS,
    out_init: jax.Array | None = None,
) -> jax.Array:
    """The Pallas kernel on rows: probs [B, N], rewards [B], discounts [B] -> [B, N] float32.

    ``block_rows`` (rows per program, a power of two) and ``num_warps`` are launch knobs for
    benchmarking. ``out_init`` [B, N], if given, is aliased to the output buffer, so tests can
    poison it (NaN) and see that every element is written. Not vmappable by itself;
    :func:`c51_project` adds the vmap rule.
    """
    batch, n_atoms = probs.shape
    dz = _support(n_atoms, v_min, v_max)
    if block_rows < 1 or block_rows & (block_rows - 1):
        raise ValueError(f"c51_project: block_rows must be a power of two, got {block_rows}")
    block_rows = min(block_rows, pl.next_power_of_2(max(batch, 1)))
    chunk = min(pl.next_power_of_2(n_atoms), max(1, _CHUNK_ELEMENTS // block_rows))
    kernel = functools.partial(
        _c51_kernel,
        n_atoms=n_atoms,
        chunk=chunk,
        block_rows=block_rows,
        v_min=float(v_min),
        dz=float(dz),
        barrier=not interpret,  # interpret mode runs a program's stores in program order
    )
    operands = [probs.astype(jnp.float32), rewards, discounts]
    aliases = {}
    if out_init is not None:
        operands.append(out_init.astype(jnp.float32))
        aliases = {3: 0}
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((batch, n_atoms), jnp.float32),
        grid=(pl.cdiv(batch, block_rows),),
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        name="c51_project",
    )(*operands)


@functools.cache
def _pallas_batched(v_min: float, v_max: float, interpret: bool, block_rows: int, num_warps: int):
    """The Pallas path with a vmap rule that folds mapped axes into rows (one launch)."""

    @jax.custom_batching.custom_vmap
    def project(probs, rewards, discounts):
        return c51_project_pallas(
            probs,
            rewards,
            discounts,
            v_min,
            v_max,
            interpret=interpret,
            block_rows=block_rows,
            num_warps=num_warps,
        )

    @project.def_vmap
    def _fold_vmap(axis_size, in_batched, probs, rewards, discounts):
        def lead(x, batched):  # mapped axis is axis 0 when batched
            return x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))

        probs, rewards, discounts = map(lead, (probs, rewards, discounts), in_batched)
        rows = probs.shape[0] * probs.shape[1]
        out = project(  # recursive, so nested vmaps fold too
            probs.reshape(rows, probs.shape[2]), rewards.reshape(rows), discounts.reshape(rows)
        )
        return out.reshape(probs.shape), True

    return project


# --------------------------------------------------------------------------------------------
# Dispatch.
# --------------------------------------------------------------------------------------------


def resolve_impl(impl: str) -> Impl:
    """Maps ``"auto"`` to ``"pallas"`` on a GPU backend and ``"reference"`` elsewhere."""
    if impl not in IMPLS:
        raise ValueError(f"c51_project: impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "reference"
    return cast(Impl, impl)  # one of IMPLS, checked above


@functools.partial(jax.jit, static_argnames=("v_min", "v_max", "impl"))
def c51_project(
    probs: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    v_min: float,
    v_max: float,
    impl: Impl = "auto",
) -> jax.Array:
    """Projects the distribution of ``r + g*Z`` onto the support (Bellemare et al. 2017).

    probs [B, N] float32 (rows of target probabilities), rewards [B], discounts [B]
    (``gamma^n * (1 - done)``) -> [B, N] float32. ``v_min``/``v_max`` are static Python floats.
    Targets are constants: the result carries no gradient. Works under ``jax.vmap`` (the Pallas
    paths fold mapped axes into rows).
    """
    if probs.ndim != 2 or rewards.shape != probs.shape[:1] or discounts.shape != probs.shape[:1]:
        raise ValueError(
            "c51_project: want probs [B, N], rewards [B], discounts [B]; got "
            f"{probs.shape}, {rewards.shape}, {discounts.shape}"
        )
    probs, rewards, discounts = jax.tree.map(
        lambda x: jax.lax.stop_gradient(x.astype(jnp.float32)), (probs, rewards, discounts)
    )
    impl = resolve_impl(impl)
    if impl in ("reference", "xla_hat"):
        return c51_project_reference(probs, rewards, discounts, v_min, v_max)
    if impl == "xla_scatter":
        return _project_xla_scatter(probs, rewards, discounts, v_min, v_max)
    project = _pallas_batched(
        float(v_min), float(v_max), impl == "interpret", DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS
    )
    return project(probs, rewards, discounts)
