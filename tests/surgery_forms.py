"""The gradient surgery's two steps as readable separate functions (Gradient Vaccine, then the
down-only budget): the forms ``jdqn.agent.surgery.gradient_surgery`` fuses, kept here as the
tests' reference, on the product's own scalar helpers."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jdqn.agent.surgery import _budget_scale, _norm, _unit, _vaccine_scalars


class VaccineResult(NamedTuple):
    """Gradients after Gradient Vaccine and the updated cosine target."""

    g1: jax.Array  # [P] float32, first loss part's gradient (MSE) after surgery
    g2: jax.Array  # [P] float32, second loss part's gradient (C51) after surgery
    phi_hat: jax.Array  # [] float32, new EMA of the cosine, in [-0.99, 0.99]
    phi: jax.Array  # [] float32, cos(g1, g2) before surgery (0 when a norm is 0)
    applied: jax.Array  # [] bool, whether the gradients were changed


def gradient_vaccine(
    g1: jax.Array, g2: jax.Array, phi_hat: jax.Array, beta: float | jax.Array
) -> VaccineResult:
    """Gradient Vaccine (Wang et al., ICLR 2021, Algorithm 1) for two loss parts.

    ``phi = cos(g1, g2)``. If ``phi < phi_hat``, each gradient gets a component along the other so
    that its cosine with the other's ORIGINAL gradient becomes exactly ``phi_hat``:

        k   = (phi_hat sqrt(1-phi^2) - phi sqrt(1-phi_hat^2)) / sqrt(1-phi_hat^2)
        g1' = g1 + |g1| k / |g2| g2
        g2' = g2 + |g2| k / |g1| g1

    (the numerator of ``k`` is ``sin(theta - theta_hat)`` with ``phi = cos theta``, positive exactly
    when ``phi < phi_hat``). Then ``phi_hat <- (1-beta) phi_hat + beta phi``, clamped to
    [-0.99, 0.99].

    When either norm is 0 or ``|g2| < 1e-8 |g1|`` (C51 weight alpha ~ 0), nothing changes, not
    even ``phi_hat``: the cosine of a numerically absent gradient is noise that would drag the
    EMA toward 0 in the MSE-only phase. When ``phi >= phi_hat`` the EMA updates, as in the paper.
    """
    g1 = jnp.asarray(g1, jnp.float32)
    g2 = jnp.asarray(g2, jnp.float32)
    norm1, norm2 = _norm(g1), _norm(g2)  # [] float32
    unit1, unit2 = _unit(g1, norm1), _unit(g2, norm2)  # [P] float32, 0 for zero vectors
    phi = jnp.clip(jnp.dot(unit1, unit2), -1.0, 1.0)  # [] float32, 0 when a norm is 0
    _, applied, coef1, coef2, new_phi_hat = _vaccine_scalars(norm1, norm2, phi, phi_hat, beta)
    # |g1| / |g2| * g2 == |g1| * unit(g2): written with unit vectors so no ratio of norms can
    # overflow when one gradient is much smaller than the other.
    new_g1 = g1 + coef1 * unit2
    new_g2 = g2 + coef2 * unit1
    return VaccineResult(g1=new_g1, g2=new_g2, phi_hat=new_phi_hat, phi=phi, applied=applied)


def budget_clip(
    g: jax.Array, share: float | jax.Array, budget: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Down-only gradient budget, ``(g * scale, scale)`` with ``scale = min(1, share * budget /
    |g|)``: norm clipping (Pascanu et al., ICML 2013) per loss part with a shared budget. A zero
    vector keeps scale 1; ``share = 0`` zeroes ``g``; a non-finite ``g`` stays non-finite, for
    the learner's guard to catch."""
    g = jnp.asarray(g, jnp.float32)
    scale = _budget_scale(_norm(g), share, budget)
    return g * scale, scale
