"""Gradient surgery on flat float32 gradients: Gradient Vaccine and the down-only budget
(docs/design.md, section 5, steps 7-8).

The learner's update (``jdqn.accel``) runs them fused, :func:`gradient_surgery` (or, with the
Pallas flat tail, :func:`surgery_scalars` on the kernel's reductions); ``tests/surgery_forms.py``
holds the two as readable separate functions, tested against float64 references. Branch-free
(``jnp.where``), so cheap under ``vmap``; norms are taken of max-abs-rescaled vectors so that
finite gradients near the float32 range do not overflow the sum of squares.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

PHI_HAT_BOUND = 0.99  # |phi_hat| <= 0.99 keeps sqrt(1 - phi_hat^2) >= 0.14 in the denominator
SKIP_RATIO = 1e-8  # |g2| < SKIP_RATIO |g1|: g2 is numerically absent (blend alpha ~ 0)


def _divisor(x: jax.Array) -> jax.Array:
    """``x`` where positive, else 1: dividing a zero vector (or by a zero norm) gives 0."""
    return jnp.where(x > 0, x, 1.0)


def _norm(g: jax.Array) -> jax.Array:
    """Euclidean norm without float32 overflow/underflow of the squares; 0 for a zero vector."""
    scale = jnp.max(jnp.abs(g))  # [] float32
    return scale * jnp.sqrt(jnp.sum(jnp.square(g / _divisor(scale))))


def _unit(g: jax.Array, norm: jax.Array) -> jax.Array:
    return g / _divisor(norm)


def _vaccine_scalars(
    norm1: jax.Array,
    norm2: jax.Array,
    phi: jax.Array,
    phi_hat: float | jax.Array,
    beta: float | jax.Array,
    due: bool | jax.Array = True,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Scalar part of the vaccine: (ratio k, applied, coef1 = |g1| k, coef2 = |g2| k, new
    phi_hat), see ``tests/surgery_forms.py``; when not ``due``, nothing is applied or updated."""
    phi_hat = jnp.asarray(phi_hat, jnp.float32)
    beta = jnp.asarray(beta, jnp.float32)
    due = jnp.asarray(due, jnp.bool_)
    skip = (norm1 == 0) | (norm2 == 0) | (norm2 < SKIP_RATIO * norm1)
    applied = due & (phi < phi_hat) & ~skip
    # (1 - x)(1 + x) rather than 1 - x^2: accurate near |x| = 1.
    sin_phi = jnp.sqrt(jnp.maximum((1.0 - phi) * (1.0 + phi), 0.0))
    sin_phi_hat = jnp.sqrt(jnp.maximum((1.0 - phi_hat) * (1.0 + phi_hat), 0.0))
    # phi_hat is kept in [-0.99, 0.99]; the floor only guards a caller's out-of-range value.
    ratio = (phi_hat * sin_phi - phi * sin_phi_hat) / jnp.maximum(sin_phi_hat, 1e-6)  # [] <= 7.1
    ema = jnp.clip((1.0 - beta) * phi_hat + beta * phi, -PHI_HAT_BOUND, PHI_HAT_BOUND)
    new_phi_hat = jnp.where(skip | ~due, phi_hat, ema).astype(jnp.float32)
    coef1 = jnp.where(applied, norm1 * ratio, 0.0)
    coef2 = jnp.where(applied, norm2 * ratio, 0.0)
    return ratio, applied, coef1, coef2, new_phi_hat


def _budget_scale(
    norm: jax.Array, share: float | jax.Array, budget: float | jax.Array
) -> jax.Array:
    """``min(1, share * budget / norm)``, 1 for a zero norm; NaN norms give 1 (the NaN stays
    in g)."""
    limit = jnp.asarray(share, jnp.float32) * jnp.asarray(budget, jnp.float32)  # []
    scale = jnp.where(norm > limit, limit / _divisor(norm), 1.0)
    return jnp.minimum(scale, 1.0).astype(jnp.float32)


