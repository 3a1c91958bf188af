"""Loss parts against float64 numpy references and hand-computed cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdqn.accel.pieces import Pieces
from jdqn.agent import losses
from pallas_kernels import c51_project

V_MIN, V_MAX = -10.0, 10.0
SUPPORT = np.linspace(V_MIN, V_MAX, 5)  # dz = 5


def _softmax64(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _central_differences(objective, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """d objective / dx of a float64 function, by central differences, element by element."""
    grad = np.zeros(x.shape)
    for index in np.ndindex(x.shape):
        step = np.zeros(x.shape)
        step[index] = h
        grad[index] = (objective(x + step) - objective(x - step)) / (2 * h)
    return grad


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def _project64(probs, rewards, discounts):
    """Textbook per-source loop with the exact-atom case handled (float64)."""
    probs = np.asarray(probs, np.float64)
    out = np.zeros_like(probs)
    dz = SUPPORT[1] - SUPPORT[0]
    for b in range(probs.shape[0]):
        for j, z in enumerate(SUPPORT):
            tz = np.clip(rewards[b] + discounts[b] * z, V_MIN, V_MAX)
            pos = (tz - V_MIN) / dz
            low = int(np.floor(pos))
            if low == pos:
                out[b, low] += probs[b, j]
            else:
                out[b, low] += probs[b, j] * (low + 1 - pos)
                out[b, low + 1] += probs[b, j] * (pos - low)
    return out


def test_projection_hand_cases():
    p = jnp.array([[0.1, 0.2, 0.4, 0.2, 0.1]] * 4, jnp.float32)
    rewards = jnp.array([2.5, 100.0, 5.0, -3.0], jnp.float32)
    discounts = jnp.array([0.0, 0.9, 1.0, 0.5], jnp.float32)
    m = np.asarray(c51_project(p, rewards, discounts, V_MIN, V_MAX, impl="reference"))
    # terminal (g = 0): all mass at r = 2.5, halfway between atoms 0 and 5.
    np.testing.assert_allclose(m[0], [0, 0, 0.5, 0.5, 0], atol=1e-6)
    # r beyond the support: everything clips to v_max.
    np.testing.assert_allclose(m[1], [0, 0, 0, 0, 1], atol=1e-6)
    # r = dz, g = 1: each atom lands exactly on the next one; the top two pile up at v_max.
    np.testing.assert_allclose(m[2], [0, 0.1, 0.2, 0.4, 0.3], atol=1e-6)
    np.testing.assert_allclose(m, _project64(p, rewards, discounts), atol=1e-6)


@pytest.mark.slow
@given(
    seed=st.integers(0, 2**16),
    reward=st.floats(-30, 30, width=32),
    discount=st.floats(0, 1, width=32),
)
def test_projection_matches_float64_and_keeps_mass(seed, reward, discount):
    p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(seed), (1, 5)))
    r, g = np.array([reward], np.float32), np.array([discount], np.float32)
    m = np.asarray(c51_project(p, jnp.asarray(r), jnp.asarray(g), V_MIN, V_MAX))
    np.testing.assert_allclose(m, _project64(p, r, g), atol=1e-5)
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)


def test_label_smoothing():
    m = jnp.array([[0.0, 1.0, 0.0, 0.0], [0.25, 0.25, 0.5, 0.0]], jnp.float32)
    weights = losses.smoothing_weights(0.1, 4)
    np.testing.assert_array_equal(weights, np.float32([0.9, 0.025]))  # rounded from float64
    out = np.asarray(losses.label_smooth(m, jnp.asarray(weights)))
    np.testing.assert_allclose(out[0], [0.025, 0.925, 0.025, 0.025], rtol=1e-6)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-6)


@pytest.mark.slow
def test_double_dqn_picks_by_online_scores_by_target():
    support = jnp.asarray(SUPPORT, jnp.float32)
    q_online = jnp.array([[1.0, 3.0, 2.0]], jnp.float32)  # online prefers action 1
    probs_target = jnp.array(
        [
            [
                [0.0, 0.0, 0.0, 0.0, 1.0],  # target prefers action 0 (Q = 10)
                [0.5, 0.5, 0.0, 0.0, 0.0],  # Q = -7.5
                [0.0, 0.0, 1.0, 0.0, 0.0],
            ]
        ],
        jnp.float32,
    )
    # The target net's logits: log(0) = -inf keeps those atoms at probability 0 exactly.
    with np.errstate(divide="ignore"):
        logits_target = jnp.asarray(np.log(np.asarray(probs_target)), jnp.float32)
    a_star, probs, q_star = losses.double_dqn_target(q_online, logits_target, support)
    assert int(a_star[0]) == 1
    np.testing.assert_array_equal(probs[0], [0.5, 0.5, 0, 0, 0])
    np.testing.assert_allclose(float(q_star[0]), -7.5)
    y = losses.scalar_target(jnp.array([30.0]), jnp.array([0.9]), q_star, V_MIN, V_MAX)
    np.testing.assert_allclose(np.asarray(y), [10.0])  # 30 - 6.75 clips to v_max


@pytest.mark.slow
def test_double_dqn_target_is_the_softmax_of_a_stars_row_against_float64():
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 4.0, (6, 2, 3, 5)).astype(np.float32)  # [R, K, A, N]
    q_online = rng.normal(size=(6, 2, 3)).astype(np.float32)
    a_star, probs, q_star = losses.double_dqn_target(
        jnp.asarray(q_online), jnp.asarray(logits), jnp.asarray(SUPPORT, jnp.float32)
    )
    want_a = q_online.argmax(-1)
    want = _softmax64(np.take_along_axis(logits, want_a[..., None, None], axis=-2)[..., 0, :])
    np.testing.assert_array_equal(a_star, want_a)
    np.testing.assert_allclose(probs, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(q_star, want @ SUPPORT, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_select_action_matches_indexing_and_keeps_other_actions_out():
    rng = np.random.default_rng(0)
    values = rng.normal(size=(4, 2, 3, 5)).astype(np.float32)  # [R, K, A, N]
    action = np.array([2, 0, 1, 2])
    values[np.arange(4), :, (action + 1) % 3] = np.inf  # a non-taken action of every row
    values[0, :, 0] = np.nan
    taken = losses.select_action(jnp.asarray(values), jnp.asarray(action)[:, None], n_trailing=1)
    np.testing.assert_array_equal(taken, values[np.arange(4), :, action])  # exact, all finite
    q = values[..., 0]  # [R, K, A], no trailing axis; one action per (row, head)
    per_head = np.array([[2, 0], [1, 1], [0, 2], [2, 2]])
    np.testing.assert_array_equal(
        losses.select_action(jnp.asarray(q), jnp.asarray(per_head)),
        np.take_along_axis(q, per_head[..., None], axis=-1)[..., 0],
    )
    # The gradient is the taken action's one-hot: a select, no scatter.
    grad = jax.grad(lambda v: jnp.sum(losses.select_action(v, jnp.asarray(action)[:, None])))(
        jnp.zeros((4, 2, 3))
    )
    np.testing.assert_array_equal(grad, np.eye(3)[action][:, None, :].repeat(2, axis=1))


@pytest.mark.slow
def test_cross_entropy_from_log_probs():
    logits = jax.random.normal(jax.random.PRNGKey(1), (7, 5)) * 3.0
    target = jnp.asarray(_softmax64(np.arange(35.0).reshape(7, 5) / 10.0), jnp.float32)
    want = -(np.asarray(target, np.float64) * np.log(_softmax64(logits))).sum(-1)
    np.testing.assert_allclose(
        losses.cross_entropy(jax.nn.log_softmax(logits), target), want, rtol=1e-5
    )


def _c51_head64(logits, support, action, target):
    """q [R, K, A] and the taken action's cross-entropy [R, K] in float64 numpy."""
    probs = _softmax64(logits)
    q = probs @ support
    taken = np.take_along_axis(np.log(probs), action[:, None, None, None], axis=2)[:, :, 0]
    return q, -(target * taken).sum(-1)


