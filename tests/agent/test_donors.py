"""HER donors: rewards against a float64 reference and the environment, donor structure."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.agent.donors import donor_rewards, make_donors, n_donors_for
from jdqn.agent.transition import Transition
from jdqn.config import EnvConfig

POSITIONS = np.array([-1.0, 0.0, 1.0])
COST_POINTS = 0.3  # (1 + 0.2) ticks x 0.25
SCALE = 0.5
HOLD = 0.2  # hold penalty, reward units per bar and unit held


def reward64(positions, price_change, held, action, cost_points, scale, hold):
    """docs/design.md §3, float64: pos_new * dP - cost * |pos_new - pos_old|, times the scale,
    less the hold charge hold * |pos_new|."""
    new = np.float64(positions[action])
    net = new * np.float64(price_change) - cost_points * abs(new - np.float64(held))
    return scale * net - hold * abs(new)


def random_batch(rng, size, n_features=3, positions=POSITIONS, cost=COST_POINTS, scale=SCALE):
    held = rng.choice(positions, size=size)
    action = rng.integers(0, len(positions), size=size)
    price_change = np.round(rng.normal(0, 2.0, size=size) * 4) / 4  # tick grid
    reward = [
        reward64(positions, price_change[i], held[i], action[i], cost, scale, HOLD)
        for i in range(size)
    ]
    return Transition(
        features=jnp.asarray(rng.normal(size=(size, n_features)), jnp.float32),
        position=jnp.asarray(held, jnp.float32),
        action=jnp.asarray(action, jnp.int32),
        reward=jnp.asarray(reward, jnp.float32),
        next_features=jnp.asarray(rng.normal(size=(size, n_features)), jnp.float32),
        price_change=jnp.asarray(price_change, jnp.float32),
        done=jnp.asarray(rng.random(size) < 0.2, jnp.float32),
    )


@pytest.mark.slow
def test_donor_rewards_match_float64_reference():
    rng = np.random.default_rng(0)
    batch = random_batch(rng, 40)
    got = np.asarray(donor_rewards(batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD))
    assert got.shape == (40, 3) and got.dtype == np.float32
    for i in range(40):
        for a in range(3):
            want = reward64(
                POSITIONS,
                batch.price_change[i],
                batch.position[i],
                a,
                COST_POINTS,
                SCALE,
                HOLD,
            )
            assert got[i, a] == pytest.approx(want, rel=1e-6, abs=1e-6)
    # The taken action's recomputed reward is the stored one.
    np.testing.assert_allclose(got[np.arange(40), batch.action], batch.reward, rtol=1e-6)


def test_donor_rewards_hand_case():
    # Held short (-1), price rises 2 points: flat costs 1 contract, long costs 2 and earns 2.
    batch = random_batch(np.random.default_rng(1), 1)._replace(
        position=jnp.array([-1.0]), price_change=jnp.array([2.0])
    )
    got = donor_rewards(batch, jnp.asarray(POSITIONS), 0.3, 1.0, 0.0)
    np.testing.assert_allclose(got[0], [-2.0, -0.3, 2.0 - 0.6], rtol=1e-6)
    # A hold penalty of 0.5 charges short and long 0.5 each, flat nothing.
    got = donor_rewards(batch, jnp.asarray(POSITIONS), 0.3, 1.0, 0.5)
    np.testing.assert_allclose(got[0], [-2.5, -0.3, 2.0 - 0.6 - 0.5], rtol=1e-6)
    # A training cost scale of 2 charges twice the cost: flat 0.6, long 1.2.
    got = donor_rewards(batch, jnp.asarray(POSITIONS), 0.3, 1.0, 0.0, 2.0)
    np.testing.assert_allclose(got[0], [-2.0, -0.6, 2.0 - 1.2], rtol=1e-6)


@pytest.mark.slow
def test_donor_rewards_equal_environment_rewards():
    env = pytest.importorskip("jdqn.evaluation.env", reason="jdqn.evaluation.env not written yet")
    rng = np.random.default_rng(2)
    grid = (-2.0, -1.0, 0.0, 1.0, 2.0)
    cfg = EnvConfig(positions=grid, reward_scale=0.25, hold_penalty=0.1, train_cost_scale=1.5)
    n_bars, n_features = 30, 4
    close = 4000.0 + np.cumsum(np.round(rng.normal(0, 1.5, size=n_bars) * 4) / 4)
    features = rng.normal(size=(n_bars, n_features)).astype(np.float32)
    params = env.make_params(features, close, cfg)
    positions = jnp.asarray(cfg.positions, jnp.float32)
    step = jax.jit(env.step)
    key = jax.random.key(0)
    checked = 0
    for t in range(n_bars - 2):
        held = float(rng.choice(cfg.positions))
        state = env.EnvState(t=jnp.int32(t), position=jnp.float32(held))
        _, _, _, _, info = step(key, state, jnp.int32(0), params)
        stored = jax.tree.map(lambda leaf: leaf[None], info["transition"])
        charges = (cfg.cost_points, 0.25, 0.1, 1.5)
        all_rewards = np.asarray(donor_rewards(stored, positions, *charges))[0]
        for a in range(cfg.n_actions):
            _, _, env_reward, _, _ = step(key, state, jnp.int32(a), params)
            assert all_rewards[a] == pytest.approx(float(env_reward), rel=1e-6, abs=1e-5)
            checked += 1
    assert checked == (n_bars - 2) * cfg.n_actions


@pytest.mark.slow
def test_best_donors_take_the_hindsight_best_other_action():
    rng = np.random.default_rng(3)
    batch = random_batch(rng, 32)
    donors = make_donors(
        jax.random.key(7), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "best", 20
    )
    assert donors.action.shape == (20,) and donors.features.shape == (20, 3)
    rows = [int(np.flatnonzero(np.all(batch.features == f, axis=1))[0]) for f in donors.features]
    assert len(set(rows)) == 20, "rows drawn without replacement"
    for d, row in enumerate(rows):
        taken = int(batch.action[row])
        rewards = [
            reward64(
                POSITIONS, batch.price_change[row], batch.position[row], a, COST_POINTS, SCALE, HOLD
            )
            for a in range(3)
        ]
        others = [a for a in range(3) if a != taken]
        best = max(others, key=lambda a: (rewards[a], -a))  # ties -> lowest index
        assert int(donors.action[d]) == best
        assert float(donors.reward[d]) == pytest.approx(rewards[best], rel=1e-6, abs=1e-6)
        for name in ("position", "next_features", "price_change", "done"):
            np.testing.assert_array_equal(getattr(donors, name)[d], getattr(batch, name)[row])


@pytest.mark.slow
def test_all_donors_cover_every_other_action_once():
    rng = np.random.default_rng(4)
    batch = random_batch(rng, 16)
    donors = make_donors(
        jax.random.key(1), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "all", 10
    )
    assert donors.action.shape == (10,)
    for r in range(5):
        block = slice(2 * r, 2 * r + 2)
        features = np.asarray(donors.features[block])
        np.testing.assert_array_equal(features[0], features[1])
        row = int(np.flatnonzero(np.all(batch.features == features[0], axis=1))[0])
        taken = int(batch.action[row])
        assert sorted(np.asarray(donors.action[block]).tolist()) == [
            a for a in range(3) if a != taken
        ]
        actions, rewards = np.asarray(donors.action[block]), np.asarray(donors.reward[block])
        for a, reward in zip(actions, rewards, strict=True):
            want = reward64(
                POSITIONS, batch.price_change[row], batch.position[row], a, COST_POINTS, SCALE, HOLD
            )
            assert reward == pytest.approx(want, rel=1e-6, abs=1e-6)


@pytest.mark.slow
def test_donor_rows_depend_on_the_key_and_jit_matches_eager():
    batch = random_batch(np.random.default_rng(5), 64)
    make = lambda key: make_donors(
        key, batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "best", 16
    )
    a, b = make(jax.random.key(0)), make(jax.random.key(1))
    assert not np.array_equal(a.features, b.features)
    jitted = jax.jit(make)(jax.random.key(0))
    for x, y in zip(jax.tree.leaves(jitted), jax.tree.leaves(a), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.slow
def test_make_donors_vmaps_over_a_seed_axis():
    batches = [random_batch(np.random.default_rng(s), 12) for s in (8, 9)]
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches)
    keys = jax.random.split(jax.random.key(3), 2)
    make = lambda key, batch: make_donors(
        key, batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "all", 6
    )
    batched = jax.vmap(make)(keys, stacked)
    for i in range(2):
        single = make(keys[i], batches[i])
        for x, y in zip(jax.tree.leaves(batched), jax.tree.leaves(single), strict=True):
            np.testing.assert_array_equal(x[i], y)


@pytest.mark.parametrize("mode,n", [("none", 5), ("best", 0), ("all", 0)])
def test_empty_donors(mode, n):
    batch = random_batch(np.random.default_rng(6), 8)
    donors = make_donors(
        jax.random.key(0), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, mode, n
    )
    for leaf, ref in zip(jax.tree.leaves(donors), jax.tree.leaves(batch), strict=True):
        assert leaf.shape == (0, *ref.shape[1:]) and leaf.dtype == ref.dtype


def test_make_donors_rejects_bad_counts():
    batch = random_batch(np.random.default_rng(7), 8)
    with pytest.raises(ValueError, match="multiple of 2"):
        make_donors(
            jax.random.key(0), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "all", 3
        )
    with pytest.raises(ValueError, match="at most 8"):
        make_donors(
            jax.random.key(0), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "best", 9
        )
    with pytest.raises(ValueError, match="donor mode"):
        make_donors(
            jax.random.key(0), batch, jnp.asarray(POSITIONS), COST_POINTS, SCALE, HOLD, "some", 1
        )


def test_n_donors_for():
    assert n_donors_for(64, 0.25, "best", 3) == 16
    assert n_donors_for(64, 0.25, "none", 3) == 0
    assert n_donors_for(64, 2.0, "best", 3) == 64  # one per row at most
    assert n_donors_for(64, 0.25, "all", 3) == 16  # multiple of 2
    assert n_donors_for(64, 0.25, "all", 4) == 15  # 16 rounded down to a multiple of 3
    assert n_donors_for(64, 4.0, "all", 3) == 128  # every other action of every row
    assert n_donors_for(10, 0.05, "all", 3) == 0  # round(0.5) = 0 (halves to even)
    with pytest.raises(ValueError):
        n_donors_for(64, 0.25, "bogus", 3)