def budget_shares(
    alpha: jax.Array | float, split: str, share_mse: float
) -> tuple[jax.Array, jax.Array]:
    """The budget's (MSE, C51) shares at blend weight ``alpha``: ``(1 - alpha, alpha)`` when
    ``split`` is "alpha" (the budget splits as the loss does, so clipping never reweights the
    blend), else the fixed ``(share_mse, 1 - share_mse)`` while C51 is on and ``(1, 0)`` off."""
    alpha = jnp.asarray(alpha, jnp.float32)
    if split == "alpha":
        return 1.0 - alpha, alpha
    c51_on = alpha > 0
    return jnp.where(c51_on, share_mse, 1.0), jnp.where(c51_on, 1.0 - share_mse, 0.0)


class SurgeryResult(NamedTuple):
    """Both loss parts' gradients after the (due) vaccine and the budget, with what was done."""

    g1: jax.Array  # [P] float32, MSE gradient after vaccine and budget
    g2: jax.Array  # [P] float32, C51 gradient after vaccine and budget
    phi_hat: jax.Array  # [] float32, new EMA (unchanged when the vaccine is not due)
    phi: jax.Array  # [] float32, cos(g1, g2) before surgery
    applied: jax.Array  # [] bool, the vaccine was due and changed the gradients
    norms: jax.Array  # [2] float32, |g1|, |g2| before surgery
    norms_after: jax.Array  # [2] float32, |g1'|, |g2'| after vaccine and budget
    row_max: jax.Array  # [parts] float32, max |g_k|: finite exactly when g_k is (NaN propagates)
    total: jax.Array  # [P] float32, g1' + g2' + the other parts unchanged: what Adam gets
    total_norm: jax.Array  # [] float32, |total|, from the Gram matrix (no pass over total)


class SurgeryScalars(NamedTuple):
    """Every scalar of the surgery, from the rows' max-abs and Gram matrix alone (no vectors)."""

    phi_hat: jax.Array  # [] float32, new EMA (unchanged when the vaccine is not due)
    phi: jax.Array  # [] float32, cos(g1, g2) before surgery
    applied: jax.Array  # [] bool, the vaccine was due and changed the gradients
    norms: jax.Array  # [2] float32, |g1|, |g2| before surgery
    norms_after: jax.Array  # [2] float32, |g1'|, |g2'| after vaccine and budget
    total_norm: jax.Array  # [] float32, |total|
    weights: jax.Array  # [parts] float32, total = sum_k weights[k] g_k over the raw rows
    coefs: jax.Array  # [2] float32, g1' = scales[0] (g1 + coefs[0] unit(g2)), and for g2
    scales: jax.Array  # [2] float32, the budget's down-only scales