@pytest.mark.slow
def test_c51_head_values_and_closed_form_gradient_against_float64_differences():
    """The custom VJP against central differences of a float64 forward, for random cotangents
    of both outputs and a target whose mass is not exactly 1 (the gradient keeps M p - m)."""
    rng = np.random.default_rng(7)
    shape = (3, 2, 3, 5)  # [R, K, A, N]
    logits = rng.normal(0.0, 2.0, shape)
    action = rng.integers(0, 3, 3)
    target = rng.dirichlet(np.ones(5), (3, 2)) * 1.02
    g_q, g_ce = rng.normal(size=(3, 2, 3)), rng.normal(size=(3, 2))

    def objective64(x):
        q, ce = _c51_head64(x, SUPPORT, action, target)
        return (g_q * q).sum() + (g_ce * ce).sum()

    want_grad = _central_differences(objective64, logits)

    def head(x):
        return losses.c51_head(x, _f32(SUPPORT), jnp.asarray(action)[:, None], _f32(target))

    (q, ce), vjp = jax.vjp(head, _f32(logits))
    want_q, want_ce = _c51_head64(logits, SUPPORT, action, target)
    np.testing.assert_allclose(q, want_q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ce, want_ce, rtol=1e-5, atol=1e-5)
    (grad,) = vjp((_f32(g_q), _f32(g_ce)))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)
    # vmap over cotangent rows, as the learner pulls both loss parts back at once.
    (both,) = jax.vmap(vjp)((jnp.stack([_f32(g_q), 2 * _f32(g_q)]), jnp.stack([_f32(g_ce)] * 2)))
    np.testing.assert_allclose(both[0], grad, rtol=1e-6)


