"""C51 network: spectral norm against SVD, pruning schedule and masks, ensemble masks, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdqn.agent import networks
from jdqn.config import SMOKETEST, apply_overrides


def _cfg(*overrides: str):
    return apply_overrides(SMOKETEST, ["network.hidden=[16,8]", "network.n_atoms=11", *overrides])


def test_spectral_sigma_matches_svd_after_power_iterations():
    kernel = jax.random.normal(jax.random.PRNGKey(0), (9, 16), jnp.float32)
    u = networks._l2_normalise(jax.random.normal(jax.random.PRNGKey(1), (16,)))
    power_step = jax.jit(networks.spectral_normalise, static_argnums=2)
    for _ in range(200):
        _, u, sigma = power_step(kernel, u, "clip")
    top = np.linalg.svd(np.asarray(kernel, np.float64), compute_uv=False)[0]
    np.testing.assert_allclose(float(sigma), top, rtol=1e-5)


@pytest.mark.slow
def test_spectral_modes_clip_and_divide():
    net = _cfg().network
    state = networks.init_network(jax.random.PRNGKey(0), _cfg(), 5)
    u = state.sn_u
    power_step = jax.jit(networks.effective_params, static_argnums=(3, 4))
    for _ in range(200):
        eff, u, sigmas = power_step(state.params, state.masks, u, net, True)
    for name, sigma in zip(networks.torso_layers(net), np.asarray(sigmas), strict=True):
        kernel = np.asarray(state.params[name]["kernel"], np.float64)
        top = np.linalg.svd(kernel, compute_uv=False)[0]
        np.testing.assert_allclose(sigma, top, rtol=1e-5)
        # clip: W / max(sigma, 1), so the normalised top singular value is min(top, 1).
        eff_top = np.linalg.svd(np.asarray(eff[name]["kernel"], np.float64), compute_uv=False)[0]
        np.testing.assert_allclose(eff_top, min(top, 1.0), rtol=1e-5)
    # A small kernel (sigma < 1) passes "clip" unchanged but is scaled up by "divide".
    small = {**state.params, "torso_0": {**state.params["torso_0"]}}
    small["torso_0"]["kernel"] = state.params["torso_0"]["kernel"] * 1e-2
    divide = apply_overrides(_cfg(), ["network.spectral_mode=divide"]).network
    eff_clip, _, s_clip = networks.effective_params(small, state.masks, u, net, False)
    eff_div, _, _ = networks.effective_params(small, state.masks, u, divide, False)
    assert float(s_clip[0]) < 1.0
    np.testing.assert_array_equal(eff_clip["torso_0"]["kernel"], small["torso_0"]["kernel"])
    np.testing.assert_allclose(
        eff_div["torso_0"]["kernel"], small["torso_0"]["kernel"] / s_clip[0], rtol=1e-6
    )
    # The output head is never normalised.
    np.testing.assert_array_equal(eff_clip["head"]["kernel"], small["head"]["kernel"])


@pytest.mark.slow
def test_update_u_false_returns_stored_u_and_u_gets_no_gradient():
    cfg = _cfg()
    state = networks.init_network(jax.random.PRNGKey(3), cfg, 5)
    _, same_u, _ = networks.effective_params(
        state.params, state.masks, state.sn_u, cfg.network, False
    )
    _, new_u, _ = networks.effective_params(
        state.params, state.masks, state.sn_u, cfg.network, True
    )
    for name in state.sn_u:
        np.testing.assert_array_equal(same_u[name], state.sn_u[name])
        assert not np.allclose(new_u[name], state.sn_u[name])
    grad_u = jax.grad(
        lambda u: jnp.sum(
            networks.apply(
                networks.effective_params(state.params, state.masks, u, cfg.network, True)[0],
                jnp.ones((2, 5)),
                cfg,
            )
        )
    )(state.sn_u)
    for g in jax.tree.leaves(grad_u):
        np.testing.assert_array_equal(g, 0.0)


@pytest.mark.slow
def test_logits_shape_q_inside_support_and_bf16_matmuls():
    cfg = _cfg("network.n_heads=3")
    state = networks.init_network(jax.random.PRNGKey(0), cfg, 5)
    eff, _, _ = networks.effective_params(state.params, state.masks, state.sn_u, cfg.network, False)
    obs = 30.0 * jax.random.normal(jax.random.PRNGKey(1), (7, 5))
    logits = networks.apply(eff, obs, cfg)
    assert logits.shape == (7, 3, 3, 11) and logits.dtype == jnp.float32
    support = networks.atoms(cfg.network)
    np.testing.assert_allclose(
        support, np.linspace(cfg.network.v_min, cfg.network.v_max, 11), atol=1e-4
    )
    q = networks.q_values(logits, support)
    assert q.shape == (7, 3, 3)
    assert np.all(np.asarray(q) >= -240.0) and np.all(np.asarray(q) <= 240.0)
    z = np.asarray(logits, np.float64)
    probs = np.exp(z - z.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    reference = np.einsum("bkan,n->bka", probs, np.asarray(support, np.float64))
    np.testing.assert_allclose(q, reference, rtol=1e-5, atol=1e-4)
    bf16 = apply_overrides(cfg, ["network.matmul_dtype=bfloat16"])
    logits_bf16 = networks.apply(eff, obs, bf16)
    assert logits_bf16.dtype == jnp.float32
    np.testing.assert_allclose(logits_bf16, logits, rtol=0.05, atol=0.2)  # bf16: 8-bit mantissa
    assert not np.array_equal(logits_bf16, logits)


def test_cubic_prune_schedule_hand_values():
    net = _cfg(
        "network.target_sparsity=0.8",
        "network.prune_start=100",
        "network.prune_end=500",
        "network.prune_every=100",
    ).network
    # progress = (t - 100) / 400; s_t = 0.8 (1 - (1 - progress)^3)
    expected = {0: 0.0, 100: 0.0, 200: 0.8 * (1 - 0.75**3), 300: 0.7, 500: 0.8, 900: 0.8}
    for step, value in expected.items():
        np.testing.assert_allclose(float(networks.prune_sparsity(step, net)), value, rtol=1e-6)
    due = {50: False, 100: True, 150: False, 200: True, 500: True, 600: False}
    for step, value in due.items():
        assert bool(networks.prune_due(jnp.int32(step), net)) is value
    odd_end = _cfg("network.prune_end=250", "network.prune_every=100").network
    assert bool(networks.prune_due(jnp.int32(250), odd_end))
    assert not bool(networks.prune_due(jnp.int32(240), odd_end))


def test_magnitude_masks_hand_case():
    params = {
        "torso_0": {"kernel": jnp.array([[0.1, -0.5], [0.3, -0.05]]), "bias": jnp.zeros(2)},
    }
    masks = networks.magnitude_masks(params, jnp.float32(0.5))
    np.testing.assert_array_equal(masks["torso_0"]["kernel"], [[0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_array_equal(masks["torso_0"]["bias"], [1.0, 1.0])
    np.testing.assert_allclose(float(networks.mask_sparsity(masks)), 0.5)


@pytest.mark.slow
@given(
    sparsity=st.floats(0.0, 0.99),
    seed=st.integers(0, 2**16),
    shape=st.sampled_from([(3, 4), (9, 2), (1, 7)]),  # few shapes: few compiles
)
def test_magnitude_masks_prune_exactly_the_smallest(sparsity, seed, shape):
    kernel = jax.random.normal(jax.random.PRNGKey(seed), shape)
    kernel = kernel.at[0, 0].set(0.0)  # ties with zeros must not over-prune
    mask = np.asarray(
        networks.magnitude_masks({"l": {"kernel": kernel}}, jnp.float32(sparsity))["l"]["kernel"]
    )
    n_pruned = int(np.floor(np.float32(sparsity) * kernel.size))
    assert int((mask == 0).sum()) == n_pruned
    magnitudes = np.abs(np.asarray(kernel))
    if 0 < n_pruned < kernel.size:
        assert magnitudes[mask == 0].max() <= magnitudes[mask == 1].min()


@pytest.mark.slow
def test_pruned_weights_stay_exactly_zero_after_100_adam_steps():
    cfg = _cfg()
    state = networks.init_network(jax.random.PRNGKey(0), cfg, 5)
    masks = networks.magnitude_masks(state.params, jnp.float32(0.6))
    params = jax.tree.map(jnp.multiply, state.params, masks)
    optimizer = optax.adam(1e-2)
    obs = jax.random.normal(jax.random.PRNGKey(1), (32, 5))

    def loss(p):
        eff, _, _ = networks.effective_params(p, masks, state.sn_u, cfg.network, False)
        return jnp.mean(networks.apply(eff, obs, cfg) ** 2)

    grads = jax.jit(jax.grad(loss))(params)
    for g, m in zip(jax.tree.leaves(grads), jax.tree.leaves(masks), strict=True):
        np.testing.assert_array_equal(np.asarray(g)[np.asarray(m) == 0], 0.0)

    @jax.jit
    def train(dense_params, params):
        # Adam momentum from before pruning would move masked entries; the masks are re-applied.
        opt_state = optimizer.init(dense_params)
        grads = jax.grad(loss)(dense_params)
        _, opt_state = optimizer.update(grads, opt_state, dense_params)

        def adam_step(_, carry):
            params, opt_state = carry
            updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state, params)
            params = jax.tree.map(jnp.multiply, optax.apply_updates(params, updates), masks)
            return params, opt_state

        return jax.lax.fori_loop(0, 100, adam_step, (params, opt_state))[0]

    start = params
    params = train(state.params, params)
    for p, p0, m in zip(*(jax.tree.leaves(t) for t in (params, start, masks)), strict=True):
        p, p0, m = np.asarray(p), np.asarray(p0), np.asarray(m)
        assert np.all(p[m == 0] == 0.0)
        assert np.mean(p[m == 1] != p0[m == 1]) > 0.5  # the kept weights did train


@pytest.mark.slow
def test_bootstrap_masks_fixed_per_slot_with_rate_prob():
    key = jax.random.PRNGKey(0)
    slots = jnp.arange(4000)
    masks = networks.bootstrap_masks(key, slots, 4, 0.3)
    assert masks.shape == (4000, 4) and masks.dtype == jnp.float32
    assert abs(float(masks.mean()) - 0.3) < 0.02  # 5 sigma of a 16000-draw mean
    again = networks.bootstrap_masks(key, jnp.array([17, 3, 17]), 4, 0.3)
    np.testing.assert_array_equal(again[0], masks[17])
    np.testing.assert_array_equal(again[2], masks[17])
    np.testing.assert_array_equal(again[1], masks[3])


@pytest.mark.slow
def test_spectral_sigma_gradient_is_the_papers_outer_product():
    """d sigma / dW = v u^T (Miyato et al., 2018) with v = W^T u / |W^T u| and u = W v / |W v|
    from one power iteration, computed here in float64 numpy; finite for an all-zero kernel."""
    rng = np.random.default_rng(5)
    kernel = rng.normal(size=(7, 5))
    u = rng.normal(size=5)
    u /= np.linalg.norm(u)
    grad = jax.grad(
        lambda k: networks.spectral_normalise(k, jnp.asarray(u, jnp.float32), "clip")[2]
    )(jnp.asarray(kernel, jnp.float32))
    v = kernel @ u / np.linalg.norm(kernel @ u)
    u_next = v @ kernel / np.linalg.norm(v @ kernel)
    np.testing.assert_allclose(grad, np.outer(v, u_next), rtol=1e-5, atol=1e-6)
    sigma = float(
        networks.spectral_normalise(
            jnp.asarray(kernel, jnp.float32), jnp.asarray(u, jnp.float32), "clip"
        )[2]
    )
    np.testing.assert_allclose(sigma, float(v @ kernel @ u_next), rtol=1e-6)
    zero_grad = jax.grad(
        lambda k: networks.spectral_normalise(k, jnp.asarray(u, jnp.float32), "clip")[2]
    )(jnp.zeros((7, 5), jnp.float32))
    assert np.all(np.isfinite(np.asarray(zero_grad)))


@pytest.mark.slow
def test_forward_is_the_relu_mlp_with_an_out_major_head_against_float64():
    """Torso kernels [in, out], the head's [out, in] (``networks.HEAD``): x @ W_head^T + b."""
    cfg = _cfg("network.n_heads=2", "network.spectral_norm=false")
    params = networks.init_network(jax.random.PRNGKey(3), cfg, 5).params
    params = jax.tree.map(lambda p: p + 0.01, params)  # non-zero biases
    obs = jax.random.normal(jax.random.PRNGKey(4), (7, 5))
    p64 = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
    x = np.asarray(obs, np.float64)
    for name in ("torso_0", "torso_1"):
        x = np.maximum(x @ p64[name]["kernel"] + p64[name]["bias"], 0.0)
    want = (x @ p64["head"]["kernel"].T + p64["head"]["bias"]).reshape(7, 2, 3, 11)
    assert params["head"]["kernel"].shape == (2 * 3 * 11, 8)
    with jax.default_matmul_precision("float32"):  # a GPU's default would be TF32
        logits = networks.apply(params, obs, cfg)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_param_layout_round_trips_and_matches_the_tree_by_hand():
    """The flat order of the gradient surgery's rows: each leaf's entries, row-major, in leaf
    order."""
    cfg = _cfg("network.n_heads=2")
    params = networks.init_network(jax.random.PRNGKey(0), cfg, 5).params
    layout = networks.param_layout(cfg, 5)
    # By hand: head (kernel [2*3*11, 8], stored [out, in], bias [66]), torso_0 ([5, 16], [16]),
    # torso_1 ([16, 8], [8]), leaves in sorted-key order with bias before kernel.
    sizes = [66, 8 * 66, 16, 5 * 16, 8, 16 * 8]
    assert layout.size == sum(sizes)
    assert layout.offsets == tuple(int(np.sum(sizes[:i])) for i in range(len(sizes)))
    flat = layout.ravel(params)
    expected = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree.leaves(params)])
    np.testing.assert_array_equal(np.asarray(flat), expected)
    np.testing.assert_array_equal(
        np.asarray(flat[66 : 66 + 8 * 66]).reshape(66, 8), np.asarray(params["head"]["kernel"])
    )
    assert layout.record() == [
        ["['head']['bias']", [66]],
        ["['head']['kernel']", [66, 8]],
        ["['torso_0']['bias']", [16]],
        ["['torso_0']['kernel']", [5, 16]],
        ["['torso_1']['bias']", [8]],
        ["['torso_1']['kernel']", [16, 8]],
    ]
    back = jax.jit(layout.unravel)(flat)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_init_is_lecun_normal_truncated_at_two_sd_with_unit_u():
    """The distribution of flax's ``lecun_normal`` (variance 1 / fan_in, truncated at 2 sd)."""
    cfg = apply_overrides(SMOKETEST, ["network.hidden=[256,128]", "network.n_atoms=11"])
    state = networks.init_network(jax.random.PRNGKey(5), cfg, 300)
    for name, fan_in in (("torso_0", 300), ("torso_1", 256), ("head", 128)):
        kernel = np.asarray(state.params[name]["kernel"], np.float64)
        bound = 2.0 / np.sqrt(fan_in) / 0.87962566103423978
        assert np.abs(kernel).max() <= bound * (1 + 1e-6)
        assert np.abs(kernel).max() > 0.9 * bound  # the tails are there, cut at 2 sd
        # Sample variance of >= 4,000 draws: within 10 % of 1 / fan_in.
        assert kernel.var() == pytest.approx(1.0 / fan_in, rel=0.1)
        assert abs(kernel.mean()) < 3.0 / np.sqrt(fan_in * kernel.size)  # 3 standard errors
        assert np.all(np.asarray(state.params[name]["bias"]) == 0.0)
    # Layers are not copies of one another's draws, and u is a unit vector per torso layer.
    unit = {
        n: np.asarray(state.params[n]["kernel"]) * np.sqrt(f)
        for n, f in (("torso_1", 256), ("head", 128))
    }
    assert not np.allclose(unit["torso_1"][:8, :8], unit["head"][:8, :8], atol=1e-3)
    for name, width in (("torso_0", 256), ("torso_1", 128)):
        u = np.asarray(state.sn_u[name], np.float64)
        assert u.shape == (width,) and np.linalg.norm(u) == pytest.approx(1.0, rel=1e-6)
    again = networks.init_network(jax.random.PRNGKey(5), cfg, 300)
    np.testing.assert_array_equal(again.params["head"]["kernel"], state.params["head"]["kernel"])


