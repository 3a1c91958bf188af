"""C51 categorical projection (Bellemare, Dabney & Munos 2017, Algorithm 1) as a Pallas GPU kernel.

For one row, with atoms ``z_i = v_min + i*dz`` and ``g = gamma^n * (1 - done)``::

    Tz_j = clip(r + g*z_j, v_min, v_max)
    m_i  = sum_j p_j * clip(1 - |Tz_j - z_i| / dz, 0, 1)

This hat-kernel form keeps the mass of a source that lands exactly on an atom (the floor/ceil
textbook version drops it). ``impl`` in :func:`c51_project`: ``"reference"`` (the formula in
jnp, O(N^2) per row, as rlax and Dopamine write it), ``"pallas"`` (the kernel below, O(N), no
atomics), ``"interpret"`` (the kernel in interpret mode, CPU CI), ``"auto"`` (``"pallas"`` on a
GPU, else ``"reference"``). ``benchmarks/projection.py`` times it against a scatter-add form.

How the kernel is O(N). In atom units source ``j`` sits at ``u_j = c + g*j`` before clipping,
with ``c = (r - (1-g)*v_min)/dz``; in the order ``q`` (``j`` for ``g >= 0``, ``N-1-j`` for
``g < 0``) ``u(q) = base + s*q`` rises with ``s = |g|``. Clipped sources (``u <= 0`` or
``u >= N-1``) are the first ``n_low`` and the last ``N - q_high`` in ``q`` order, counted in
closed form per row, and put their mass on an end atom (two masked row sums). A terminal row
(``s = 0``) puts its whole mass at ``hat(clip(base) - i)``. Otherwise target ``i`` receives from
the run of consecutive ``q`` with ``u`` in ``(i-1, i+1)``, at most ``floor(2/s) + 1`` long (3 for
``g = 0.99``): each target walks its own window, gathering ``p`` from the row it has just loaded
(cache hits). So a row costs O(N) for discounts bounded away from 0, which ``gamma^n`` is; a row
with a tiny nonzero ``|g|`` makes its block O(N^2) (correct, only slower). The clip counts decide
which sources the windows may take, so no source is counted twice however ``u`` rounds at a
boundary; every output element is written once by its own target: no atomics, scratch buffers or
barriers, one read of ``p`` and one write of ``m``, a fixed summation order (deterministic). Flat
int32 offsets address ``p``, so ``B*N < 2**31`` (checked).

Layout. A program's arrays are [padded atoms, rows], and the atom index that addresses the tile
is multiplied by a 1 read from memory, so that Triton cannot see that the tile is contiguous
along the atoms: it then lays its threads along the rows, each thread holding atoms of one row.
Left to itself it spreads every row over a warp, so each thread holds 8 rows and repeats every
per-row computation 8 times, with 16 full warp reductions: about twice the warp instructions.

The Pallas Triton backend is deprecated upstream (it still lowers and runs, with a
``DeprecationWarning``); the pure-jnp paths need no GPU.
"""

from __future__ import annotations

import functools
from typing import Literal, cast

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.folding import learner_folding

Impl = Literal["auto", "pallas", "interpret", "reference"]
IMPLS: tuple[str, ...] = ("auto", "pallas", "interpret", "reference")

# Default Pallas launch, tuned on the H200: rows per program so that one block holds about this
# many padded atoms, and the Triton warp count.
DEFAULT_BLOCK_ELEMENTS = 512
DEFAULT_NUM_WARPS = 2
# A target's window starts this far (atom units) before x_i: float32 positions carry ~1e-5 of
# rounding, so no source with a positive hat weight falls before it.
_SLACK = 0.01
# Window steps unrolled in the kernel: rows with |g| > 2.02 / UNROLLED (0.674) need no loop.
UNROLLED = 3


def _support(n_atoms: int, v_min: float, v_max: float) -> float:
    """The atom spacing dz of a validated static support."""
    if n_atoms < 2:
        raise ValueError(f"c51_project: need at least 2 atoms, got {n_atoms}")
    if not v_min < v_max:
        raise ValueError(f"c51_project: need v_min < v_max, got {v_min} >= {v_max}")
    return (v_max - v_min) / (n_atoms - 1)


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