def test_q_regression_loss_and_huber():
    q = jnp.array([0.0, 4.0, -10.0], jnp.float32)
    y = jnp.array([2.0, -4.0, 10.0], jnp.float32)
    error = (np.array([0, 4, -10.0]) - np.array([2, -4, 10.0])) / 20.0  # [-0.1, 0.4, -1.0]
    np.testing.assert_allclose(
        losses.q_regression_loss(q, y, V_MAX - V_MIN, None), error**2, rtol=1e-6
    )
    delta = 0.3
    huber = np.where(np.abs(error) <= delta, error**2, 2 * delta * np.abs(error) - delta**2)
    np.testing.assert_allclose(
        losses.q_regression_loss(q, y, V_MAX - V_MIN, delta), huber, rtol=1e-6
    )
    np.testing.assert_allclose(huber, [0.01, 0.15, 0.51])  # hand values


@pytest.mark.slow
def test_cross_entropy_of_log_softmax_matches_float64():
    logits = jax.random.normal(jax.random.PRNGKey(0), (6, 5)) * 20.0  # large: needs log_softmax
    target = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (6, 5)))
    z = np.asarray(logits, np.float64)
    log_softmax = z - z.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    expected = -(np.asarray(target, np.float64) * log_softmax).sum(-1)
    out = losses.cross_entropy(jax.nn.log_softmax(logits), target)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.slow
def test_ensemble_diversity_formula():
    q = jax.random.normal(jax.random.PRNGKey(0), (4, 3, 5))
    qn = np.asarray(q, np.float64)
    adv = qn - qn.mean(-1, keepdims=True)
    total = []
    for b in range(4):
        for k in range(3):
            for m in range(k + 1, 3):
                a, c = adv[b, k], adv[b, m]
                total.append(a @ c / np.linalg.norm(a) / np.linalg.norm(c))
    np.testing.assert_allclose(float(losses.ensemble_diversity(q, 0.5)), 0.5 * np.mean(total), 1e-5)
    # Identical heads: cosine 1; opposite advantage profiles: cosine -1.
    same = jnp.stack([q[:, 0]] * 2, axis=1)
    np.testing.assert_allclose(float(losses.ensemble_diversity(same, 1.0)), 1.0, rtol=1e-5)
    opposite = jnp.stack([q[:, 0], -q[:, 0]], axis=1)
    np.testing.assert_allclose(float(losses.ensemble_diversity(opposite, 1.0)), -1.0, rtol=1e-5)