def surgery_scalars(
    row_max: jax.Array,
    gram: jax.Array,
    phi_hat: jax.Array,
    beta: float | jax.Array,
    vaccine_due: jax.Array,
    shares: tuple[float | jax.Array, float | jax.Array],
    budget: float | jax.Array,
) -> SurgeryScalars:
    """Gradient Vaccine's (Wang et al., ICLR 2021) and the budget's (Pascanu et al., ICML 2013)
    decisions from ``row_max [parts]`` (max |g_k|) and ``gram [parts, parts]`` (Gram matrix of
    the rows divided by their max), including the weights of the total gradient over the raw
    rows: see :func:`gradient_surgery`, which computes both reductions with jnp, and
    ``pallas_kernels.flat_tail.gram``, which computes them in one GPU kernel."""
    parts = row_max.shape[0]
    root = jnp.sqrt(jnp.diagonal(gram))  # [parts], |g_k| / max|g_k|
    norm1, norm2 = row_max[0] * root[0], row_max[1] * root[1]
    phi = jnp.clip(gram[0, 1] / _divisor(root[0] * root[1]), -1, 1)
    ratio, applied, coef1, coef2, new_phi_hat = _vaccine_scalars(
        norm1, norm2, phi, phi_hat, beta, vaccine_due
    )
    growth = jnp.where(applied, jnp.sqrt(jnp.maximum(1.0 + 2.0 * ratio * phi + ratio**2, 0.0)), 1.0)
    scale1 = _budget_scale(norm1 * growth, shares[0], budget)
    scale2 = _budget_scale(norm2 * growth, shares[1], budget)
    # total = sum_k w_k g_k: g1' = scale1 (g1 + coef1 / |g2| g2) and symmetrically.
    weights = jnp.concatenate(
        [
            jnp.stack(
                [
                    scale1 + scale2 * coef2 / _divisor(norm1),
                    scale2 + scale1 * coef1 / _divisor(norm2),
                ]
            ),
            jnp.ones((parts - 2,), jnp.float32),
        ]
    )  # [parts]
    # |total|^2 = w^T G w over the rescaled rows (weights row_max w). Rescaled by sum |w_k|
    # (>= |total_i|, as |scaled| <= 1) so the quadratic form cannot overflow; elementwise
    # products, not a matmul (which could run in TF32 on the GPU).
    scaled_weights = row_max * weights
    bound = jnp.sum(jnp.abs(scaled_weights))
    unit_weights = scaled_weights / _divisor(bound)
    quadratic = jnp.sum(unit_weights[:, None] * gram * unit_weights[None, :])
    return SurgeryScalars(
        phi_hat=new_phi_hat,
        phi=phi,
        applied=applied,
        norms=jnp.stack([norm1, norm2]),
        norms_after=jnp.stack([scale1 * norm1 * growth, scale2 * norm2 * growth]),
        total_norm=bound * jnp.sqrt(jnp.maximum(quadratic, 0.0)),
        weights=weights,
        coefs=jnp.stack([coef1, coef2]),
        scales=jnp.stack([scale1, scale2]),
    )


def gradient_surgery(
    grads: jax.Array,
    phi_hat: jax.Array,
    beta: float | jax.Array,
    vaccine_due: jax.Array,
    shares: tuple[float | jax.Array, float | jax.Array],
    budget: float | jax.Array,
) -> SurgeryResult:
    """Gradient Vaccine (when ``vaccine_due``; Wang et al., ICLR 2021) then the down-only budget
    (Pascanu et al., ICML 2013) on each part, fused: ``grads [parts, P]`` holds the MSE and C51
    gradients, then further parts that join the sum unchanged.

    Every scalar comes from two reductions: each row's max-abs and the Gram matrix ``G`` of the
    rescaled rows (elementwise float32 products: no TF32 matmul, no overflow). The vaccinated
    norms need no other pass (``|g1'| = |g1| sqrt(1 + 2 k phi + k^2)``), nor does the total's
    (``|total|^2 = w^T G w``, so its rounding is relative to the parts' norms). The output
    vectors are elementwise in the rows, which XLA fuses into Adam.
    """
    g = jnp.asarray(grads, jnp.float32)  # [parts, P]
    row_max = jnp.max(jnp.abs(g), axis=1)  # [parts]
    scaled = g / _divisor(row_max)[:, None]
    gram = jnp.sum(scaled[:, None, :] * scaled[None, :, :], axis=-1)  # [parts]^2, entries <= P
    s = surgery_scalars(row_max, gram, phi_hat, beta, vaccine_due, shares, budget)
    norm1, norm2 = s.norms[0], s.norms[1]
    unit1, unit2 = _unit(g[0], norm1), _unit(g[1], norm2)
    g1 = s.scales[0] * (g[0] + s.coefs[0] * unit2)
    g2 = s.scales[1] * (g[1] + s.coefs[1] * unit1)
    return SurgeryResult(
        g1=g1,
        g2=g2,
        phi_hat=s.phi_hat,
        phi=s.phi,
        applied=s.applied,
        norms=s.norms,
        norms_after=s.norms_after,
        row_max=row_max,
        total=g1 + g2 + jnp.sum(g[2:], axis=0),
        total_norm=s.total_norm,
    )
