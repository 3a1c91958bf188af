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

How the kernel is O(N). In atom units ``b_j = clip(c + g*j, 0, N-1)`` with
``c = (r - (1-g)*v_min)/dz``, monotone in ``j``. Target ``i`` receives from the sources with
``b_j`` in ``[i-1, i+1)``; these form a contiguous range ``[k_{i-1}, k_{i+1})`` of ``j``, where
``k_t = #{j : b_j < t}`` has a closed form (``ceil((t - c)/g)``, clipped). On that range the hat
weight is linear in ``b``, and the triangle wave ``tri(b)`` = distance from ``b`` to the nearest
even integer turns it into a function that is the same for every target of one parity:
``hat(b - i) = 1 - tri(b)`` for even ``i`` and ``tri(b)`` for odd ``i`` on ``[i-1, i+1]``. So, with
``A_even = cumsum(p*(1-tri(b)))`` and ``A_odd = cumsum(p*tri(b))`` (exclusive prefix sums),

    m_i = A_par(i)[k_{i+1}] - A_par(i)[k_{i-1}]

two gathers per target. Every piece is continuous in ``b`` (``tri`` is, and a source on a range
boundary has the same weight on either side of it), so when float rounding puts ``k_t`` off by
one for a source sitting on ``t``, the answer moves by rounding error only; no floor has to agree
with another floor. Negative discounts reverse the order of ``b``; the kernel then reads the
prefix sums from the other end.

