"""Environment: hand-computed rewards, float64 reference agreement, no look-ahead, slices, vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference_backtest import backtest

from jdqn.config import EnvConfig
from jdqn.evaluation import env

N_BARS = 32  # fixed array length in property tests: one compile, windows vary via start/end
N_FEATURES = 3
EPS32 = float(np.finfo(np.float32).eps)
GRIDS = [(-1.0, 0.0, 1.0), (-2.0, -1.0, 0.0, 1.0, 2.0), (-1.0, 1.0), (0.0, 1.0), (-0.5, 0.5, 1.0)]


def _run(params, actions):
    """Step one episode over ``actions`` [K] with a scan (auto-reset continues past done)."""
    key = jax.random.key(0)
    obs0, state0 = env.reset(key, params)

    def body(state, action):
        obs, state, reward, done, info = env.step(key, state, action, params)
        return state, (obs, state, reward, done, info)

    _, out = jax.lax.scan(body, state0, actions)
    return obs0, out


_run_jit = jax.jit(_run)


@st.composite
def markets(draw, min_bars=3):
    """Closes on the 0.25 grid around 1000-6000 points, random features, window, grid, costs."""
    ticks0 = draw(st.integers(4_000, 24_000))
    moves = draw(st.lists(st.integers(-20, 20), min_size=N_BARS - 1, max_size=N_BARS - 1))
    close = (ticks0 + np.concatenate([[0], np.cumsum(moves)])).astype(np.float32) * 0.25
    seed = draw(st.integers(0, 2**31 - 1))
    features = np.random.default_rng(seed).normal(size=(N_BARS, N_FEATURES)).astype(np.float32)
    start = draw(st.integers(0, N_BARS - min_bars))
    end = draw(st.integers(start + min_bars, N_BARS))
    cfg = EnvConfig(
        positions=draw(st.sampled_from(GRIDS)),
        slippage_ticks=draw(st.floats(0.0, 4.0)),
        commission_ticks=draw(st.floats(0.0, 1.0)),
        reward_scale=draw(st.floats(0.01, 100.0)),
        hold_penalty=draw(st.sampled_from([0.0, 0.05, 1.5])),
    )
    actions = draw(
        st.lists(st.integers(0, len(cfg.positions) - 1), min_size=N_BARS - 1, max_size=N_BARS - 1)
    )
    return features, close, cfg, start, end, np.array(actions, np.int32)


def test_hand_computed_four_bars_long_then_short_then_flat():
    # cost = (1 tick slippage + 0.2 tick commission) x 0.25 = 0.3 points per contract
    close = np.array([100.0, 101.0, 99.5, 100.25], np.float32)
    features = np.arange(8, dtype=np.float32).reshape(4, 2)
    params = env.make_params(features, close, EnvConfig())
    obs0, (obs, state, reward, done, info) = _run(params, jnp.array([2, 0, 1]))
    # t=0: flat -> +1: +1 x 1.0 - 0.3 x 1 = 0.7
    # t=1: +1 -> -1 (|d|=2): -1 x -1.5 - 0.3 x 2 = 0.9
    # t=2: -1 -> 0: 0 - 0.3 x 1 = -0.3, and bar 3 = end-1 ends the episode
    np.testing.assert_allclose(reward, [0.7, 0.9, -0.3], rtol=1e-6)
    np.testing.assert_array_equal(info["pnl_points"], [1.0, 1.5, 0.0])
    np.testing.assert_allclose(info["cost_points"], [0.3, 0.6, 0.3], rtol=1e-6)
    np.testing.assert_array_equal(done, [False, False, True])
    np.testing.assert_array_equal(obs0, [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(obs[0], [2.0, 3.0, 1.0])
    np.testing.assert_array_equal(obs[1], [4.0, 5.0, -1.0])
    # done: auto-reset to bar 0, flat; the transition still describes the real last step
    np.testing.assert_array_equal(obs[2], [0.0, 1.0, 0.0])
    assert int(state.t[2]) == 0 and float(state.position[2]) == 0.0
    tr = info["transition"]
    np.testing.assert_array_equal(tr.features, features[:3])
    np.testing.assert_array_equal(tr.next_features, features[1:4])
    np.testing.assert_array_equal(tr.position, [0.0, 1.0, -1.0])
    np.testing.assert_array_equal(tr.action, [2, 0, 1])
    np.testing.assert_array_equal(tr.price_change, [1.0, -1.5, 0.75])
    np.testing.assert_array_equal(tr.done, [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(tr.reward, reward)
    assert tr.done.dtype == jnp.float32 and tr.action.dtype == jnp.int32


def test_hold_penalty_charges_training_rewards_only():
    # Long, flat, short over the four bars: the held bars are charged 0.25 reward units each.
    close = np.array([100.0, 101.0, 99.5, 100.25], np.float32)
    cfg = EnvConfig(reward_scale=0.5, hold_penalty=0.25)
    params = env.make_params(np.zeros((4, 1), np.float32), close, cfg)
    _, (_, _, reward, _, info) = _run(params, jnp.array([2, 1, 0]))
    # 0.5 x (1.0 - 0.3) - 0.25, 0.5 x (0 - 0.3), 0.5 x (-0.75 - 0.3) - 0.25
    np.testing.assert_allclose(reward, [0.1, -0.15, -0.775], rtol=1e-6)
    np.testing.assert_allclose(info["transition"].reward, reward, rtol=0)
    np.testing.assert_array_equal(info["pnl_points"], [1.0, 0.0, -0.75])  # judged: no charge
    np.testing.assert_allclose(info["cost_points"], [0.3, 0.3, 0.3], rtol=1e-6)
    with pytest.raises(ValueError, match="env.hold_penalty"):
        EnvConfig(hold_penalty=-0.1)


def test_train_cost_scale_charges_training_rewards_only():
    # Long, flat, short: each move trades one contract, 0.3 points charged twice as much.
    close = np.array([100.0, 101.0, 99.5, 100.25], np.float32)
    cfg = EnvConfig(reward_scale=0.5, train_cost_scale=2.0)
    params = env.make_params(np.zeros((4, 1), np.float32), close, cfg)
    _, (_, _, reward, _, info) = _run(params, jnp.array([2, 1, 0]))
    # 0.5 x (1.0 - 0.6), 0.5 x (0 - 0.6), 0.5 x (-0.75 - 0.6)
    np.testing.assert_allclose(reward, [0.2, -0.3, -0.675], rtol=1e-6)
    np.testing.assert_array_equal(info["pnl_points"], [1.0, 0.0, -0.75])  # judged: real costs
    np.testing.assert_allclose(info["cost_points"], [0.3, 0.3, 0.3], rtol=1e-6)
    with pytest.raises(ValueError, match="env.train_cost_scale"):
        EnvConfig(train_cost_scale=-0.5)


def test_reward_scale_multiplies_net_points():
    close = np.array([100.0, 101.0, 99.5, 100.25], np.float32)
    params = env.make_params(np.zeros((4, 1), np.float32), close, EnvConfig(reward_scale=0.5))
    _, (_, _, reward, _, info) = _run(params, jnp.array([2, 0, 1]))
    np.testing.assert_allclose(reward, [0.35, 0.45, -0.15], rtol=1e-6)
    np.testing.assert_allclose(info["cost_points"], [0.3, 0.6, 0.3], rtol=1e-6)  # unscaled


@pytest.mark.slow
@given(markets())
def test_matches_float64_reference(market):
    """Tolerance: prices and price changes on the 0.25 grid below 2^24 ticks are exact in float32,
    and so is position x change for positions on the 0.5 grid, so gross PnL must match exactly.
    The reward then rounds at most ~8 times (cost to float32, cost x |d|, subtraction, scale to
    float32, multiply, the hold charge's three), each within eps32/2 of the largest magnitude
    involved; 8 eps32 x (scale x (|pnl| + |cost|) + hold charge) bounds it with margin (about
    1e-4 points at 2000-point moves). XLA on CPU flushes float32 subnormals to zero, hence the
    absolute floor of a few float32 ``tiny``."""
    features, close, cfg, start, end, actions = market
    params = env.make_params(features, close, cfg, start, end)
    n, scale = end - start - 1, cfg.reward_scale
    _, (_, state, reward, done, info) = _run_jit(params, jnp.asarray(actions))
    ref = backtest(
        close,
        cfg.positions,
        actions[:n],
        cost_points=cfg.cost_points,
        reward_scale=cfg.reward_scale,
        hold_penalty=cfg.hold_penalty,
        start=start,
        end=end,
    )
    np.testing.assert_array_equal(np.asarray(info["pnl_points"][:n], np.float64), ref.pnl_points)
    hold_charge = cfg.hold_penalty * np.abs(ref.positions)
    tol = 8 * EPS32 * (scale * (np.abs(ref.pnl_points) + np.abs(ref.cost_points)) + hold_charge)
    floor = 4 * float(np.finfo(np.float32).tiny)
    assert np.all(np.abs(np.asarray(reward[:n], np.float64) - ref.reward) <= tol + floor * scale)
    cost_tol = 4 * EPS32 * ref.cost_points + floor
    assert np.all(
        np.abs(np.asarray(info["cost_points"][:n], np.float64) - ref.cost_points) <= cost_tol
    )
    np.testing.assert_array_equal(np.asarray(done[:n]), ref.done)
    np.testing.assert_array_equal(np.asarray(info["transition"].position[1:n]), ref.positions[:-1])
    # the step that ends the episode hands back a reset (flat, at start) state
    assert int(state.t[n - 1]) == start and float(state.position[n - 1]) == 0.0


@given(
    st.lists(st.integers(-40, 40), min_size=N_BARS - 1, max_size=N_BARS - 1),
    st.lists(st.integers(0, 2), min_size=N_BARS - 1, max_size=N_BARS - 1),
    st.integers(0, 8),
)
def test_rewards_on_the_tick_grid_are_exact(moves, actions, slippage_ticks):
    # cost a whole number of ticks and scale 1: every quantity is a multiple of 0.25, exact
    close = (4_000.0 + 0.25 * np.concatenate([[0], np.cumsum(moves)])).astype(np.float32)
    cfg = EnvConfig(slippage_ticks=float(slippage_ticks), commission_ticks=0.0)
    params = env.make_params(np.zeros((N_BARS, 1), np.float32), close, cfg)
    _, (_, _, reward, _, _) = _run_jit(params, jnp.asarray(actions, jnp.int32))
    ref = backtest(close, cfg.positions, actions, cost_points=cfg.cost_points)
    np.testing.assert_array_equal(np.asarray(reward, np.float64), ref.reward)


@pytest.mark.slow
@given(markets(), st.integers(1, N_BARS - 2), st.integers(0, 2**31 - 1))
def test_no_look_ahead(market, t, seed):
    """Observations up to bar t (and rewards up to step t-1) ignore every bar after t."""
    features, close, cfg, _, _, actions = market
    rng = np.random.default_rng(seed)
    features_alt, close_alt = features.copy(), close.copy()
    features_alt[t + 1 :] = rng.normal(size=features_alt[t + 1 :].shape)
    close_alt[t + 1 :] = 0.25 * rng.integers(4_000, 24_000, size=close_alt[t + 1 :].shape)
    outs = [
        _run_jit(env.make_params(f, c, cfg), jnp.asarray(actions))
        for f, c in ((features, close), (features_alt, close_alt))
    ]
    (obs0_a, (obs_a, _, reward_a, _, _)), (obs0_b, (obs_b, _, reward_b, _, _)) = outs
    np.testing.assert_array_equal(obs0_a, obs0_b)
    # obs[k] is the observation at bar k+1
    np.testing.assert_array_equal(obs_a[:t], obs_b[:t])
    np.testing.assert_array_equal(reward_a[:t], reward_b[:t])
    assert t + 1 >= N_BARS - 1 or not np.array_equal(obs_a[t], obs_b[t])  # the test can fail


def test_make_params_validates_window():
    close = np.zeros(5, np.float32)
    features = np.zeros((5, 2), np.float32)
    for start, end in ((0, 1), (3, 4), (-1, 5), (0, 6)):
        with pytest.raises(ValueError, match="make_params"):
            env.make_params(features, close, EnvConfig(), start, end)
    with pytest.raises(ValueError, match="make_params"):
        env.make_params(features[:4], close, EnvConfig())
    params = env.make_params(features, close, EnvConfig(), 1, 5)
    assert params.features.dtype == jnp.float32 and params.start.dtype == jnp.int32
    assert int(env.n_steps(params)) == 3


@pytest.mark.parametrize(
    ("start", "end", "n_slices", "bounds"),
    [
        (0, 23, 4, [(3, 8), (8, 13), (13, 18), (18, 23)]),  # 3 leftover bars dropped, oldest
        (3, 13, 5, [(3, 5), (5, 7), (7, 9), (9, 11), (11, 13)]),
        (0, 7, 1, [(0, 7)]),
    ],
)
def test_slice_params_tile_the_newest_bars_contiguously(start, end, n_slices, bounds):
    params = env.make_params(np.zeros((30, 2), np.float32), np.zeros(30, np.float32), EnvConfig())
    sliced = env.slice_params(params.replace(start=jnp.int32(start), end=jnp.int32(end)), n_slices)
    assert list(zip(sliced.start.tolist(), sliced.end.tolist(), strict=True)) == bounds
    assert sliced.close is params.close  # data shared, not copied


def test_slice_params_works_inside_jit_and_vmap_on_params_built_there():
    def slice_ends(features, close):
        return env.slice_params(env.make_params(features, close, EnvConfig()), 4).end

    features, close = jnp.zeros((2, 22, 2)), jnp.zeros((2, 22))
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(slice_ends))(features, close), [[7, 12, 17, 22]] * 2
    )


def test_slice_params_rejects_slices_shorter_than_two_bars():
    params = env.make_params(np.zeros((9, 2), np.float32), np.zeros(9, np.float32), EnvConfig())
    with pytest.raises(ValueError, match="fewer than 2 per slice"):
        env.slice_params(params, 5)
    assert env.slice_params(params, 4).start.shape == (4,)


def _random_fold(seed, n_bars=N_BARS, cfg=None):
    rng = np.random.default_rng(seed)
    close = (4_000 + 0.25 * np.cumsum(rng.integers(-8, 9, n_bars))).astype(np.float32)
    features = rng.normal(size=(n_bars, N_FEATURES)).astype(np.float32)
    return env.make_params(features, close, cfg or EnvConfig())


def _run_slices(sliced, actions):
    """Lock-step run of S slices over actions [K, S]."""
    key = jax.random.key(1)
    obs0, states0 = env.reset_slices(key, sliced, sliced.start.shape[0])

    def body(states, actions_t):
        obs, states, reward, done, info = env.step_slices(key, states, actions_t, sliced)
        return states, (obs, states, reward, done, info)

    _, out = jax.lax.scan(body, states0, actions)
    return obs0, out


_run_slices_jit = jax.jit(_run_slices)


@pytest.mark.slow
def test_lock_step_slices_equal_independent_episodes():
    n_slices, n_iters = 4, 20  # slices of 5 bars (bars 3..22): several auto-resets each
    params = _random_fold(0, n_bars=23)
    sliced = env.slice_params(params, n_slices)
    actions = jnp.asarray(np.random.default_rng(1).integers(0, 3, (n_iters, n_slices)), jnp.int32)
    obs0, (obs, states, reward, done, info) = _run_slices_jit(sliced, actions)
    assert obs.shape == (n_iters, n_slices, N_FEATURES + 1)
    for s in range(n_slices):
        start, end = int(sliced.start[s]), int(sliced.end[s])
        single = params.replace(start=jnp.int32(start), end=jnp.int32(end))
        s_obs0, (s_obs, s_state, s_reward, s_done, s_info) = _run_jit(single, actions[:, s])
        np.testing.assert_array_equal(obs0[s], s_obs0)
        np.testing.assert_array_equal(obs[:, s], s_obs)
        np.testing.assert_array_equal(reward[:, s], s_reward)
        np.testing.assert_array_equal(states.t[:, s], s_state.t)
        jax.tree.map(
            lambda a, b, s=s: np.testing.assert_array_equal(a[:, s], b),
            info["transition"],
            s_info["transition"],
        )
        # done exactly at the slice end, every (end - start - 1) steps; then reset to (start, 0)
        steps = end - start - 1
        expected_done = (np.arange(n_iters) + 1) % steps == 0
        np.testing.assert_array_equal(done[:, s], expected_done)
        np.testing.assert_array_equal(states.t[expected_done, s], start)
        np.testing.assert_array_equal(states.position[expected_done, s], 0.0)
        # lock-step never reads across slice bounds
        assert np.all((states.t[:, s] >= start) & (states.t[:, s] <= end - 2))
        # and each episode agrees with the float64 reference
        ref = backtest(
            params.close, EnvConfig().positions, np.asarray(actions[:steps, s]),
            cost_points=EnvConfig().cost_points, start=start, end=end,
        )  # fmt: skip
        np.testing.assert_allclose(reward[:steps, s], ref.reward, rtol=1e-6, atol=1e-5)


def test_reset_slices_checks_slice_count():
    sliced = env.slice_params(_random_fold(0), 4)
    with pytest.raises(ValueError, match="slice_params"):
        env.reset_slices(jax.random.key(0), sliced, 3)


@pytest.mark.slow
def test_vmap_over_folds_of_different_data():
    folds = [_random_fold(10), _random_fold(11).replace(start=jnp.int32(4), end=jnp.int32(20))]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *folds)
    actions = jnp.asarray(np.random.default_rng(2).integers(0, 3, (2, N_BARS - 1)), jnp.int32)
    batched = jax.jit(jax.vmap(_run))(stacked, actions)
    for i, fold in enumerate(folds):
        single = _run_jit(fold, actions[i])
        jax.tree.map(lambda a, b, i=i: np.testing.assert_array_equal(a[i], b), batched, single)
    # folds x slices: vmap over folds of the lock-step slice run
    n_slices = 3
    sliced = jax.tree.map(
        lambda *leaves: jnp.stack(leaves), *[env.slice_params(f, n_slices) for f in folds]
    )
    slice_actions = jnp.asarray(
        np.random.default_rng(3).integers(0, 3, (2, 12, n_slices)), jnp.int32
    )
    nested = jax.jit(jax.vmap(_run_slices))(sliced, slice_actions)
    for i, fold in enumerate(folds):
        single = _run_slices_jit(env.slice_params(fold, n_slices), slice_actions[i])
        jax.tree.map(lambda a, b, i=i: np.testing.assert_array_equal(a[i], b), nested, single)
    assert not np.array_equal(batched[1][2][0], batched[1][2][1])  # folds really differ


@pytest.mark.slow
def test_jit_matches_no_jit_and_does_not_recompile():
    cfg = EnvConfig(positions=(-2.0, -1.0, 0.0, 1.0, 2.0))
    params = _random_fold(5, n_bars=12, cfg=cfg)  # short: the unjitted scan runs op by op
    actions = jnp.asarray(np.random.default_rng(4).integers(0, 5, 11), jnp.int32)
    jitted = _run_jit(params, actions)
    with jax.disable_jit():
        eager = _run(params, actions)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), jitted, eager)
    # A private wrapper: jit caches are shared per function, and other tests jit env.step too.
    step_jit = jax.jit(lambda *args: env.step(*args))
    _, state = env.reset(jax.random.key(0), params)
    other_fold = _random_fold(6, n_bars=12, cfg=cfg)
    other_window = env.make_params(other_fold.features, other_fold.close, cfg, 3, 9)
    for other in (params, other_window):
        step_jit(jax.random.key(0), state, jnp.int32(1), other)
    assert step_jit._cache_size() == 1