@pytest.mark.slow
def test_causal_intervention_permutes_only_the_declared_columns():
    obs = jnp.arange(24, dtype=jnp.float32).reshape(6, 4)
    out = np.asarray(losses.causal_intervention(jax.random.PRNGKey(2), obs, (0, 2)))
    np.testing.assert_array_equal(out[:, [1, 3]], np.asarray(obs)[:, [1, 3]])
    rows = [int(r) for r in out[:, 0] // 4]  # the row each replaced entry came from
    assert sorted(rows) == list(range(6)) and rows != list(range(6))
    np.testing.assert_array_equal(out[:, 2], np.asarray(obs)[rows, 2])  # one permutation


@pytest.mark.slow
def test_causal_kl_zero_when_non_causal_columns_are_identical():
    obs = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
    obs = obs.at[:, 1].set(3.0)  # the non-causal column carries no information
    intervened = losses.causal_intervention(jax.random.PRNGKey(1), obs, (1,))
    weights = jax.random.normal(jax.random.PRNGKey(2), (4, 5))
    kl = losses.causal_kl(jax.nn.log_softmax(obs @ weights), intervened @ weights)
    np.testing.assert_array_equal(kl, 0.0)


@pytest.mark.slow
def test_causal_kl_matches_float64_and_only_the_intervened_side_gets_gradient():
    a = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
    b = jax.random.normal(jax.random.PRNGKey(1), (3, 5))
    p, q = _softmax64(a), _softmax64(b)
    log_p = jax.nn.log_softmax(a)
    np.testing.assert_allclose(
        losses.causal_kl(log_p, b), (p * (np.log(p) - np.log(q))).sum(-1), rtol=1e-5
    )
    grad_a, grad_b = jax.grad(lambda x, y: losses.causal_kl(x, y).sum(), argnums=(0, 1))(log_p, b)
    np.testing.assert_array_equal(grad_a, 0.0)
    np.testing.assert_allclose(grad_b, q - p, rtol=1e-5, atol=1e-6)  # d KL / d logits_q


@pytest.mark.slow
def test_causal_kl_closed_form_gradient_against_float64_differences():
    """The custom VJP against central differences of a float64 forward, for random cotangents
    and a reference whose mass is not exactly 1 (the gradient keeps M q - p), also under the
    vmap the learner's seeds put around it."""
    rng = np.random.default_rng(11)
    shape = (4, 2, 3, 5)  # [B, K, A, N]
    log_p = np.log(rng.dirichlet(np.ones(5), shape[:-1]) * 1.02)
    logits = rng.normal(0.0, 2.0, shape)
    g_kl = rng.normal(size=shape[:-1])

    def objective64(x):
        return (g_kl * (np.exp(log_p) * (log_p - np.log(_softmax64(x)))).sum(-1)).sum()

    want_grad = _central_differences(objective64, logits)

    kl, vjp = jax.vjp(lambda x: losses.causal_kl(_f32(log_p), x), _f32(logits))
    want_kl = (np.exp(log_p) * (log_p - np.log(_softmax64(logits)))).sum(-1)
    np.testing.assert_allclose(kl, want_kl, rtol=1e-5, atol=1e-5)
    (grad,) = vjp(_f32(g_kl))
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-5)
    seeds = jax.vmap(jax.grad(lambda lp, x: jnp.sum(_f32(g_kl) * losses.causal_kl(lp, x)), 1))
    both = seeds(jnp.stack([_f32(log_p)] * 2), jnp.stack([_f32(logits)] * 2))
    np.testing.assert_allclose(both[1], grad, rtol=1e-6)