def _c51_kernel(
    probs_ref,
    flat_probs_ref,
    rewards_ref,
    discounts_ref,
    one_ref,
    *refs,
    n_atoms: int,
    n_pad: int,
    block_rows: int,
    v_min: float,
    dz: float,
):
    """One program projects ``block_rows`` rows; refs are whole arrays, indexed by hand.

    Block arrays are [P, R] (padded atoms x rows), addressed through ``one_ref`` (a [1] int32
    holding 1; module docstring, "Layout"). ``flat_probs_ref`` is ``probs_ref`` as one [B*N]
    vector: a window gather's flat offset moves by one per step (cheaper than row and column).
    """
    out_ref = refs[-1]  # refs = (out,) or (poison_in, out) when the output is aliased
    batch = probs_ref.shape[0]
    top = n_atoms - 1.0  # the last atom, in atom units
    row0 = pl.program_id(0) * block_rows
    rows = row0 + jnp.arange(block_rows, dtype=jnp.int32)  # [R]
    cols = jnp.arange(n_pad, dtype=jnp.int32)  # [P], padded atom / source index
    row_index = jnp.broadcast_to(rows[None, :], (n_pad, block_rows))  # [P, R]
    # The atom index for addressing the tile, times a 1 from memory: opaque to Triton's axis
    # analysis (a 1 it can see through leaves the slow layout). Only the addresses use it:
    # deriving the target atoms from it was slower at N = 101 and 201.
    col_index = cols[:, None] * plgpu.load(one_ref.at[pl.ds(0, 1)])[None, :]  # [P, 1]
    col_index = jnp.broadcast_to(col_index, (n_pad, block_rows))  # [P, R]
    row_ok = rows < batch  # [R]
    valid = (cols < n_atoms)[:, None] & row_ok[None, :]  # [P, R]

    probs = plgpu.load(probs_ref.at[row_index, col_index], mask=valid, other=0.0)  # [P, R]
    reward = plgpu.load(rewards_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    discount_row = plgpu.load(discounts_ref.at[pl.ds(row0, block_rows)], mask=row_ok, other=0.0)
    discount_row = discount_row.astype(jnp.float32)  # [R]
    reward = reward.astype(jnp.float32)[None, :]  # [1, R]
    discount = discount_row[None, :]  # [1, R]

    # Unclipped positions in atom units in the order q (module docstring): u(q) = base + s*q,
    # nondecreasing in q however it is rounded.
    ascending = discount >= 0.0  # [1, R]
    start = (reward - (1.0 - discount) * v_min) / dz  # [1, R]
    base = jnp.where(ascending, start, start + discount * top)  # [1, R]
    slope = jnp.abs(discount)  # [1, R]

    target = cols.astype(jnp.float32)[:, None]  # [P, 1], target atom i
    moving = slope > 0.0  # [1, R]; s = 0 (terminal): every source sits at u = base
    inv_slope = 1.0 / jnp.where(moving, slope, 1.0)  # [1, R]
    # q order <-> column: q = flip + turn*j (q = j, or N-1-j for g < 0).
    flip = jnp.where(ascending, 0.0, top)  # [1, R]
    turn = jnp.where(ascending, 1.0, -1.0)  # [1, R]
    q = flip + turn * target  # [P, R], q of the source in column j

    # Clipped sources: the first n_low (u <= 0) and those from q_high on (u >= N-1) in q order.
    # A terminal row counts all its sources as "low" and puts them at clip(base), not atom 0.
    n_low = jnp.clip(jnp.floor(-base * inv_slope) + 1.0, 0.0, n_atoms)  # [1, R]
    q_high = jnp.clip(jnp.ceil((top - base) * inv_slope), n_low, n_atoms)  # [1, R]
    n_low = jnp.where(moving, n_low, n_atoms)
    q_high = jnp.where(moving, q_high, n_atoms)
    low = jnp.sum(jnp.where(q < n_low, probs, 0.0), axis=0, keepdims=True)  # [1, R]
    high = jnp.sum(jnp.where(q >= q_high, probs, 0.0), axis=0, keepdims=True)  # [1, R]
    anchor = jnp.where(moving, 0.0, jnp.clip(base, 0.0, top))  # [1, R], where "low" goes
    mass = low * jnp.maximum(0.0, 1.0 - jnp.abs(anchor - target))  # [P, R]
    mass += jnp.where(target == top, high, 0.0)
    # A NaN reward or discount clips nothing and moves nothing: mark its row NaN for the guard.
    # (NaN/inf in probs reaches an end atom or a window on its own.)
    poison = jnp.where(jnp.isnan(reward) | jnp.isnan(discount), jnp.nan, 0.0)  # [1, R]

    # Moving rows: target i gathers the inside sources with u in (i-1, i+1) (positive hat
    # weight): the q from x_i = (i-1-base)/s on, at most floor(2/s) + 1, starting _SLACK early.
    # Window length per row, as [R]: a reduction over [1, R] trips the CUDA lowering.
    row_slope = jnp.abs(discount_row)  # [R]
    width = jnp.floor((2.0 + 2 * _SLACK) / jnp.where(row_slope > 0.0, row_slope, 1.0)) + 1.0
    width = jnp.where(row_slope > 0.0, jnp.minimum(width, n_atoms), 0.0)  # [R], <= N
    # Clipped to [n_low, N] before the int conversion below. A NaN reward gathers nothing or
    # inside its own row (as the NaN min/max happen to resolve); its poison marks the row.
    first = jnp.minimum(
        jnp.maximum(jnp.ceil((target - 1.0 - _SLACK - base) * inv_slope), n_low), n_atoms
    )  # [P, R]
    distance = base + slope * first - target  # [P, R], u - i at the window's first source
    # Flat offset of the window's first source; each step moves it one source on (in q order).
    first_column = (flip + turn * first).astype(jnp.int32)
    offset = row_index * n_atoms + first_column  # [P, R] int32 (B*N < 2**31, checked)
    direction = jnp.where(ascending, 1, -1)  # [1, R]
    # Steps inside the window. Terminal rows (and rows past B, loaded as g = 0) have
    # n_low = q_high = N, so none; padded target lanes gather inside their row, unused.
    last = q_high - first  # [P, R]

    def add_source(step, total):  # the step-th source of every target's window
        step_f = step.astype(jnp.float32)
        p = plgpu.load(flat_probs_ref.at[offset + direction * step], mask=step_f < last, other=0.0)
        return total + p * jnp.maximum(0.0, 1.0 - jnp.abs(distance + slope * step_f))

    # Unrolled, the first steps' gathers are in flight together (a loop waits for each one).
    for step in range(UNROLLED):
        mass = add_source(jnp.int32(step), mass)
    steps = jnp.max(width).astype(jnp.int32)  # the block's widest window (3 for s = 0.99)
    mass = jax.lax.fori_loop(UNROLLED, steps, add_source, mass)
    plgpu.store(out_ref.at[row_index, col_index], mass + poison, mask=valid)


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

    ``block_elements`` (padded atoms per program) and ``num_warps`` are launch knobs for
    benchmarks; ``out_init`` [B, N] is aliased to the output, so tests can poison it (NaN) and
    see every element written. Not vmappable by itself (:func:`c51_project` adds the rule).
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
        dz=float(dz),
    )
    if batch * n_atoms >= 2**31:
        raise ValueError(
            f"c51_project: {batch} x {n_atoms} probabilities exceed the kernel's int32 offsets;"
            " project in chunks of fewer than 2**31 / N rows"
        )
    probs = probs.astype(jnp.float32)
    # The last input is the kernel's run-time 1 (see _c51_kernel).
    operands = [probs, probs.reshape(-1), rewards, discounts, jnp.ones((1,), jnp.int32)]
    aliases = {}
    if out_init is not None:
        operands.append(out_init.astype(jnp.float32))
        aliases = {5: 0}
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
def _pallas_batched(v_min: float, v_max: float, interpret: bool):
    """The Pallas path with a vmap rule that folds mapped axes into rows (one launch)."""
    kernel = functools.partial(c51_project_pallas, v_min=v_min, v_max=v_max, interpret=interpret)
    return learner_folding(kernel)


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
    if impl == "reference":
        return c51_project_reference(probs, rewards, discounts, v_min, v_max)
    return _pallas_batched(float(v_min), float(v_max), impl == "interpret")(
        probs, rewards, discounts
    )
