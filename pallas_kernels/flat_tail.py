"""The learner step's flat tail as Pallas GPU kernels: the surgery's reductions, then Adam, the
target sync and the guard's keep-or-reject select.

XLA makes a dozen memory-bound passes of the tail over the parameter, target, mask and moment
vectors (it does not fuse sibling selects that share only a predicate). Here:

- :func:`gram` reads the ``[parts, P]`` gradients once for ``row_max [parts]`` and the Gram
  matrix of the rows divided by their max, all that Gradient Vaccine (Wang et al., ICLR 2021)
  and the budget (Pascanu et al., ICML 2013) need (``jdqn.agent.surgery.surgery_scalars``);
- :func:`adam_select` forms the total gradient ``sum_k w_k g_k``, applies Adam (Kingma & Ba,
  ICLR 2015; optax's ``scale_by_adam`` in optax's order), the masks and the target sync, and keeps
  the candidate only when the guard passes: one launch sums the total's finiteness and the
  candidate's squared norm, a second recomputes the candidate and writes the kept values in place.

The sums launch is skipped where it cannot fail: from the stored values' largest ``|x|``
(:class:`TailBounds`, from the previous write launch) and the gradients' row maxima,
:func:`candidate_bounds` bounds every value Adam computes, and where the squared norm stays far
below float32's largest value the decision is ``pre_ok`` alone; the write launch computes the
squared norm anyway, so the outputs are the two passes'. The first step, and any step after
XLA's update wrote the state, run the sums.

Gradients and vectors may come as column segments, one per leaf of the parameter tree in flat
order (``Grads``, :class:`TailVectors`), each with blocks of its own and written back in place:
the per-layer gradients and the parameter tree are never copied into one flat vector.

The grid is (learner, block of ``BLOCK`` elements), every ``vmap``ped axis folded into the
learner axis; the blocks' partial sums are added in XLA. Each element is written by its own
program: no atomics, a fixed order, deterministic. A row with a non-finite entry gets a NaN
``row_max`` (counted explicitly: a max over NaN is not reliable across backends).

``impl``: ``"pallas"`` (Triton, GPU), ``"interpret"`` (interpret mode, CPU tests) or
``"reference"`` (the formulas in jnp, what the kernels are tested against).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels.folding import learner_folding

Impl = Literal["pallas", "interpret", "reference"]
IMPLS: tuple[str, ...] = ("pallas", "interpret", "reference")
# The loss parts' gradients: one [parts, P] matrix, or its column segments [parts, n_k].
Grads = jax.Array | Sequence[jax.Array]
Segments = tuple[jax.Array, ...]
# Elements of one vector a program handles, and its Triton warps.
BLOCK = 1024
NUM_WARPS = 4
_FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)
# The per-learner scalars of the Adam kernels, then the parts' weights w_k; "exact": the sums
# launch must check this learner.
_BIAS1, _BIAS2, _OK, _SYNC, _LR, _EXACT = range(6)
_WRITE_STATS = 4  # the write launch's output per block: sum of p'^2, max |p|, |mu|, |nu| kept
# provably_finite's limit on every bound: float32's largest value is 3.4e38, so a factor of
# 340 covers the rounding of the few operations bounded and of the n-term sum of squares
# (relative error <= n 2^-24 < 128 for the n the kernels' int32 offsets allow).
_BOUND_LIMIT = 1e36


class AdamHyper(NamedTuple):
    """Static settings of Adam (optax.adam's) and of the target sync; the learning rate is a
    value of each learner (:class:`TailScalars`)."""

    b1: float
    b2: float
    eps: float
    tau: float  # Polyak rate; 0: the target is a hard copy when TailScalars.sync is 1


class TailVectors(NamedTuple):
    """One learner's float32 vectors that the tail reads, each flat ``[P]`` or as the per-leaf
    segments ``[n_k]`` of the gradient's sizes (``Segments``), read and written in place."""

    params: Any  # online parameters (unmasked, as stored)
    masks: Any  # pruning masks {0, 1} of this step; None: no pruning (all ones)
    target: Any  # target parameters
    mu: Any  # Adam's first moment
    nu: Any  # Adam's second moment


class TailScalars(NamedTuple):
    """One learner's per-step scalars (float32 ``[]``; flags are 0 or 1)."""

    bias1: jax.Array  # 1 - b1^t, optax's bias correction at the incremented count t
    bias2: jax.Array  # 1 - b2^t
    pre_ok: jax.Array  # every guard check that does not depend on the update passed
    sync: jax.Array  # a hard target copy is due (ignored when tau > 0)
    lr: jax.Array  # Adam's step size: a value, so that learners of one program may differ in it


class TailBounds(NamedTuple):
    """Upper bounds on ``|x|`` of one learner's stored parameters, mu and nu (``[]`` float32
    each); float32's largest value where unknown (:func:`unknown_bounds`)."""

    params: jax.Array
    mu: jax.Array
    nu: jax.Array


def unknown_bounds() -> TailBounds:
    """Bounds that prove nothing: the next :func:`adam_select` runs the guard's sums."""
    # Three arrays, not one thrice: a state whose leaves share a buffer cannot be donated.
    return TailBounds(*(jnp.full((), _FLOAT32_MAX, jnp.float32) for _ in TailBounds._fields))


class AdamSelect(NamedTuple):
    """What :func:`adam_select` returns; leaves gain the caller's vmapped axes."""

    params: Any  # [P] the new parameters if the guard passed, else the old (or Segments)
    target: Any  # [P] target parameters after the sync, or the old ones (or Segments)
    mu: Any  # [P] Adam's first moment, or the old one (or Segments)
    nu: Any  # [P] Adam's second moment, or the old one (or Segments)
    total_finite: jax.Array  # [] bool, every entry of the total gradient is finite
    params_sq_norm: jax.Array  # [] float32, squared norm of the candidate parameters
    applied: jax.Array  # [] bool, the candidate was kept
    bounds: TailBounds  # max |x| of the returned params, mu and nu


def _finite(x: jax.Array) -> jax.Array:
    # |x| <= max finite float32 is False for inf and NaN; written as a comparison because it
    # lowers everywhere (interpret mode and Triton) in the same way.
    return jnp.abs(x) <= _FLOAT32_MAX


class CandidateBounds(NamedTuple):
    """Upper bounds on one step's values in :func:`_candidate`'s formulas, ``[...]`` float32."""

    grad: jax.Array  # |g|, the total gradient sum_k w_k g_k
    mu_hat: jax.Array  # |mu' / bias1|
    nu_hat: jax.Array  # nu' / bias2
    ratio: jax.Array  # |mu_hat / (sqrt(nu_hat) + eps)|, at most mu_hat / eps
    params: jax.Array  # |p'|, with masks in {0, 1}
    sq_norm: jax.Array  # sum of p'^2 over the n parameters


def candidate_bounds(
    row_max: jax.Array,
    weights: jax.Array,
    bounds: TailBounds,
    scalars: TailScalars,
    hyper: AdamHyper,
    n: int,
) -> CandidateBounds:
    """Bounds on the candidate of ``n`` parameters from scalars alone: ``row_max [..., parts]``
    (NaN for a non-finite row, as :func:`gram` gives it), ``weights [..., parts]``. Exact
    arithmetic; ``_BOUND_LIMIT``'s margin covers the float32 rounding."""
    f32 = jnp.float32
    grad = jnp.sum(jnp.abs(weights) * row_max, axis=-1)
    mu_hat = (hyper.b1 * bounds.mu + (1 - hyper.b1) * grad) / jnp.asarray(scalars.bias1, f32)
    nu_hat = (hyper.b2 * bounds.nu + (1 - hyper.b2) * grad * grad) / jnp.asarray(scalars.bias2, f32)
    ratio = mu_hat / f32(hyper.eps)  # sqrt(nu_hat) + eps >= eps; inf when eps is 0
    params = bounds.params + jnp.asarray(scalars.lr, f32) * ratio  # |(p m + u) m| <= |p| + |u|
    return CandidateBounds(grad, mu_hat, nu_hat, ratio, params, n * params * params)


def provably_finite(b: CandidateBounds) -> jax.Array:
    """Whether the bounds ``b`` show the total gradient, the candidate and its squared norm
    finite: every bound (and the total's square, which nu takes) below ``_BOUND_LIMIT``; NaN
    compares False, and the guard's sums decide. -> ``[...]`` bool."""
    shown = [x <= _BOUND_LIMIT for x in (b.grad * b.grad, b.mu_hat, b.nu_hat, b.ratio, b.sq_norm)]
    return functools.reduce(jnp.logical_and, shown)


def gram_reference(grads: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``grads [parts, P]`` -> ``(row_max [parts], gram [parts, parts])``: max |g_k| (NaN for a
    non-finite row) and the Gram matrix of the rows divided by their max (1 for a zero row)."""
    g = jnp.asarray(grads, jnp.float32)
    finite = jnp.all(_finite(g), axis=1)
    row_max = jnp.max(jnp.abs(g), axis=1)
    scaled = g / jnp.where(row_max > 0, row_max, 1.0)[:, None]
    gram = jnp.sum(scaled[:, None, :] * scaled[None, :, :], axis=-1)
    return jnp.where(finite, row_max, jnp.nan), gram


def _candidate(
    g: jax.Array, old: TailVectors, scalars: TailScalars, hyper: AdamHyper
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Adam on the total gradient ``g`` (optax's scale_by_adam and scale_by_learning_rate
    operations in order), the masks and the target sync: new parameters, target, mu and nu."""
    b1, b2 = hyper.b1, hyper.b2
    new_mu = (1 - b1) * g + b1 * old.mu
    new_nu = (1 - b2) * (g * g) + b2 * old.nu
    update = (
        (new_mu / scalars.bias1) / (jnp.sqrt(new_nu / scalars.bias2) + hyper.eps) * (-scalars.lr)
    )
    if old.masks is None:  # all ones, not read (equal but for a contracted multiply-add)
        new_params = old.params + update
    else:
        new_params = (old.params * old.masks + update) * old.masks
    if hyper.tau > 0:
        new_target = (1.0 - hyper.tau) * old.target + hyper.tau * new_params
    else:
        new_target = jnp.where(scalars.sync > 0.5, new_params, old.target)
    return new_params, new_target, new_mu, new_nu


def adam_select_reference(
    grads: jax.Array, weights: jax.Array, old: TailVectors, scalars: TailScalars, hyper: AdamHyper
) -> AdamSelect:
    """:func:`adam_select` in jnp, for one learner. It always checks (no bounds taken)."""
    g = jnp.sum(jnp.asarray(weights, jnp.float32)[:, None] * grads, axis=0)
    new_params, new_target, new_mu, new_nu = _candidate(g, old, scalars, hyper)
    total_finite = jnp.all(_finite(g))
    sq = jnp.sum(new_params * new_params)
    ok = (scalars.pre_ok > 0.5) & total_finite & _finite(sq)
    params, mu, nu = (
        jnp.where(ok, new, kept)
        for new, kept in ((new_params, old.params), (new_mu, old.mu), (new_nu, old.nu))
    )
    target = jnp.where(ok, new_target, old.target)
    bounds = TailBounds(*(jnp.max(jnp.abs(x)) for x in (params, mu, nu)))
    return AdamSelect(params, target, mu, nu, total_finite, sq, ok, bounds)


def _block_load(ref, start, index, n):
    return plgpu.load(ref.at[pl.ds(start, BLOCK)], mask=index < n, other=0.0)


def _segment_blocks(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """The first block of each segment and, last, the number of blocks (no block spans two
    segments)."""
    return tuple(itertools.accumulate((pl.cdiv(n, BLOCK) for n in sizes), initial=0))


def _per_segment(block, sizes: tuple[int, ...], body) -> None:
    """``body(k, local)`` for the segment ``k`` that ``block`` falls in, ``local`` its block
    number there."""
    firsts = _segment_blocks(sizes)
    if len(sizes) == 1:
        body(0, block)
        return
    for k in range(len(sizes)):
        pl.when((block >= firsts[k]) & (block < firsts[k + 1]))(
            functools.partial(body, k, block - firsts[k])
        )


def _groups(refs, segmented: tuple[bool, ...], n_segments: int) -> list[tuple[Any, ...]]:
    """The vectors' refs, one group per vector: its segments' refs, or the flat vector's."""
    groups, at = [], 0
    for split in segmented:
        width = n_segments if split else 1
        groups.append(tuple(refs[at : at + width]))
        at += width
    return groups


def _slot(group, split: bool, k: int, learner, local, sizes: tuple[int, ...]):
    """(ref, first element) of a ``learner``'s block ``local`` of segment ``k``."""
    if split:
        return group[k], learner * sizes[k] + local * BLOCK
    return group[0], learner * sum(sizes) + sum(sizes[:k]) + local * BLOCK


def _gram_kernel(*refs, parts: int, sizes: tuple[int, ...]):
    """Per block: max |x_k|, the non-finite count of each row, and the Gram matrix of the rows
    divided by the block's max; :func:`gram_pallas` rescales the blocks to the global max."""
    *g_refs, out_ref = refs
    learner, block = pl.program_id(0), pl.program_id(1)
    blocks = pl.num_programs(1)

    def segment(k, local):
        n = sizes[k]
        index = local * BLOCK + jnp.arange(BLOCK, dtype=jnp.int32)
        xs = [
            _block_load(g_refs[k], (learner * parts + j) * n + local * BLOCK, index, n)
            for j in range(parts)
        ]
        maxes = [jnp.max(jnp.abs(x)) for x in xs]
        bad = [jnp.sum(jnp.where(_finite(x), 0.0, 1.0)) for x in xs]
        scaled = [x / jnp.where(m > 0, m, 1.0) for x, m in zip(xs, maxes, strict=True)]
        width = _stats_width(parts)
        lane = jnp.arange(width, dtype=jnp.int32)
        out = jnp.zeros((width,), jnp.float32)
        for i in range(parts):
            out = jnp.where(lane == i, maxes[i], out)
            out = jnp.where(lane == parts + i, bad[i], out)
            for j in range(i, parts):
                value = jnp.sum(scaled[i] * scaled[j])
                out = jnp.where(lane == 2 * parts + i * parts + j, value, out)
        plgpu.store(out_ref.at[pl.ds((learner * blocks + block) * width, width)], out)

    _per_segment(block, sizes, segment)


def _stats_width(parts: int) -> int:
    """gram's output per block: max [parts], non-finite count [parts], gram [parts^2], padded to
    a power of two (Triton's block shapes are)."""
    return pl.next_power_of_2(parts * (parts + 2))


def _coef_width(parts: int) -> int:
    return pl.next_power_of_2(_EXACT + 1 + parts)


def _coefficients(coef_ref, learner, parts: int):
    """The learner's scalars (bias1, bias2, ok, sync, lr, exact, then the parts' weights)."""
    width = _coef_width(parts)
    coefs = plgpu.load(coef_ref.at[pl.ds(learner * width, width)])
    lane = jnp.arange(width, dtype=jnp.int32)
    # A scalar out of the loaded vector (Triton has no element extract): a masked sum.
    return tuple(jnp.sum(jnp.where(lane == i, coefs, 0.0)) for i in range(_EXACT + 1 + parts))


def _adam_block(learner, k, local, g_refs, refs, *, parts, sizes, hyper, masks, segmented):
    """The ``learner``'s block ``local`` of segment ``k``: the total gradient, the candidate and
    old (params, target, mu, nu), the ``ok`` and ``sync`` coefficients and the lanes in range.
    ``refs``: the present :class:`TailVectors` (segmented where ``segmented`` says), then the
    coefficients. Program ids come as arguments: interpret mode cannot read them in a
    ``pl.when`` branch."""
    *vector_refs, coef_ref = refs
    groups = _groups(vector_refs, segmented, len(sizes))
    n = sizes[k]
    index = local * BLOCK + jnp.arange(BLOCK, dtype=jnp.int32)
    bias1, bias2, ok, sync, lr, _, *weights = _coefficients(coef_ref, learner, parts)
    g = weights[0] * _block_load(g_refs[k], learner * parts * n + local * BLOCK, index, n)
    for j in range(1, parts):
        row = _block_load(g_refs[k], (learner * parts + j) * n + local * BLOCK, index, n)
        g = g + weights[j] * row
    target_index = 2 if masks else 1
    # With a hard sync the new target is the new parameters or the old target unwritten (the
    # write kernel stores it only where due): the old one is never read. Zeros stand in for it.
    loaded = [
        _block_load(*_slot(group, split, k, learner, local, sizes), index, n)
        if i != target_index or hyper.tau > 0
        else jnp.zeros((BLOCK,), jnp.float32)
        for i, (group, split) in enumerate(zip(groups, segmented, strict=True))
    ]
    old = TailVectors(*loaded) if masks else TailVectors(loaded[0], None, *loaded[1:])
    new = _candidate(g, old, TailScalars(bias1, bias2, ok, sync, lr), hyper)
    old_values = (old.params, old.target, old.mu, old.nu)
    return g, new, old_values, (ok, sync), index < n


def _adam_sums_kernel(*refs, segments: int, **static):
    """Per block: the total gradient's non-finite count and the candidate's sum of squares, or
    zeros without reading anything where the learner's ``exact`` coefficient is 0 (its
    candidate is provably finite: :func:`provably_finite`)."""
    g_refs, (*inputs, stats_out) = refs[:segments], refs[segments:]
    learner, block = pl.program_id(0), pl.program_id(1)
    out = stats_out.at[pl.ds((learner * pl.num_programs(1) + block) * 2, 2)]
    exact = _coefficients(inputs[-1], learner, static["parts"])[_EXACT]

    def segment(k, local):
        g, (new_params, *_), *_ = _adam_block(learner, k, local, g_refs, inputs, **static)
        lane = jnp.arange(2, dtype=jnp.int32)
        bad = jnp.sum(jnp.where(_finite(g), 0.0, 1.0))
        plgpu.store(out, jnp.where(lane == 0, bad, jnp.sum(new_params * new_params)))

    @pl.when(exact > 0.5)
    def _sums():
        _per_segment(block, static["sizes"], segment)

    @pl.when(exact <= 0.5)
    def _shown():
        plgpu.store(out, jnp.zeros((2,), jnp.float32))


def _adam_write_kernel(*refs, segments: int, written: tuple[bool, ...], **static):
    """Per block: the candidate where the learner's ``ok`` coefficient is 1, else the old.

    Outputs alias their inputs, so an element not stored keeps its old value. With a hard sync
    (tau 0) the target is stored only where the sync is due and the step kept: on other steps it
    is neither read nor written."""
    g_refs, rest = refs[:segments], refs[segments:]
    n_out = sum(segments if split else 1 for split in written)
    inputs, outs, stats_out = rest[: -n_out - 1], rest[-n_out - 1 : -1], rest[-1]
    p_out, t_out, mu_out, nu_out = zip(_groups(outs, written, segments), written, strict=True)
    learner, block = pl.program_id(0), pl.program_id(1)
    stats_at = (learner * pl.num_programs(1) + block) * _WRITE_STATS

    def segment(k, local):
        _, new, old, (ok, sync), in_range = _adam_block(learner, k, local, g_refs, inputs, **static)
        new_params, new_target, new_mu, new_nu = new
        old_params, old_target, old_mu, old_nu = old

        def store(out, value, mask):
            ref, start = _slot(*out, k, learner, local, static["sizes"])
            plgpu.store(ref.at[pl.ds(start, BLOCK)], value, mask=mask)

        # The stats: the candidate's sum of squares (the guard's) and the largest |x| stored, the
        # next TailBounds (up to contraction differences, which provably_finite's margin
        # covers). Out-of-range lanes hold 0.
        stats = [jnp.sum(new_params * new_params)]
        for ref, fresh, old_value in (
            (p_out, new_params, old_params),
            (mu_out, new_mu, old_mu),
            (nu_out, new_nu, old_nu),
        ):
            kept = jnp.where(ok > 0.5, fresh, old_value)
            store(ref, kept, in_range)
            stats.append(jnp.max(jnp.abs(kept)))
        lane = jnp.arange(_WRITE_STATS, dtype=jnp.int32)
        packed = jnp.zeros((_WRITE_STATS,), jnp.float32)
        for i, value in enumerate(stats):
            packed = jnp.where(lane == i, value, packed)
        plgpu.store(stats_out.at[pl.ds(stats_at, _WRITE_STATS)], packed)
        if static["hyper"].tau > 0:
            store(t_out, jnp.where(ok > 0.5, new_target, old_target), in_range)
        else:
            store(t_out, new_params, in_range & (ok > 0.5) & (sync > 0.5))

    _per_segment(block, static["sizes"], segment)


def _params() -> plgpu.CompilerParams:
    return plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1)


def _segments(grads: Segments) -> tuple[int, int, tuple[int, ...]]:
    """``(learners, parts, sizes)`` of the ``[L, parts, n_k]`` segments, checked."""
    learners, parts = grads[0].shape[:2]
    if any(g.ndim != 3 or g.shape[:2] != (learners, parts) for g in grads):
        shapes = [g.shape for g in grads]
        raise ValueError(f"flat_tail: segments must be [L, parts, n_k] alike, got {shapes}")
    sizes = tuple(int(g.shape[2]) for g in grads)
    if parts < 2:
        raise ValueError(f"flat_tail: want at least 2 loss parts (MSE and C51), got {parts}")
    if learners * parts * sum(sizes) + BLOCK >= 2**31:
        raise ValueError(
            f"flat_tail: {learners} learners x {parts} x {sum(sizes)} exceed the kernels' int32"
            " offsets"
        )
    return learners, parts, sizes


def _flat_segments(grads: Segments) -> list[jax.Array]:
    return [g.astype(jnp.float32).reshape(-1) for g in grads]


def _vector_pieces(
    name: str, x: jax.Array | Segments, learners: int, sizes: tuple[int, ...]
) -> tuple[jax.Array, ...]:
    """A ``[L, P]`` vector as one flat array, or its ``[L, n_k]`` segments as one flat array
    each (the gradient's segment sizes, checked)."""
    if not isinstance(x, tuple):
        return tuple(_flat_segments((x,)))
    if tuple(p.shape for p in x) != tuple((learners, n) for n in sizes):
        shapes = [p.shape for p in x]
        raise ValueError(f"flat_tail: {name} segments {shapes} do not match the gradient's {sizes}")
    return tuple(_flat_segments(x))


def gram_pallas(grads: Segments, *, interpret: bool) -> tuple[jax.Array, jax.Array]:
    """``[L, parts, n_k]`` segments -> ``(row_max [L, parts], gram [L, parts, parts])``.

    Each block's Gram matrix is of its rows divided by the block's max ``m_b``; rescaled by
    ``m_b / M`` (<= 1, ``M`` the row's max) they sum to the whole one, without overflow."""
    learners, parts, sizes = _segments(grads)
    blocks = _segment_blocks(sizes)[-1]
    out = pl.pallas_call(
        functools.partial(_gram_kernel, parts=parts, sizes=sizes),
        out_shape=jax.ShapeDtypeStruct((learners * blocks * _stats_width(parts),), jnp.float32),
        grid=(learners, blocks),
        interpret=interpret,
        compiler_params=_params(),
        name="flat_tail_gram",
    )(*_flat_segments(grads)).reshape(learners, blocks, _stats_width(parts))
    maxes, bad = out[..., :parts], out[..., parts : 2 * parts]  # [L, blocks, parts]
    upper = out[..., 2 * parts : 2 * parts + parts * parts].reshape(learners, blocks, parts, parts)
    block_gram = jnp.triu(upper) + jnp.swapaxes(jnp.triu(upper, 1), -1, -2)
    row_max = jnp.max(maxes, axis=1)  # [L, parts]
    ratio = maxes / jnp.where(row_max > 0, row_max, 1.0)[:, None, :]  # [L, blocks, parts]
    gram_ = jnp.sum(ratio[..., :, None] * block_gram * ratio[..., None, :], axis=1)
    return jnp.where(jnp.sum(bad, axis=1) > 0, jnp.nan, row_max), gram_


def adam_select_pallas(
    grads: Segments,
    weights: jax.Array,
    old: TailVectors,
    scalars: TailScalars,
    bounds: TailBounds,
    row_max: jax.Array,
    *,
    hyper: AdamHyper,
    interpret: bool,
) -> AdamSelect:
    """:func:`adam_select` on ``L`` learners (``[L, parts, n_k]`` segments, ``weights [L,
    parts]``, vectors ``[L, P]``, scalars and bounds ``[L]``, ``row_max [L, parts]``): the
    guard's sums for the learners not provably finite, then the decided values written in place."""
    learners, parts, sizes = _segments(grads)
    n = sum(sizes)
    blocks = _segment_blocks(sizes)[-1]
    shown = provably_finite(candidate_bounds(row_max, weights, bounds, scalars, hyper, n))  # [L]
    coefs = jnp.zeros((learners, _coef_width(parts)), jnp.float32)
    coefs = coefs.at[:, _EXACT + 1 : _EXACT + 1 + parts].set(weights)
    for column, value in zip(
        (_BIAS1, _BIAS2, _SYNC, _LR, _EXACT),
        (scalars.bias1, scalars.bias2, scalars.sync, scalars.lr, ~shown),
        strict=True,
    ):
        coefs = coefs.at[:, column].set(jnp.asarray(value, jnp.float32))
    # Without masks (no pruning) the kernels neither take nor read them.
    present = {name: x for name, x in zip(TailVectors._fields, old, strict=True) if x is not None}
    pieces = {name: _vector_pieces(name, x, learners, sizes) for name, x in present.items()}
    vectors = [piece for name in present for piece in pieces[name]]
    flat_grads = _flat_segments(grads)
    static: dict[str, Any] = dict(
        segments=len(sizes),
        parts=parts,
        sizes=sizes,
        hyper=hyper,
        masks=old.masks is not None,
        segmented=tuple(isinstance(x, tuple) for x in present.values()),
    )
    # Input positions (after the gradient segments) of params, target, mu and nu: written in place.
    widths = [len(p) for p in pieces.values()]
    firsts = dict(zip(present, itertools.accumulate(widths[:-1], initial=0), strict=True))
    written = ("params", "target", "mu", "nu")
    inputs_at = [len(sizes) + firsts[w] + i for w in written for i in range(len(pieces[w]))]
    aliases = {at: k for k, at in enumerate(inputs_at)}
    stats = pl.pallas_call(
        functools.partial(_adam_sums_kernel, **static),
        out_shape=jax.ShapeDtypeStruct((learners * blocks * 2,), jnp.float32),
        grid=(learners, blocks),
        interpret=interpret,
        compiler_params=_params(),
        name="flat_tail_adam_sums",
    )(*flat_grads, *vectors, coefs.reshape(-1)).reshape(learners, blocks, 2)
    # Where the candidate is provably finite the sums are zeros, and the checks they feed pass.
    total_finite = shown | (jnp.sum(stats[..., 0], axis=1) == 0)
    checked_sq_norm = jnp.sum(stats[..., 1], axis=1)
    passed = shown | (total_finite & _finite(checked_sq_norm))
    ok = (jnp.asarray(scalars.pre_ok, jnp.float32) > 0.5) & passed
    coefs = coefs.at[:, _OK].set(ok.astype(jnp.float32))
    out_shapes = [jax.ShapeDtypeStruct(p.shape, jnp.float32) for w in written for p in pieces[w]]
    *outs, stats = pl.pallas_call(
        functools.partial(
            _adam_write_kernel,
            written=tuple(isinstance(present[w], tuple) for w in written),
            **static,
        ),
        out_shape=(
            *out_shapes,
            jax.ShapeDtypeStruct((learners * blocks * _WRITE_STATS,), jnp.float32),
        ),
        grid=(learners, blocks),
        # Each element is read and then written by its own program: the state's buffers are
        # updated in place (params -> params, target -> target, mu -> mu, nu -> nu).
        input_output_aliases=aliases,
        interpret=interpret,
        compiler_params=_params(),
        name="flat_tail_adam_write",
    )(*flat_grads, *vectors, coefs.reshape(-1))
    stats = stats.reshape(learners, blocks, _WRITE_STATS)
    new: dict[str, Any] = {}
    for name in written:  # each in the form it came in
        taken, outs = outs[: len(pieces[name])], outs[len(pieces[name]) :]
        shaped = tuple(x.reshape(learners, -1) for x in taken)
        new[name] = shaped if isinstance(present[name], tuple) else shaped[0]
    return AdamSelect(
        **new,
        total_finite=total_finite,
        params_sq_norm=jnp.sum(stats[..., 0], axis=1),  # as the sums launch sums it
        applied=ok,
        bounds=TailBounds(*(jnp.max(stats[..., i], axis=1) for i in (1, 2, 3))),
    )


@functools.cache
def _gram_folding(interpret: bool):
    return learner_folding(functools.partial(gram_pallas, interpret=interpret))


@functools.cache
def _adam_folding(interpret: bool, hyper: AdamHyper):
    return learner_folding(functools.partial(adam_select_pallas, hyper=hyper, interpret=interpret))


def _check_impl(impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"flat_tail: impl must be one of {IMPLS}, got {impl!r}")


def _one(tree):
    """A leading learner axis of 1 on every leaf."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32)[None], tree)


def _as_segments(grads: Grads) -> Segments:
    if hasattr(grads, "shape"):
        return (jnp.asarray(grads),)  # type: ignore[arg-type]
    return tuple(jnp.asarray(g) for g in grads)


def _joined(x: jax.Array | Segments) -> jax.Array:
    """A vector given flat or in segments, flat."""
    return jnp.concatenate(x, axis=-1) if isinstance(x, tuple) else x


def _like(flat: jax.Array, form: jax.Array | Segments) -> jax.Array | Segments:
    """``flat`` in the form of ``form``: flat, or cut into segments of its sizes."""
    if not isinstance(form, tuple):
        return flat
    cuts = list(itertools.accumulate(p.shape[-1] for p in form[:-1]))
    return tuple(jnp.split(flat, cuts, axis=-1))


def gram(grads: Grads, impl: Impl = "pallas") -> tuple[jax.Array, jax.Array]:
    """``grads [parts, P]`` (parts >= 2) or its segments ``[parts, n_k]`` -> ``(row_max [parts],
    gram [parts, parts])`` (:func:`gram_reference`). Under ``jax.vmap``: one launch."""
    _check_impl(impl)
    segments = _as_segments(grads)
    if impl == "reference":
        return gram_reference(jnp.concatenate(segments, axis=-1))
    row_max, gram_ = _gram_folding(impl == "interpret")(_one(segments))
    return row_max[0], gram_[0]


def adam_select(
    grads: Grads,
    weights: jax.Array,
    old: TailVectors,
    scalars: TailScalars,
    hyper: AdamHyper,
    impl: Impl = "pallas",
    bounds: TailBounds | None = None,
    row_max: jax.Array | None = None,
) -> AdamSelect:
    """One learner's Adam step on ``sum_k weights[k] grads[k]`` (``grads [parts, P]`` or its
    segments ``[parts, n_k]``), with masks and target sync, kept only when ``scalars.pre_ok``
    and the total gradient and new parameters' squared norm are finite; otherwise ``old`` comes
    back. Under ``jax.vmap``: one launch.

    ``bounds`` (the previous ``AdamSelect.bounds``) and ``row_max`` (:func:`gram`'s) let the
    kernels skip the guard's sums where :func:`provably_finite` shows they pass (same result)."""
    _check_impl(impl)
    segments = _as_segments(grads)
    if impl == "reference":
        flat_old = TailVectors(*(None if x is None else _joined(x) for x in old))
        g, w, vectors, values = jax.tree.map(
            lambda x: jnp.asarray(x, jnp.float32),
            (jnp.concatenate(segments, axis=-1), weights, flat_old, scalars),
        )
        out = adam_select_reference(g, w, vectors, values, hyper)
        written = ("params", "target", "mu", "nu")  # each in the form it came in
        shaped: dict[str, Any] = {x: _like(getattr(out, x), getattr(old, x)) for x in written}
        return out._replace(**shaped)
    if bounds is None or row_max is None:
        bounds, row_max = unknown_bounds(), jnp.full(jnp.shape(weights), jnp.nan, jnp.float32)
    args = _one((segments, weights, old, scalars, bounds, row_max))
    out = _adam_folding(impl == "interpret", hyper)(*args)
    return jax.tree.map(lambda x: x[0], out)