def test_edge_mass():
    m = jnp.array([[0.1, 0.3, 0.2, 0.4]])
    np.testing.assert_allclose(losses.edge_mass(m), [0.5], rtol=1e-6)


@pytest.mark.slow
def test_mse_unit_reward_measures_the_error_in_reward_units():
    """``loss.mse_unit=reward``: the MSE part is the plain squared error, (v_max - v_min)^2 times
    the support-width part; the C51 part does not change."""
    from jdqn.config import SMOKETEST, apply_overrides

    rng = np.random.default_rng(0)
    cfg = apply_overrides(SMOKETEST, ["network.v_min=-10", "network.v_max=10"])
    n = cfg.network.n_atoms
    logits = jnp.asarray(rng.normal(size=(4, 1, 3, n)), jnp.float32)  # [R, K, A, N]
    target = jnp.asarray(rng.dirichlet(np.ones(n), size=(4, 1)), jnp.float32)  # [R, K, N]
    y = jnp.asarray(rng.normal(size=(4, 1)), jnp.float32)
    td = losses.TdTarget(target, target, y, jnp.zeros((4, 1, 3)), jnp.zeros((4, 1)))
    action, weights = jnp.array([0, 1, 2, 1]), jnp.ones((4, 1), jnp.float32)
    width_parts, online = losses.loss_parts(logits, action, weights, td, cfg)
    reward_cfg = apply_overrides(cfg, ["loss.mse_unit=reward"])
    reward_parts, _ = losses.loss_parts(logits, action, weights, td, reward_cfg)
    q_taken = np.asarray(online.q_taken, np.float64)
    np.testing.assert_allclose(reward_parts[0], np.mean((q_taken - np.asarray(y)) ** 2), rtol=1e-5)
    np.testing.assert_allclose(reward_parts[0], 400.0 * width_parts[0], rtol=1e-5)
    np.testing.assert_allclose(reward_parts[1], width_parts[1])


@pytest.mark.slow
def test_the_closed_form_gradients_equal_autodiffs_when_pieces_ask_for_autodiff():
    """``Pieces(vjp="autodiff")`` (jdqn.accel.pieces): c51_head and causal_kl without their
    custom VJPs, JAX differentiating the same forwards; the same values and gradients (under a
    vmap over two cotangents, as the learner's parts) to float32 rounding."""
    rng = np.random.default_rng(5)
    shape = (4, 2, 3, 5)  # [R, K, A, N]
    logits, intervened = _f32(rng.normal(0.0, 2.0, shape)), _f32(rng.normal(0.0, 2.0, shape))
    action = jnp.asarray(rng.integers(0, 3, 4))[:, None]
    target = _f32(rng.dirichlet(np.ones(5), shape[:2]) * 1.02)
    log_p = jax.nn.log_softmax(logits)
    g_q, g_ce = _f32(rng.normal(size=(2, *shape[:3]))), _f32(rng.normal(size=(2, *shape[:2])))
    g_kl = _f32(rng.normal(size=(2, *shape[:3])))

    def traced(pieces):
        def both(logits, intervened):
            q, ce = losses.c51_head(logits, _f32(SUPPORT), action, target, pieces)
            return q, ce, losses.causal_kl(log_p, intervened, pieces)

        out, vjp = jax.vjp(both, logits, intervened)
        grads = jax.vmap(vjp)((g_q, g_ce, g_kl))
        return out, grads, str(jax.make_jaxpr(both)(logits, intervened))

    want, want_grads, want_jaxpr = traced(Pieces())
    got, grads, jaxpr = traced(Pieces(vjp="autodiff"))
    assert want_jaxpr.count("custom_vjp_call") == 2 and "custom_vjp_call" not in jaxpr
    leaves = zip(jax.tree.leaves((got, grads)), jax.tree.leaves((want, want_grads)), strict=True)
    for a, b in leaves:
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