def test_mirror_averages_the_logits_of_an_observation_and_its_mirror_image():
    """network.mirror against the plain network with the same parameters: logits(obs) = (plain(obs)
    + plain(mirrored obs) with each action's opposite) / 2, so the mirrored observation's logits
    are the observation's with the actions reversed (positions -1, 0, 1)."""
    on = _cfg("network.mirror=true", "network.n_heads=2")
    plain = _cfg("network.n_heads=2")
    n_features = 15  # SMOKETEST's scaled returns: 8 return columns, then close_location at 9
    obs = jax.random.normal(jax.random.PRNGKey(3), (4, 3, n_features + 1))
    obs = obs.at[..., -1].set(jnp.array([-1.0, 0.0, 1.0]))
    signs = np.ones(n_features + 1, np.float32)
    signs[[*range(8), 9, n_features]] = -1.0
    params = networks.init_network(jax.random.PRNGKey(4), on, n_features + 1).params
    mirror = obs * signs
    expected = 0.5 * (
        np.asarray(networks.apply(params, obs, plain), np.float64)
        + np.asarray(networks.apply(params, mirror, plain), np.float64)[..., ::-1, :]
    )
    logits = np.asarray(networks.apply(params, obs, on))
    assert logits.shape == (4, 3, 2, 3, 11)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(networks.apply(params, mirror, on))[..., ::-1, :], logits, rtol=1e-5, atol=1e-6
    )
    assert np.abs(logits - np.asarray(networks.apply(params, obs, plain))).max() > 1e-3


def test_mirror_needs_symmetric_positions():
    with pytest.raises(ValueError, match="network.mirror"):
        _cfg("network.mirror=true", "env.positions=[0,1]")