The prefix sums live in the row's own output block (stored, ``debug_barrier``, gathered back),
so the kernel needs no scratch output and no atomics: HBM sees one read of ``p`` and one write
of ``m`` (the scratch writes are overwritten while still in L2). They run in int32 fixed
point (``2**-26`` units), so they are exact in any summation order, window sums are never
negative, and a row keeps its input mass to within ``N * 2**-27`` however many atoms it has
(probabilities are expected: a row's mass must stay below 32).

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

# Default Pallas launch: rows per program so that one block holds about this many padded atoms,
# and the Triton warp count. Tuned on the H200 (BENCHMARKS.md, "C51 projection (issue 5)").
DEFAULT_BLOCK_ELEMENTS = 512
DEFAULT_NUM_WARPS = 2

# Prefix sums run in int32 fixed point with 2**-26 units: exact in any order, and a row's mass
# (<= 32 fits) keeps within N * 2**-27 of its float32 value (1.9e-6 at N = 256).
_UNITS = float(2**26)


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


def _split_12_bits(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x >= 0 as hi + lo, hi = x with the low 12 mantissa bits cleared: both have <= 12 bits."""
    hi = jax.lax.bitcast_convert_type(
        jax.lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32
    )
    return hi, x - hi  # x - hi is exact and >= 0


def _to_units(x: jax.Array) -> jax.Array:
    """float32 >= 0 -> int32 count of 2**-26 units, rounded to nearest."""
    return jnp.floor(x * _UNITS + 0.5).astype(jnp.int32)


def _c51_kernel(
    probs_ref,
    rewards_ref,
    discounts_ref,
    *refs,
    n_atoms: int,
    n_pad: int,
    block_rows: int,
    v_min: float,
    v_max: float,
    dz: float,
    barrier: bool,
):
    """One program projects ``block_rows`` rows; refs are whole arrays, indexed by hand."""
    out_ref = refs[-1]  # refs = (out,) or (poison_in, out) when the output is aliased
    batch = probs_ref.shape[0]
    row0 = pl.program_id(0) * block_rows
    rows = row0 + jnp.arange(block_rows, dtype=jnp.int32)  # [R]
    cols = jnp.arange(n_pad, dtype=jnp.int32)  # [P], padded atom / source index
    row_ok = rows < batch  # [R]
    valid = row_ok[:, None] & (cols < n_atoms)[None, :]  # [R, P]
    block = (pl.ds(row0, block_rows), pl.ds(0, n_pad))

    probs = plgpu.load(probs_ref.at[block], mask=valid, other=0.0)  # [R, P]
    reward = plgpu.load(rewards_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    discount = plgpu.load(discounts_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    reward = reward.astype(jnp.float32)[:, None]  # [R, 1]
    discount = discount.astype(jnp.float32)[:, None]  # [R, 1]

    # Unclipped source positions in atom units, u = c + g*j with c = (r - (1-g)*v_min)/dz.
    # Sources are visited in the order in which u rises: q = j for g >= 0, q = N-1-j for g < 0,
    # so u(q) = base + |g|*q. |g| is split into two 12-bit halves so that both products with q
    # are exact: u(q) then rounds the same way wherever it is evaluated (FMA contraction or not),
    # and the window counts below agree bit for bit with the positions the weights use.
    ascending = discount >= 0.0  # [R, 1]
    start = (reward - (1.0 - discount) * v_min) / dz  # [R, 1]
    base = jnp.where(ascending, start, start + discount * (n_atoms - 1))  # [R, 1]
    slope_hi, slope_lo = _split_12_bits(jnp.abs(discount))  # [R, 1] each, both >= 0

    def position(q):  # q [R, P] float32 integer-valued -> u(q) [R, P], nondecreasing in q
        return (base + slope_hi * q) + slope_lo * q

    source = cols.astype(jnp.float32)[None, :]  # [1, P]
    u = position(jnp.where(ascending, source, (n_atoms - 1) - source))  # [R, P]
    b = jnp.clip(u, 0.0, n_atoms - 1.0)  # [R, P], b_j in [0, N-1]
    tri = jnp.abs(b - 2.0 * jnp.floor(0.5 * b + 0.5))  # [R, P], distance to nearest even
    odd_units = _to_units(probs * tri)  # [R, P] int32, weight towards odd targets
    even_units = _to_units(probs) - odd_units  # [R, P] int32, >= 0: rounding is monotone
    odd_cum = jnp.cumsum(odd_units, axis=1)  # [R, P] int32, inclusive prefix sums
    even_cum = jnp.cumsum(even_units, axis=1)
    # NaN/inf in probs, or NaN in rewards/discounts, must not become finite garbage through
    # the integer path: this row term is 0, or NaN, and is added to the result. (On the GPU,
    # clip/min/max drop NaN, so the positions alone would not carry it.)
    bad_row = jnp.isnan(reward) | jnp.isnan(discount)  # [R, 1]
    poison = jnp.sum(probs * 0.0, axis=1, keepdims=True) + jnp.where(bad_row, jnp.nan, 0.0)

    inv_slope = 1.0 / jnp.maximum(slope_hi + slope_lo, 1e-30)  # g = 0: counts jump 0 -> N

    def count(t):  # t [1, P] -> k_t = #{q : u(q) < t} [R, P] int32 in [0, N]
        # For 0 < t <= N-1, b < t <=> u < t. Closed form, then one exact fix-up step each
        # way (the estimate is within one source of the truth while |(t - base)/g| < 2**20,
        # and beyond that it is clipped to 0 or N, which is then exact too).
        x = jnp.clip((t - base) * inv_slope, -1.0, n_atoms + 1.0)
        k = jnp.clip(jnp.ceil(x).astype(jnp.int32), 0, n_atoms)  # clip again: NaN -> any int
        k_float = k.astype(jnp.float32)
        k = jnp.where((k < n_atoms) & (position(k_float) < t), k + 1, k)
        k = jnp.where((k > 0) & (position(k_float - 1.0) >= t), k - 1, k)
        k = jnp.where(t <= 0.0, 0, k)
        return jnp.where(t >= n_atoms, n_atoms, k)

    target = cols.astype(jnp.float32)[None, :]  # [1, P]
    k_below = count(target - 1.0)  # [R, P], sources with b < i-1
    k_above = count(target + 1.0)  # [R, P], sources with b < i+1
    # Target i's window [k_below, k_above) in q order, as exclusive prefix indices in j order.
    end = jnp.where(ascending, k_above, n_atoms - k_below)
    begin = jnp.where(ascending, k_below, n_atoms - k_above)

    row_index = jnp.broadcast_to(rows[:, None], (block_rows, n_pad))
    is_even = (cols % 2 == 0)[None, :]  # [1, P]

    def window_sum(parity_mask):
        # A[k] (exclusive) = inclusive[k - 1], A[0] = 0: masked lanes read nothing, give 0.
        def prefix(k):
            mask = valid & parity_mask & (k > 0)
            bits = plgpu.load(out_ref.at[row_index, jnp.maximum(k - 1, 0)], mask=mask, other=0.0)
            return jax.lax.bitcast_convert_type(bits, jnp.int32)

        return prefix(end) - prefix(begin)  # [R, P] int32, exact

    def sync():
        # The output block doubles as scratch: other threads of this program must see the
        # stores before the gathers, and finish gathering before the next stores.
        if barrier:
            plgpu.debug_barrier()

    as_bits = functools.partial(jax.lax.bitcast_convert_type, new_dtype=jnp.float32)
    plgpu.store(out_ref.at[block], as_bits(even_cum), mask=valid)
    sync()
    mass_even = window_sum(is_even)
    sync()
    plgpu.store(out_ref.at[block], as_bits(odd_cum), mask=valid)
    sync()
    mass_odd = window_sum(~is_even)
    sync()
    mass = jnp.where(is_even, mass_even, mass_odd).astype(jnp.float32) * (1.0 / _UNITS)
    plgpu.store(out_ref.at[block], mass + poison, mask=valid)


def _block_rows(batch: int, n_pad: int, block_elements: int) -> int:
    return max(1, min(block_elements // n_pad, pl.next_power_of_2(max(batch, 1))))


def c51_project_pallas(
    probs: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    v_min: float,
    v_max: float,
    *,
    interpret: bool,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
    num_warps: int = DEFAULT_NUM_WARPS,
    out_init: jax.Array | None = None,
) -> jax.Array:
    """The Pallas kernel on rows: probs [B, N], rewards [B], discounts [B] -> [B, N] float32.

    ``block_elements`` (padded atoms per program, rows = block_elements // next_pow2(N)) and
    ``num_warps`` are launch knobs for benchmarking. ``out_init`` [B, N], if given, is aliased
    to the output buffer, so tests can poison it (NaN) and see that every element is written.
    Not vmappable by itself; :func:`c51_project` adds the vmap rule.
    """
    batch, n_atoms = probs.shape
    dz = _support(n_atoms, v_min, v_max)
    n_pad = pl.next_power_of_2(n_atoms)
    block_rows = _block_rows(batch, n_pad, block_elements)
    kernel = functools.partial(
        _c51_kernel,
        n_atoms=n_atoms,
        n_pad=n_pad,
        block_rows=block_rows,
        v_min=float(v_min),
        v_max=float(v_max),
        dz=float(dz),
        barrier=not interpret,  # interpret mode runs a program's lanes in lockstep already
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
def _pallas_batched(
    v_min: float, v_max: float, interpret: bool, block_elements: int, num_warps: int
):
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
            block_elements=block_elements,
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
        float(v_min), float(v_max), impl == "interpret", DEFAULT_BLOCK_ELEMENTS, DEFAULT_NUM_WARPS
    )
    return project(probs, rewards, discounts)
