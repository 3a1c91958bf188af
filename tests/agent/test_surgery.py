"""Gradient Vaccine and the down-only budget against independent float64 numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from surgery_forms import budget_clip, gradient_vaccine

from jdqn.agent.surgery import gradient_surgery, surgery_scalars


def vaccine_reference(g1, g2, phi_hat, beta):
    """Wang et al. 2021, written directly in float64 from the formula (no shared code)."""
    g1, g2 = np.asarray(g1, np.float64), np.asarray(g2, np.float64)
    n1, n2 = np.linalg.norm(g1), np.linalg.norm(g2)
    if n1 == 0 or n2 == 0 or n2 < 1e-8 * n1:
        return g1, g2, phi_hat, False
    phi = float(g1 @ g2 / (n1 * n2))
    new_phi_hat = float(np.clip((1 - beta) * phi_hat + beta * phi, -0.99, 0.99))
    if phi >= phi_hat:
        return g1, g2, new_phi_hat, False
    num = phi_hat * np.sqrt(1 - phi**2) - phi * np.sqrt(1 - phi_hat**2)
    den = np.sqrt(1 - phi_hat**2)
    out1 = g1 + n1 * num / (n2 * den) * g2
    out2 = g2 + n2 * num / (n1 * den) * g1
    return out1, out2, new_phi_hat, True


def cosine64(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vaccine_hand_case_orthogonal():
    # g1 = e0, g2 = e1, phi = 0 < phi_hat = 0.5: g1' = e0 + 0.5/sqrt(0.75) e1, cos(g1', e1) = 0.5.
    g1 = jnp.array([1.0, 0.0], jnp.float32)
    g2 = jnp.array([0.0, 2.0], jnp.float32)
    out = gradient_vaccine(g1, g2, jnp.float32(0.5), 0.1)
    k = 0.5 / np.sqrt(0.75)
    np.testing.assert_allclose(out.g1, [1.0, k], rtol=1e-6)
    np.testing.assert_allclose(out.g2, [2.0 * k, 2.0], rtol=1e-6)
    assert bool(out.applied)
    assert float(out.phi) == pytest.approx(0.0, abs=1e-7)
    assert float(out.phi_hat) == pytest.approx(0.45, abs=1e-7)


@pytest.mark.parametrize("seed", range(8))
def test_vaccine_matches_float64_formula_and_reaches_phi_hat(seed):
    rng = np.random.default_rng(seed)
    size = 300
    phi_hat = float(rng.uniform(-0.9, 0.9))
    # Conflicting pair with a chosen angle theta in (theta_hat, pi): the surgery branch runs.
    # Angles within ~1e-3 of pi are float32-ill-conditioned (see the antiparallel test).
    theta = rng.uniform(np.arccos(phi_hat) + 0.02, np.pi - 0.01)
    u1 = rng.normal(size=size)
    u1 /= np.linalg.norm(u1)
    v = rng.normal(size=size)
    v -= (v @ u1) * u1
    v /= np.linalg.norm(v)
    g1 = u1 * 10.0 ** rng.uniform(-3, 3)
    g2 = (np.cos(theta) * u1 + np.sin(theta) * v) * 10.0 ** rng.uniform(-3, 3)
    beta = 0.05
    out = gradient_vaccine(
        jnp.asarray(g1, jnp.float32), jnp.asarray(g2, jnp.float32), phi_hat, beta
    )
    ref1, ref2, ref_phi_hat, ref_applied = vaccine_reference(g1, g2, phi_hat, beta)
    assert ref_applied and bool(out.applied)
    np.testing.assert_allclose(out.g1, ref1, rtol=0, atol=1e-5 * np.abs(ref1).max())
    np.testing.assert_allclose(out.g2, ref2, rtol=0, atol=1e-5 * np.abs(ref2).max())
    assert float(out.phi) == pytest.approx(np.cos(theta), abs=1e-6)
    assert float(out.phi_hat) == pytest.approx(ref_phi_hat, abs=1e-6)
    # The defining property: each new gradient has cosine phi_hat with the other's original.
    assert cosine64(out.g1, g2) == pytest.approx(phi_hat, abs=1e-5)
    assert cosine64(out.g2, g1) == pytest.approx(phi_hat, abs=1e-5)


@pytest.mark.slow
def test_vaccine_antiparallel_is_finite():
    # phi = -1: float32 cannot resolve the perpendicular part, but nothing may blow up.
    g1 = jnp.linspace(-1.0, 2.0, 100, dtype=jnp.float32)
    out = gradient_vaccine(g1, -3.0 * g1, jnp.float32(0.5), 0.1)
    assert bool(out.applied)
    assert float(out.phi) == pytest.approx(-1.0, abs=1e-6)
    assert np.all(np.isfinite(np.asarray(out.g1))) and np.all(np.isfinite(np.asarray(out.g2)))
    # Both moved onto (about) the other's side: |g'| <= |g| (1 + ratio), ratio <= 7.1.
    assert np.linalg.norm(out.g1) <= 8.2 * np.linalg.norm(g1)


def test_vaccine_no_op_branch_when_phi_at_least_phi_hat():
    rng = np.random.default_rng(1)
    g1 = rng.normal(size=50).astype(np.float32)
    g2 = (g1 + 0.3 * rng.normal(size=50)).astype(np.float32)  # cosine ~ 0.96
    phi_hat = 0.2
    out = gradient_vaccine(g1, g2, phi_hat, 0.5)
    phi = cosine64(g1, g2)
    assert phi >= phi_hat
    assert not bool(out.applied)
    np.testing.assert_array_equal(out.g1, g1)
    np.testing.assert_array_equal(out.g2, g2)
    # The EMA still moves in the no-op branch (paper: updated every step), then clamps.
    assert float(out.phi_hat) == pytest.approx(0.5 * phi_hat + 0.5 * phi, abs=1e-6)
    high = gradient_vaccine(g1, g1, 0.98, 1.0)
    assert float(high.phi_hat) == pytest.approx(0.99, abs=1e-7)


def test_vaccine_skip_branch_for_tiny_g2_keeps_phi_hat():
    rng = np.random.default_rng(2)
    g1 = rng.normal(size=40).astype(np.float32)
    g2 = (-g1 * 1e-10).astype(np.float32)  # |g2| = 1e-10 |g1| < 1e-8 |g1|, conflicting
    out = gradient_vaccine(g1, g2, 0.5, 0.3)
    assert not bool(out.applied)
    np.testing.assert_array_equal(out.g1, g1)
    np.testing.assert_array_equal(out.g2, g2)
    assert float(out.phi_hat) == pytest.approx(0.5)
    assert float(out.phi) == pytest.approx(-1.0, abs=1e-5)
    # Just above the threshold the surgery runs.
    bigger = gradient_vaccine(g1, (-g1 * 1e-6).astype(np.float32), 0.5, 0.3)
    assert bool(bigger.applied)


@pytest.mark.parametrize("which", ["g1", "g2", "both"])
def test_vaccine_zero_vectors_are_safe(which):
    g = jnp.arange(1.0, 6.0, dtype=jnp.float32)
    zero = jnp.zeros(5, jnp.float32)
    g1 = zero if which in ("g1", "both") else g
    g2 = zero if which in ("g2", "both") else -g
    out = gradient_vaccine(g1, g2, jnp.float32(0.3), 0.1)
    for leaf in out:
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert not bool(out.applied)
    np.testing.assert_array_equal(out.g1, g1)
    np.testing.assert_array_equal(out.g2, g2)
    assert float(out.phi) == 0.0
    assert float(out.phi_hat) == pytest.approx(0.3)


@pytest.mark.slow
def test_vaccine_float32_outputs_and_large_entries_do_not_overflow():
    g1 = jnp.full((1000,), 1e30, jnp.float32)  # sum of squares would overflow float32
    g2 = jnp.concatenate([-jnp.full((500,), 1e30), jnp.full((500,), 2e30)]).astype(jnp.float32)
    out = gradient_vaccine(g1, g2, jnp.float32(0.5), 0.1)
    assert all(np.asarray(x).dtype in (np.float32, np.bool_) for x in out)
    assert np.all(np.isfinite(np.asarray(out.g1))) and np.all(np.isfinite(np.asarray(out.g2)))
    assert bool(out.applied)
    assert cosine64(out.g1, g2) == pytest.approx(0.5, abs=1e-4)


@pytest.mark.slow
def test_vaccine_jit_and_vmap_agree_with_eager():
    rng = np.random.default_rng(3)
    g1 = jnp.asarray(rng.normal(size=(4, 64)), jnp.float32)
    g2 = jnp.asarray(rng.normal(size=(4, 64)), jnp.float32).at[3].set(0.0)  # one skip row
    phi_hat = jnp.asarray([0.0, 0.5, -0.9, 0.4], jnp.float32)
    batched = jax.jit(jax.vmap(gradient_vaccine, in_axes=(0, 0, 0, None)))(g1, g2, phi_hat, 0.1)
    for i in range(4):
        eager = gradient_vaccine(g1[i], g2[i], phi_hat[i], 0.1)
        for got, want in zip(batched, eager, strict=True):
            np.testing.assert_allclose(got[i], want, rtol=1e-6, atol=1e-6)
    assert np.asarray(batched.applied).tolist() == [
        bool(gradient_vaccine(g1[i], g2[i], phi_hat[i], 0.1).applied) for i in range(4)
    ]
    assert not bool(batched.applied[3])


def budget_reference(g, share, budget):
    g = np.asarray(g, np.float64)
    norm = np.linalg.norm(g)
    scale = 1.0 if norm == 0 else min(1.0, share * budget / norm)
    return g * scale, scale


def test_budget_clip_hand_cases():
    g = jnp.array([3.0, 4.0], jnp.float32)  # |g| = 5
    clipped, scale = budget_clip(g, 0.3, 10.0)  # limit 3 -> scale 0.6
    np.testing.assert_allclose(clipped, [1.8, 2.4], rtol=1e-6)
    assert float(scale) == pytest.approx(0.6)
    same, one = budget_clip(g, 0.7, 10.0)  # limit 7 > 5: untouched
    np.testing.assert_array_equal(same, g)
    assert float(one) == 1.0
    zeroed, zero_scale = budget_clip(g, 0.0, 10.0)  # share 0 (C51 when alpha = 0)
    np.testing.assert_array_equal(zeroed, [0.0, 0.0])
    assert float(zero_scale) == 0.0


def test_budget_clip_zero_vector_and_non_finite():
    clipped, scale = budget_clip(jnp.zeros(7, jnp.float32), 0.3, 10.0)
    np.testing.assert_array_equal(clipped, np.zeros(7))
    assert float(scale) == 1.0
    poisoned, _ = budget_clip(jnp.array([1.0, jnp.nan], jnp.float32), 0.3, 10.0)
    assert np.isnan(np.asarray(poisoned)).any()  # not hidden: the guard must see it


@pytest.mark.slow
@given(
    values=st.lists(
        st.floats(-1e15, 1e15, allow_nan=False).map(np.float32), min_size=1, max_size=40
    ),
    share=st.floats(0.0, 1.0),
    budget=st.floats(1e-3, 1e6),
)
def test_budget_never_scales_up(values, share, budget):
    g = np.asarray(values, np.float32)
    clipped, scale = budget_clip(jnp.asarray(g), share, budget)
    clipped, scale = np.asarray(clipped, np.float64), float(scale)
    assert 0.0 <= scale <= 1.0
    assert np.all(np.abs(clipped) <= np.abs(g.astype(np.float64)))
    ref, ref_scale = budget_reference(g, np.float32(share), np.float32(budget))
    assert scale == pytest.approx(ref_scale, rel=1e-5, abs=1e-30)
    np.testing.assert_allclose(clipped, ref, rtol=1e-5, atol=1e-30)
    limit = float(np.float32(share) * np.float32(budget))
    assert np.linalg.norm(clipped) <= max(limit, 0.0) * (1 + 1e-5) or scale == 1.0


def test_budget_clip_jit_and_vmap_agree():
    rng = np.random.default_rng(4)
    g = jnp.asarray(rng.normal(size=(3, 20)) * np.array([[0.1], [10.0], [0.0]]), jnp.float32)
    shares = jnp.asarray([0.3, 0.7, 1.0], jnp.float32)
    batched, scales = jax.jit(jax.vmap(budget_clip, in_axes=(0, 0, None)))(g, shares, 2.0)
    for i in range(3):
        eager, eager_scale = budget_clip(g[i], shares[i], 2.0)
        np.testing.assert_allclose(batched[i], eager, rtol=1e-6)
        assert float(scales[i]) == pytest.approx(float(eager_scale), rel=1e-6)


# ----------------------------------------------------------------------------- fused surgery


def surgery_reference(g1, g2, phi_hat, beta, due, shares, budget):
    """Steps 7-8 of docs/design.md §5 composed from the float64 references above."""
    if due:
        v1, v2, new_phi_hat, applied = vaccine_reference(g1, g2, phi_hat, beta)
    else:
        v1, v2, new_phi_hat, applied = np.float64(g1), np.float64(g2), phi_hat, False
    out1, _ = budget_reference(v1, shares[0], budget)
    out2, _ = budget_reference(v2, shares[1], budget)
    norms_after = (np.linalg.norm(out1), np.linalg.norm(out2))
    return out1, out2, new_phi_hat, applied, norms_after


def _pair(seed, size=500, theta=None):
    rng = np.random.default_rng(seed)
    u1 = rng.normal(size=size)
    v = rng.normal(size=size)
    v -= (v @ u1) / (u1 @ u1) * u1
    theta = rng.uniform(0.1, np.pi - 0.1) if theta is None else theta
    u1, v = u1 / np.linalg.norm(u1), v / np.linalg.norm(v)
    g1 = u1 * 10.0 ** rng.uniform(-3, 3)
    g2 = (np.cos(theta) * u1 + np.sin(theta) * v) * 10.0 ** rng.uniform(-3, 3)
    return g1, g2


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("due", [True, False])
def test_fused_surgery_matches_the_float64_vaccine_then_budget(seed, due):
    rng = np.random.default_rng(100 + seed)
    g1, g2 = _pair(seed)
    phi_hat = float(rng.uniform(-0.9, 0.9))
    shares = (0.3, 0.7) if seed % 3 else (1.0, 0.0)  # the MSE-only phase gives C51 no share
    # Budgets from far below to far above the norms: clipping binds for some parts, not others.
    budget = float(10.0 ** rng.uniform(-3, 3))
    # Half the cases carry a third part (diversity + causal), which joins the total unchanged.
    extra = [rng.normal(size=g1.shape) * 10.0 ** rng.uniform(-3, 3)] if seed % 2 else []
    grads = jnp.asarray(np.stack([g1, g2, *extra]), jnp.float32)
    out = jax.jit(gradient_surgery)(grads, phi_hat, 0.05, jnp.bool_(due), shares, budget)
    ref1, ref2, ref_phi_hat, ref_applied, ref_after = surgery_reference(
        g1, g2, phi_hat, 0.05, due, shares, budget
    )
    total = ref1 + ref2 + sum(np.float64(np.float32(e)) for e in extra)
    scale = max(np.abs(total).max(), np.abs(ref1).max(), np.abs(ref2).max(), 1e-30)
    np.testing.assert_allclose(out.total, total, rtol=0, atol=2e-5 * scale)
    # The Gram-matrix norm of the total, to rounding of the parts' norms.
    parts = np.linalg.norm(ref1) + np.linalg.norm(ref2) + sum(np.linalg.norm(e) for e in extra)
    assert float(out.total_norm) == pytest.approx(np.linalg.norm(total), abs=1e-5 * parts)
    assert bool(out.applied) == ref_applied
    for got, want in ((out.g1, ref1), (out.g2, ref2)):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(np.abs(want).max(), 1e-30))
    assert float(out.phi_hat) == pytest.approx(ref_phi_hat, abs=1e-6)
    assert float(out.phi) == pytest.approx(cosine64(g1, g2), abs=1e-6)
    np.testing.assert_allclose(out.norms, [np.linalg.norm(g1), np.linalg.norm(g2)], rtol=1e-5)
    np.testing.assert_allclose(out.norms_after, ref_after, rtol=2e-5, atol=1e-30)
    # The analytic after-norms agree with the norms of the returned vectors.
    got_after = [np.linalg.norm(np.float64(out.g1)), np.linalg.norm(np.float64(out.g2))]
    np.testing.assert_allclose(out.norms_after, got_after, rtol=2e-5, atol=1e-30)
    assert all(
        float(n) <= s * budget * (1 + 1e-5) for n, s in zip(out.norms_after, shares, strict=True)
    )


@pytest.mark.parametrize("seed", range(6))
def test_scalars_from_the_gram_matrix_weight_the_raw_rows_to_the_float64_total(seed):
    """The Pallas tail's path: row maxima and Gram matrix (computed here in float64) ->
    ``surgery_scalars`` -> total = sum_k weights[k] g_k, against the float64 surgery."""
    rng = np.random.default_rng(200 + seed)
    g1, g2 = _pair(seed)
    extra = [rng.normal(size=g1.shape) * 10.0 ** rng.uniform(-3, 3)] if seed % 2 else []
    grads = np.stack([g1, g2, *extra]).astype(np.float32).astype(np.float64)
    row_max = np.abs(grads).max(axis=1)
    scaled = grads / row_max[:, None]
    phi_hat, budget, shares = (
        float(rng.uniform(-0.9, 0.9)),
        float(10.0 ** rng.uniform(-2, 2)),
        (0.3, 0.7),
    )
    out = surgery_scalars(
        jnp.asarray(row_max, jnp.float32),
        jnp.asarray(scaled @ scaled.T, jnp.float32),
        phi_hat,
        0.05,
        jnp.bool_(True),
        shares,
        budget,
    )
    ref1, ref2, ref_phi_hat, ref_applied, ref_after = surgery_reference(
        grads[0], grads[1], phi_hat, 0.05, True, shares, budget
    )
    total = ref1 + ref2 + sum(grads[2:])
    got = np.asarray(out.weights, np.float64) @ grads
    scale = max(np.abs(total).max(), np.abs(ref1).max(), np.abs(ref2).max())
    np.testing.assert_allclose(got, total, rtol=0, atol=2e-5 * scale)
    assert bool(out.applied) == ref_applied
    assert float(out.phi_hat) == pytest.approx(ref_phi_hat, abs=1e-6)
    np.testing.assert_allclose(out.norms_after, ref_after, rtol=2e-5, atol=1e-30)


@pytest.mark.slow
def test_fused_surgery_equals_the_unfused_float32_functions():
    g1, g2 = _pair(7)
    f1, f2 = jnp.asarray(g1, jnp.float32), jnp.asarray(g2, jnp.float32)
    vaccine = gradient_vaccine(f1, f2, jnp.float32(0.9), 0.1)
    want1, _ = budget_clip(vaccine.g1, 0.3, 0.5)
    want2, _ = budget_clip(vaccine.g2, 0.7, 0.5)
    out = gradient_surgery(jnp.stack([f1, f2]), 0.9, 0.1, jnp.bool_(True), (0.3, 0.7), 0.5)
    assert bool(out.applied) and bool(vaccine.applied)
    np.testing.assert_allclose(out.g1, want1, rtol=0, atol=1e-5 * float(jnp.abs(want1).max()))
    np.testing.assert_allclose(out.g2, want2, rtol=0, atol=1e-5 * float(jnp.abs(want2).max()))
    assert float(out.phi_hat) == pytest.approx(float(vaccine.phi_hat), abs=1e-6)


@pytest.mark.slow
def test_total_norm_of_parts_that_cancel_and_of_a_non_finite_part():
    g = np.random.default_rng(3).normal(size=1000)
    # MSE and the extra part cancel exactly; C51 is off (share 0): the total is 0.
    grads = jnp.asarray(np.stack([g, 0 * g, -g]), jnp.float32)
    out = gradient_surgery(grads, 0.0, 0.1, jnp.bool_(False), (1.0, 0.0), 1e6)
    assert np.all(np.asarray(out.total) == 0.0)
    assert float(out.total_norm) <= 1e-6 * np.linalg.norm(g)
    # Hand case: totals of orthogonal parts add in quadrature.
    e = np.eye(4)
    out = gradient_surgery(
        jnp.asarray(np.stack([3 * e[0], 0 * e[0], 4 * e[1]]), jnp.float32),
        0.0,
        0.1,
        jnp.bool_(False),
        (1.0, 0.0),
        1e6,
    )
    assert float(out.total_norm) == pytest.approx(5.0, rel=1e-6)
    # A non-finite extra part: its max-abs says so (what the guard reads), and so do the total
    # and its norm.
    bad = grads.at[2, 5].set(jnp.inf)
    out = gradient_surgery(bad, 0.0, 0.1, jnp.bool_(False), (1.0, 0.0), 1e6)
    assert not np.isfinite(float(out.row_max[2])) and not np.isfinite(float(out.total[5]))
    assert not np.isfinite(float(out.total_norm))


@pytest.mark.slow
def test_fused_surgery_edge_cases():
    ones = jnp.ones((1000,), jnp.float32)
    # Entries near the float32 range: the norms and the Gram matrix do not overflow.
    huge = jnp.stack([1e30 * ones, jnp.concatenate([-1e30 * ones[:500], 2e30 * ones[500:]])])
    out = gradient_surgery(huge, 0.5, 0.1, jnp.bool_(True), (0.3, 0.7), 1e35)
    assert bool(out.applied)
    assert np.all(np.isfinite(np.asarray(out.g1))) and np.all(np.isfinite(np.asarray(out.norms)))
    assert cosine64(out.g1, huge[1]) == pytest.approx(0.5, abs=1e-4)
    # A zero C51 gradient (alpha = 0): skip, phi_hat kept, MSE clipped alone.
    out = gradient_surgery(jnp.stack([ones, 0 * ones]), 0.5, 0.1, jnp.bool_(True), (1.0, 0.0), 1.0)
    assert not bool(out.applied) and float(out.phi_hat) == 0.5
    np.testing.assert_allclose(out.g1, ones / np.sqrt(1000), rtol=1e-6)
    assert np.all(np.asarray(out.g2) == 0)
    # A NaN anywhere is not hidden: its row's max-abs and its output are NaN.
    bad = jnp.stack([ones.at[3].set(jnp.nan), ones])
    out = gradient_surgery(bad, 0.5, 0.1, jnp.bool_(True), (0.3, 0.7), 1.0)
    assert np.isnan(float(out.row_max[0])) and np.isfinite(float(out.row_max[1]))
    assert np.isnan(float(out.g1[3])) and np.isnan(float(out.norms_after[0]))


@pytest.mark.slow
def test_fused_surgery_vmaps_like_single_calls():
    grads = jnp.asarray(np.stack([np.stack(_pair(s)) for s in range(3)]), jnp.float32)
    due = jnp.asarray([True, False, True])
    batched = jax.vmap(gradient_surgery, in_axes=(0, None, None, 0, None, None))(
        grads, 0.4, 0.1, due, (0.3, 0.7), 2.0
    )
    for i in range(3):
        single = gradient_surgery(grads[i], 0.4, 0.1, due[i], (0.3, 0.7), 2.0)
        for got, want in zip(batched, single, strict=True):
            # Batched reductions may sum in another order: float32 rounding only.
            np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
