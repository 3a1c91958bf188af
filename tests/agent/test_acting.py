"""Action selection (jdqn.agent.acting) against float64 numpy: the heads' mixture mean and
standard deviation, the risk penalty and the no-trade band in cost units."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.agent import networks
from jdqn.agent.acting import action_scores
from jdqn.config import DEFAULT, apply_overrides

CFG = apply_overrides(DEFAULT, ["env.reward_scale=2.0"])  # positions (-1, 0, 1), +-10, 51 atoms


def _with(risk: float = 0.0, band: float = 0.0):
    return dataclasses.replace(
        CFG, train=dataclasses.replace(CFG.train, act_risk=risk, act_band_costs=band)
    )


def _reference(logits: np.ndarray, position: np.ndarray, risk: float, band: float) -> np.ndarray:
    """mean - risk x std of the heads' equal-weight mixture, + band round trips on the held
    action."""
    logits = logits.astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    mixture = probs.mean(axis=-3)  # [B, A, N]
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    mean = (mixture * z).sum(-1)
    std = np.sqrt((mixture * z**2).sum(-1) - mean**2)
    held = np.asarray(CFG.env.positions)[None, :] == position[:, None]
    cost_reward_units = 2 * CFG.env.cost_points * CFG.env.reward_scale  # one round trip
    return mean - risk * std + band * cost_reward_units * held


@pytest.mark.parametrize(("risk", "band"), [(0.0, 0.0), (0.5, 0.0), (0.0, 1.5), (1.0, 2.0)])
def test_scores_match_a_float64_mixture(risk, band):
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 2.0, (7, 5, 3, 51)).astype(np.float32)  # [B, K, A, N]
    position = rng.choice([-1.0, 0.0, 1.0], 7).astype(np.float32)
    scores = jax.jit(lambda x, p: action_scores(x, p, _with(risk, band)))(logits, position)
    expected = _reference(logits, position, risk, band)
    np.testing.assert_allclose(np.asarray(scores), expected, rtol=0, atol=2e-5)


@pytest.mark.slow
def test_without_risk_or_band_the_scores_are_the_head_mean_q_bit_for_bit():
    logits = jax.random.normal(jax.random.PRNGKey(0), (4, 5, 3, 51)) * 3.0
    head_mean = jnp.mean(networks.q_values(logits, networks.atoms(CFG.network)), axis=-2)
    scores = action_scores(logits, jnp.zeros(4), _with())
    assert np.array_equal(np.asarray(scores), np.asarray(head_mean))


def _two_atoms(value_low: float, value_high: float, weight_high: float) -> np.ndarray:
    """One head's logits [N] putting ``weight_high`` on the atom at value_high, rest on low."""
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    probs = np.full(z.shape, 1e-9)
    probs[np.argmin(np.abs(z - value_low))] += 1 - weight_high
    probs[np.argmin(np.abs(z - value_high))] += weight_high
    return np.log(probs)


@pytest.mark.slow
def test_risk_makes_a_certain_small_loss_beat_a_wide_gamble_with_a_better_mean():
    # Short: -0.4 for sure. Flat: the same. Long: +-4 at 52/48, mean +0.16, std about 4.
    logits = np.stack([_two_atoms(-0.4, -0.4, 0.0), _two_atoms(-0.4, -0.4, 0.0)])
    logits = np.concatenate([logits, _two_atoms(-4.0, 4.0, 0.52)[None]])[None, None]  # [1,1,3,N]
    position = jnp.zeros(1)
    neutral = action_scores(jnp.asarray(logits, jnp.float32), position, _with())
    averse = action_scores(jnp.asarray(logits, jnp.float32), position, _with(risk=0.25))
    assert int(jnp.argmax(neutral[0])) == 2 and int(jnp.argmax(averse[0])) == 0


def test_the_band_keeps_the_held_position_until_another_beats_it_by_the_band():
    cost = 2 * CFG.env.cost_points * CFG.env.reward_scale  # one round trip, reward units
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    step = z[1] - z[0]  # one atom, 0.4; a round trip is 2 x 0.3 points x 2 = 1.2 reward units
    # Long is worth one atom more than flat: held flat, a band of step / cost - 0.1 round trips
    # lets long win, one of step / cost + 0.1 keeps flat.
    logits = np.stack([_two_atoms(0.0, 0.0, 0.0), _two_atoms(0.0, 0.0, 0.0)])
    logits = np.concatenate([logits, _two_atoms(step, step, 0.0)[None]])[None, None]
    logits = jnp.asarray(logits, jnp.float32)
    flat = jnp.zeros(1)
    below, above = step / cost - 0.1, step / cost + 0.1
    assert int(jnp.argmax(action_scores(logits, flat, _with(band=below))[0])) == 2
    assert int(jnp.argmax(action_scores(logits, flat, _with(band=above))[0])) == 1
    # Held long, the band favours long instead.
    long = jnp.ones(1)
    assert int(jnp.argmax(action_scores(logits, long, _with(band=above))[0])) == 2


@pytest.mark.parametrize("field", ["act_risk", "act_band_costs"])
def test_negative_settings_are_refused_naming_the_field(field):
    with pytest.raises(ValueError, match=f"train.{field}"):
        apply_overrides(DEFAULT, [f"train.{field}=-0.5"])


@pytest.mark.slow
def test_the_target_picks_a_star_by_each_heads_mean_minus_std():
    """Double-DQN a* at s' as acting picks: the wide gamble without risk, the certain -0.4 with
    it; the target net's Q at that a* (float64 numpy) enters y."""
    from jdqn.agent import losses

    online = np.concatenate(
        [np.stack([_two_atoms(-0.4, -0.4, 0.0)] * 2), _two_atoms(-4.0, 4.0, 0.52)[None]]
    )[None, None]  # [R=1, K=1, A=3, N]
    target = np.random.default_rng(0).normal(0.0, 1.0, online.shape).astype(np.float32)
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    target_probs = np.exp(target.astype(np.float64))
    target_q = (target_probs / target_probs.sum(-1, keepdims=True) * z).sum(-1)[0, 0]  # [A]
    reward, discount = jnp.zeros(1), jnp.full(1, 0.85)
    for risk, a_star in ((0.0, 2), (0.25, 0)):
        out = losses.td_target(
            jnp.asarray(online, jnp.float32), jnp.asarray(target), reward, discount, _with(risk)
        )
        np.testing.assert_allclose(float(out.q_star[0, 0]), target_q[a_star], atol=1e-5)


@pytest.mark.slow
def test_position_magnitude_is_the_plain_network_on_obs_with_abs_position_appended():
    on = apply_overrides(CFG, ["network.position_magnitude=true"])
    obs = (
        jax.random.normal(jax.random.PRNGKey(1), (6, 9))
        .at[:, -1]
        .set(jnp.array([-1.0, 0.0, 1.0, -1.0, 0.0, 1.0]))
    )
    params = networks.init_network(jax.random.PRNGKey(2), on, 9).params
    assert params["torso_0"]["kernel"].shape == (10, CFG.network.hidden[0])
    with_abs = jnp.concatenate([obs, jnp.abs(obs[:, -1:])], axis=-1)
    np.testing.assert_array_equal(
        np.asarray(networks.apply(params, obs, on)),
        np.asarray(networks.apply(params, with_abs, CFG)),
    )
