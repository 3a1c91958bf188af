"""The learner step's flat tail as two Pallas GPU kernels: the surgery's reductions, then Adam,
the target sync and the guard's keep-or-reject select in one pass per learner.

The step's parameters, target parameters, masks and Adam moments are flat ``[P]`` float32
vectors and its loss parts' gradients a ``[parts, P]`` matrix (``jdqn.networks.ParamLayout``).
What XLA makes of the tail on the H200 is ~30 small kernels per step: the split reductions of
the surgery, Adam's fusions, the sync and one ``select`` per state vector (XLA does not fuse
sibling selects that share only a predicate), ~1.2 us each (BENCHMARKS.md, issue 6). Here:

- :func:`gram` reads the ``[parts, P]`` gradients twice (max-abs per row, then the Gram matrix of
  the max-abs-rescaled rows) and returns ``row_max [parts]`` and ``gram [parts, parts]``, the
  only reductions Gradient Vaccine (Wang et al., ICLR 2021) and the budget (Pascanu et al., ICML
  2013) need (``jdqn.surgery.surgery_scalars`` turns them into the total gradient's weights);
- :func:`adam_select` forms the total gradient ``sum_k w_k g_k``, applies Adam (Kingma & Ba,
  ICLR 2015; optax's ``scale_by_adam`` formulas and order of operations), the masks and the
  target sync, and keeps the candidate only when the guard passes: the guard needs the total's
  finiteness and the new parameters' squared norm, so the kernel makes one pass for those and a
  second that recomputes the candidate and writes the selected values.

One program per learner (the grid is the folded ``vmap`` axes), looping over the vector in
chunks, so one launch serves one seed or 1,024 and no reduction crosses programs. Every element
is written by its own program: no atomics, a fixed summation order, deterministic results.

Non-finite gradients: a row with any non-finite entry gets a NaN ``row_max`` (counted
explicitly; a max over NaN is not reliable across backends), which the guard reads as "the
gradient is non-finite", as it reads the reference's inf/NaN max.

``impl``: ``"pallas"`` (Triton-lowered, GPU), ``"interpret"`` (the same kernels in interpret
mode, CPU tests) or ``"reference"`` (the formulas in jnp: what the kernels are tested against).
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

Impl = Literal["pallas", "interpret", "reference"]
IMPLS: tuple[str, ...] = ("pallas", "interpret", "reference")

# Elements of one vector a program handles per loop iteration, and its Triton warps.
CHUNK = 2048
NUM_WARPS = 8
_FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)
_STATS = 16  # width of gram's per-learner output: row_max [parts] then gram [parts^2]
_COEFS = 8  # adam_select's per-learner scalars (see _COEF_NAMES)
_COEF_NAMES = ("w0", "w1", "w2", "bias1", "bias2", "pre_ok", "sync")


class AdamSelect(NamedTuple):
    """What :func:`adam_select` returns; leaves gain the caller's vmapped axes."""

    params: jax.Array  # [P] the new parameters if the guard passed, else the old ones
    target: jax.Array  # [P] target parameters after the sync, or the old ones
    mu: jax.Array  # [P] Adam's first moment, or the old one
    nu: jax.Array  # [P] Adam's second moment, or the old one
    total_finite: jax.Array  # [] bool, every entry of the total gradient is finite
    params_sq_norm: jax.Array  # [] float32, squared norm of the candidate parameters
    applied: jax.Array  # [] bool, the candidate was kept


def _finite(x: jax.Array) -> jax.Array:
    # |x| <= max finite float32 is False for inf and NaN; written as a comparison because it
    # lowers everywhere (interpret mode and Triton) in the same way.
    return jnp.abs(x) <= _FLOAT32_MAX


# --------------------------------------------------------------------------------------------
# References (jnp): the formulas the kernels are tested against.
# --------------------------------------------------------------------------------------------


def gram_reference(grads: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``grads [parts, P]`` -> ``(row_max [parts], gram [parts, parts])``: max |g_k| (NaN for a
    row with a non-finite entry) and the Gram matrix of the rows divided by their max (1 for a
    zero row), summed in float32."""
    g = jnp.asarray(grads, jnp.float32)
    finite = jnp.all(_finite(g), axis=1)
    row_max = jnp.max(jnp.abs(g), axis=1)
    scaled = g / jnp.where(row_max > 0, row_max, 1.0)[:, None]
    gram = jnp.sum(scaled[:, None, :] * scaled[None, :, :], axis=-1)
    return jnp.where(finite, row_max, jnp.nan), gram


def _candidate(g, params, masks, target, mu, nu, bias1, bias2, sync, *, b1, b2, eps, lr, tau):
    """Adam on the total gradient ``g`` (optax.scale_by_adam then scale_by_learning_rate, the
    same operations in the same order), masks, and the target sync."""
    new_mu = (1 - b1) * g + b1 * mu
    new_nu = (1 - b2) * (g * g) + b2 * nu
    update = (new_mu / bias1) / (jnp.sqrt(new_nu / bias2) + eps) * (-lr)
    new_params = (params * masks + update) * masks
    if tau > 0:
        new_target = (1.0 - tau) * target + tau * new_params
    else:
        new_target = jnp.where(sync > 0.5, new_params, target)
    return new_params, new_target, new_mu, new_nu


def adam_select_reference(
    grads,
    weights,
    params,
    masks,
    target,
    mu,
    nu,
    bias1,
    bias2,
    pre_ok,
    sync,
    *,
    b1,
    b2,
    eps,
    lr,
    tau,
) -> AdamSelect:
    """:func:`adam_select` in jnp, for one learner."""
    g = jnp.sum(jnp.asarray(weights, jnp.float32)[:, None] * grads, axis=0)
    new_params, new_target, new_mu, new_nu = _candidate(
        g,
        params,
        masks,
        target,
        mu,
        nu,
        bias1,
        bias2,
        sync,
        b1=b1,
        b2=b2,
        eps=eps,
        lr=lr,
        tau=tau,
    )
    total_finite = jnp.all(_finite(g))
    sq = jnp.sum(new_params * new_params)
    ok = (pre_ok > 0.5) & total_finite & _finite(sq)
    return AdamSelect(
        params=jnp.where(ok, new_params, params),
        target=jnp.where(ok, new_target, target),
        mu=jnp.where(ok, new_mu, mu),
        nu=jnp.where(ok, new_nu, nu),
        total_finite=total_finite,
        params_sq_norm=sq,
        applied=ok,
    )


# --------------------------------------------------------------------------------------------
# Kernels: one program per learner, chunks of CHUNK elements.
# --------------------------------------------------------------------------------------------


def _chunk_load(ref, start, index, n):
    return plgpu.load(ref.at[pl.ds(start, CHUNK)], mask=index < n, other=0.0)


def _gram_kernel(g_ref, out_ref, *, parts: int, n: int):
    learner = pl.program_id(0)
    base = learner * parts * n
    lane = jnp.arange(CHUNK, dtype=jnp.int32)
    n_chunks = pl.cdiv(n, CHUNK)

    def rows(c):
        index = c * CHUNK + lane
        return [_chunk_load(g_ref, base + k * n + c * CHUNK, index, n) for k in range(parts)]

    def max_body(c, carry):
        maxes, bad = carry
        xs = rows(c)
        maxes = tuple(jnp.maximum(m, jnp.abs(x)) for m, x in zip(maxes, xs, strict=True))
        bad = tuple(b + jnp.where(_finite(x), 0.0, 1.0) for b, x in zip(bad, xs, strict=True))
        return maxes, bad

    zeros = jnp.zeros((CHUNK,), jnp.float32)
    maxes, bad = jax.lax.fori_loop(0, n_chunks, max_body, (tuple(zeros for _ in range(parts)),) * 2)
    row_max = [jnp.max(m) for m in maxes]
    safe = [jnp.where(m > 0, m, 1.0) for m in row_max]
    pairs = [(k, j) for k in range(parts) for j in range(k, parts)]

    def gram_body(c, acc):
        scaled = [x / s for x, s in zip(rows(c), safe, strict=True)]
        return tuple(a + scaled[k] * scaled[j] for a, (k, j) in zip(acc, pairs, strict=True))

    acc = jax.lax.fori_loop(0, n_chunks, gram_body, tuple(zeros for _ in pairs))
    sums = dict(zip(pairs, (jnp.sum(a) for a in acc), strict=True))
    lane_out = jnp.arange(_STATS, dtype=jnp.int32)
    out = jnp.zeros((_STATS,), jnp.float32)
    for k in range(parts):
        value = jnp.where(jnp.sum(bad[k]) > 0, jnp.nan, row_max[k])
        out = jnp.where(lane_out == k, value, out)
    for (k, j), value in sums.items():
        out = jnp.where(lane_out == parts + k * parts + j, value, out)
        out = jnp.where(lane_out == parts + j * parts + k, value, out)
    plgpu.store(out_ref.at[pl.ds(learner * _STATS, _STATS)], out)


def _adam_kernel(
    g_ref, p_ref, m_ref, t_ref, mu_ref, nu_ref, coef_ref,
    p_out, t_out, mu_out, nu_out, stats_out,
    *, parts: int, n: int, b1: float, b2: float, eps: float, lr: float, tau: float,
):  # fmt: skip
    learner = pl.program_id(0)
    lane = jnp.arange(CHUNK, dtype=jnp.int32)
    n_chunks = pl.cdiv(n, CHUNK)
    coefs = plgpu.load(coef_ref.at[pl.ds(learner * _COEFS, _COEFS)])
    lane_coef = jnp.arange(_COEFS, dtype=jnp.int32)
    # A scalar out of the loaded vector (Triton has no element extract): a masked sum.
    w0, w1, w2, bias1, bias2, pre_ok, sync = (
        jnp.sum(jnp.where(lane_coef == i, coefs, 0.0)) for i in range(len(_COEF_NAMES))
    )
    weights = (w0, w1, w2)[:parts]

    def candidate(c):
        index = c * CHUNK + lane
        start = learner * n + c * CHUNK
        g = weights[0] * _chunk_load(g_ref, learner * parts * n + c * CHUNK, index, n)
        for k in range(1, parts):
            g = g + weights[k] * _chunk_load(
                g_ref, learner * parts * n + k * n + c * CHUNK, index, n
            )
        old = [_chunk_load(ref, start, index, n) for ref in (p_ref, m_ref, t_ref, mu_ref, nu_ref)]
        params, masks, target, mu, nu = old
        new = _candidate(
            g,
            params,
            masks,
            target,
            mu,
            nu,
            bias1,
            bias2,
            sync,
            b1=b1,
            b2=b2,
            eps=eps,
            lr=lr,
            tau=tau,
        )
        return g, new, (params, target, mu, nu), start, index

    def check_body(c, carry):
        bad, sq = carry
        g, (new_params, *_), *_ = candidate(c)
        return bad + jnp.where(_finite(g), 0.0, 1.0), sq + new_params * new_params

    zeros = jnp.zeros((CHUNK,), jnp.float32)
    bad, sq = jax.lax.fori_loop(0, n_chunks, check_body, (zeros, zeros))
    total_finite = jnp.sum(bad) == 0
    sq_norm = jnp.sum(sq)
    ok = (pre_ok > 0.5) & total_finite & _finite(sq_norm)

    def write_body(c, carry):
        _, new, old, start, index = candidate(c)
        for ref, fresh, kept in zip((p_out, t_out, mu_out, nu_out), new, old, strict=True):
            plgpu.store(ref.at[pl.ds(start, CHUNK)], jnp.where(ok, fresh, kept), mask=index < n)
        return carry

    jax.lax.fori_loop(0, n_chunks, write_body, 0)
    lane_out = jnp.arange(4, dtype=jnp.int32)
    stats = jnp.where(lane_out == 0, jnp.where(total_finite, 1.0, 0.0), 0.0)
    stats = jnp.where(lane_out == 1, sq_norm, stats)
    stats = jnp.where(lane_out == 2, jnp.where(ok, 1.0, 0.0), stats)
    plgpu.store(stats_out.at[pl.ds(learner * 4, 4)], stats)


def _check_offsets(learners: int, parts: int, n: int) -> None:
    if learners * parts * n + CHUNK >= 2**31:
        raise ValueError(
            f"flat_tail: {learners} learners x {parts} x {n} exceed the kernels' int32 offsets"
        )


def gram_pallas(grads: jax.Array, *, interpret: bool) -> tuple[jax.Array, jax.Array]:
    """``grads [L, parts, P]`` -> ``(row_max [L, parts], gram [L, parts, parts])``."""
    learners, parts, n = grads.shape
    _check_offsets(learners, parts, n)
    out = pl.pallas_call(
        functools.partial(_gram_kernel, parts=parts, n=n),
        out_shape=jax.ShapeDtypeStruct((learners * _STATS,), jnp.float32),
        grid=(learners,),
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        name="flat_tail_gram",
    )(grads.astype(jnp.float32).reshape(-1)).reshape(learners, _STATS)
    row_max = out[:, :parts]
    gram = out[:, parts : parts + parts * parts].reshape(learners, parts, parts)
    return row_max, gram


def adam_select_pallas(
    grads,
    weights,
    params,
    masks,
    target,
    mu,
    nu,
    bias1,
    bias2,
    pre_ok,
    sync,
    *,
    interpret,
    b1,
    b2,
    eps,
    lr,
    tau,
) -> AdamSelect:
    """:func:`adam_select` on ``L`` learners: vectors ``[L, P]``, ``grads [L, parts, P]``,
    ``weights [L, parts]``, scalars ``[L]``."""
    learners, parts, n = grads.shape
    _check_offsets(learners, parts, n)
    coefs = jnp.zeros((learners, _COEFS), jnp.float32)
    coefs = coefs.at[:, :parts].set(weights)
    for column, value in zip((3, 4, 5, 6), (bias1, bias2, pre_ok, sync), strict=True):
        coefs = coefs.at[:, column].set(jnp.asarray(value, jnp.float32))
    flat = jax.ShapeDtypeStruct((learners * n,), jnp.float32)
    vectors = [x.astype(jnp.float32).reshape(-1) for x in (params, masks, target, mu, nu)]
    new_params, new_target, new_mu, new_nu, stats = pl.pallas_call(
        functools.partial(_adam_kernel, parts=parts, n=n, b1=b1, b2=b2, eps=eps, lr=lr, tau=tau),
        out_shape=(flat, flat, flat, flat, jax.ShapeDtypeStruct((learners * 4,), jnp.float32)),
        grid=(learners,),
        # Each element is read and then written by its own program: the state's buffers are
        # updated in place (params -> params, target -> target, mu -> mu, nu -> nu).
        input_output_aliases={1: 0, 3: 1, 4: 2, 5: 3},
        interpret=interpret,
        compiler_params=plgpu.CompilerParams(num_warps=NUM_WARPS, num_stages=1),
        name="flat_tail_adam",
    )(grads.astype(jnp.float32).reshape(-1), *vectors, coefs.reshape(-1))
    stats = stats.reshape(learners, 4)
    shape = (learners, n)
    return AdamSelect(
        params=new_params.reshape(shape),
        target=new_target.reshape(shape),
        mu=new_mu.reshape(shape),
        nu=new_nu.reshape(shape),
        total_finite=stats[:, 0] > 0.5,
        params_sq_norm=stats[:, 1],
        applied=stats[:, 2] > 0.5,
    )


# --------------------------------------------------------------------------------------------
# Dispatch with vmap rules that fold every mapped axis into the kernels' learner axis.
# --------------------------------------------------------------------------------------------


def _folding(kernel):
    """``kernel`` (arrays with a leading learner axis ``[L, ...]``, a pytree out with one too)
    with a vmap rule that folds the mapped axis into ``L``: nested vmaps end in one launch."""

    @jax.custom_batching.custom_vmap
    def run(*args):
        return kernel(*args)

    @run.def_vmap
    def _fold(axis_size, in_batched, *args):
        args = [
            a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
            for a, batched in zip(args, in_batched, strict=True)
        ]
        learners = args[0].shape[1]
        out = run(*(a.reshape(axis_size * learners, *a.shape[2:]) for a in args))
        out = jax.tree.map(lambda x: x.reshape(axis_size, learners, *x.shape[1:]), out)
        return out, jax.tree.map(lambda _: True, out)

    return run


@functools.cache
def _gram_folding(interpret: bool):
    return _folding(functools.partial(gram_pallas, interpret=interpret))


@functools.cache
def _adam_folding(interpret: bool, b1: float, b2: float, eps: float, lr: float, tau: float):
    return _folding(
        functools.partial(
            adam_select_pallas, interpret=interpret, b1=b1, b2=b2, eps=eps, lr=lr, tau=tau
        )
    )


def gram(grads: jax.Array, impl: Impl = "pallas") -> tuple[jax.Array, jax.Array]:
    """``grads [parts, P]`` (parts 2 or 3) -> ``(row_max [parts], gram [parts, parts])``, see
    :func:`gram_reference`. Works under ``jax.vmap`` (one launch for all mapped learners)."""
    if impl == "reference":
        return gram_reference(grads)
    row_max, gram_ = _gram_folding(impl == "interpret")(jnp.asarray(grads, jnp.float32)[None])
    return row_max[0], gram_[0]


def adam_select(
    grads: jax.Array,
    weights: jax.Array,
    params: jax.Array,
    masks: jax.Array,
    target: jax.Array,
    mu: jax.Array,
    nu: jax.Array,
    bias1: jax.Array,
    bias2: jax.Array,
    pre_ok: jax.Array,
    sync: jax.Array,
    *,
    b1: float,
    b2: float,
    eps: float,
    lr: float,
    tau: float,
    impl: Impl = "pallas",
) -> AdamSelect:
    """One learner's Adam step on the total gradient ``sum_k weights[k] grads[k]``, its masks and
    target sync, kept only where the guard passes.

    ``grads [parts, P]``, ``weights [parts]``; ``params``, ``masks``, ``target``, ``mu``, ``nu``
    ``[P]``; scalars ``bias1 = 1 - b1^t`` and ``bias2 = 1 - b2^t`` (optax's bias corrections at
    the incremented count ``t``), ``pre_ok`` (every other guard check passed and the learner is
    not halted), ``sync`` (hard target copy due; ignored when ``tau > 0``, which syncs by Polyak
    averaging). The candidate is kept when ``pre_ok``, the total gradient is finite and the new
    parameters' squared norm is finite. Works under ``jax.vmap`` (one launch)."""
    args = [jnp.asarray(a, jnp.float32) for a in (grads, weights, params, masks, target, mu, nu)]
    scalars = [jnp.asarray(a, jnp.float32) for a in (bias1, bias2, pre_ok, sync)]
    hyper = dict(b1=float(b1), b2=float(b2), eps=float(eps), lr=float(lr), tau=float(tau))
    if impl == "reference":
        return adam_select_reference(*args, *scalars, **hyper)
    out = _adam_folding(impl == "interpret", **hyper)(*(a[None] for a in args + scalars))
    return jax.tree.map(lambda x: x[0], out)
