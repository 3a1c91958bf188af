"""Action selection (jdqn.agent.acting) against float64 numpy: the heads' mixture mean and
standard deviation, the risk penalty, the no-trade band in cost units, and the known trade costs
of post-trade values (network.post_trade_values) in scores, targets and batches."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.agent import networks
from jdqn.agent.acting import action_scores
from jdqn.config import DEFAULT, apply_overrides

# Positions (-1, 0, 1); a +-10 support of 51 atoms, 0.4 apart, whatever `default`'s support;
# no mirror: the networks here see made-up observations, not the data config's features.
CFG = apply_overrides(
    DEFAULT,
    ["env.reward_scale=2.0", "network.v_min=-10", "network.v_max=10", "network.mirror=false"],
)


def _with(risk: float = 0.0, band: float = 0.0, post_trade: bool = False, doubt: float = 0.0):
    train = dataclasses.replace(
        CFG.train, act_risk=risk, act_band_costs=band, act_disagreement=doubt
    )
    heads = 5 if doubt > 0 else CFG.network.n_heads  # the logits' K (disagreement needs K > 1)
    network = dataclasses.replace(CFG.network, post_trade_values=post_trade, n_heads=heads)
    return dataclasses.replace(CFG, train=train, network=network)


def _costs64(position: np.ndarray) -> np.ndarray:
    """[..., A] each action's trade cost from ``position [...]``, reward units (float64)."""
    moved = np.abs(np.asarray(CFG.env.positions) - np.asarray(position, np.float64)[..., None])
    return CFG.env.cost_points * CFG.env.reward_scale * moved


def _reference(
    logits: np.ndarray,
    position: np.ndarray,
    risk: float,
    band: float,
    post_trade: bool = False,
    doubt: float = 0.0,
) -> np.ndarray:
    """mean - risk x std of the heads' equal-weight mixture - doubt x the heads' spread of each
    action's gain over flat, less each trade's cost when the heads give post-trade values, +
    band round trips on the held action."""
    logits = logits.astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    mixture = probs.mean(axis=-3)  # [B, A, N]
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    mean = (mixture * z).sum(-1)
    std = np.sqrt((mixture * z**2).sum(-1) - mean**2)
    head_means = (probs * z).sum(-1)  # [B, K, A]
    flat = list(CFG.env.positions).index(0.0)
    gains = head_means - head_means[:, :, flat : flat + 1]
    spread = np.sqrt(((gains - gains.mean(axis=1, keepdims=True)) ** 2).mean(axis=1))
    held = np.asarray(CFG.env.positions)[None, :] == position[:, None]
    cost_reward_units = 2 * CFG.env.cost_points * CFG.env.reward_scale  # one round trip
    costs = _costs64(position) if post_trade else 0.0
    return mean - risk * std - doubt * spread - costs + band * cost_reward_units * held


@pytest.mark.parametrize(
    ("risk", "band", "post_trade", "doubt"),
    [(0.0, 0.0, False, 0.0), (0.5, 0.0, False, 0.0), (0.0, 1.5, False, 0.0)]
    + [(1.0, 2.0, False, 0.0), (0.0, 0.0, True, 0.0), (0.5, 1.5, True, 0.0)]
    + [(0.0, 0.0, False, 1.0), (0.25, 1.5, True, 2.0)],
)
def test_scores_match_a_float64_mixture(risk, band, post_trade, doubt):
    rng = np.random.default_rng(3)
    logits = rng.normal(0.0, 2.0, (7, 5, 3, 51)).astype(np.float32)  # [B, K, A, N]
    position = rng.choice([-1.0, 0.0, 1.0], 7).astype(np.float32)
    cfg = _with(risk, band, post_trade, doubt)
    scores = jax.jit(lambda x, p: action_scores(x, p, cfg))(logits, position)
    expected = _reference(logits, position, risk, band, post_trade, doubt)
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


def test_disagreement_sits_out_a_gain_the_heads_dispute_and_takes_one_they_agree_on():
    # Long's gain over flat: +0.8 in every head, or +0.8 on average from heads at +2.4 and
    # -0.8 (atoms 0.4 apart; short is worth an atom less than flat in every head). A doubt of
    # 1 keeps flat only where the heads dispute long's gain.
    def logits(gains):
        short, flat = _two_atoms(-0.4, -0.4, 0.0), _two_atoms(0.0, 0.0, 0.0)
        return np.stack([np.stack([short, flat, _two_atoms(g, g, 0.0)]) for g in gains])[None]

    agreed = jnp.asarray(logits([0.8, 0.8, 0.8, 0.8]), jnp.float32)
    disputed = jnp.asarray(logits([2.4, -0.8, 2.4, -0.8]), jnp.float32)
    flat, cfg = jnp.zeros(1), _with(doubt=1.0)
    assert int(jnp.argmax(action_scores(agreed, flat, cfg)[0])) == 2
    assert int(jnp.argmax(action_scores(disputed, flat, cfg)[0])) == 1
    assert int(jnp.argmax(action_scores(disputed, flat, _with())[0])) == 2  # without: long


def test_disagreement_without_ensemble_heads_is_refused_in_one_line():
    with pytest.raises(ValueError, match="train.act_disagreement: needs ensemble heads"):
        apply_overrides(DEFAULT, ["train.act_disagreement=1"])


@pytest.mark.parametrize("field", ["act_risk", "act_band_costs", "act_disagreement"])
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


def _project64(probs: np.ndarray, reward: np.ndarray, discount: np.ndarray) -> np.ndarray:
    """C51 projection of ``probs [R, N]`` moved to ``reward + discount z`` (Bellemare et al.,
    2017, algorithm 1), a float64 loop over the source atoms."""
    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    out = np.zeros_like(probs)
    for row in range(len(probs)):
        for j in range(len(z)):
            moved = np.clip(reward[row] + discount[row] * z[j], z[0], z[-1])
            place = (moved - z[0]) / (z[1] - z[0])
            low = int(np.floor(place))
            high = min(low + 1, len(z) - 1)
            out[row, low] += probs[row, j] * (1 - (place - low))
            out[row, high] += probs[row, j] * (place - low)
    return out


def test_post_trade_targets_pay_a_stars_trade_from_the_next_position_against_float64():
    """With post-trade values a* at s' maximises the online value less its trade's cost from
    the position held at s', and the target is the target net's distribution at a*, moved by
    the reward less a*'s discounted cost: y and the projection against float64 numpy."""
    from jdqn.agent import losses

    cfg = _with(post_trade=True)
    rng = np.random.default_rng(7)
    online = rng.normal(0.0, 1.0, (9, 2, 3, 51)).astype(np.float32)  # [R, K, A, N]
    target = rng.normal(0.0, 1.0, online.shape).astype(np.float32)
    reward = rng.normal(0.0, 1.0, 9).astype(np.float32)
    discount = np.full(9, 0.85, np.float32)
    next_position = rng.choice([-1.0, 0.0, 1.0], 9).astype(np.float32)
    out = jax.jit(lambda o, t, r, d, p: losses.td_target(o, t, r, d, cfg, next_position=p))(
        online, target, reward, discount, next_position
    )

    z = np.linspace(CFG.network.v_min, CFG.network.v_max, CFG.network.n_atoms)
    costs = _costs64(next_position)[:, None, :]  # [R, 1, A]
    a_star = ((_softmax64(online) * z).sum(-1) - costs).argmax(-1)  # [R, K]
    assert len(np.unique(a_star)) == 3  # the case reaches every action
    probs_star = np.take_along_axis(_softmax64(target), a_star[..., None, None], axis=-2)[..., 0, :]
    moved = reward[:, None] - discount[:, None] * np.take_along_axis(costs[:, 0], a_star, -1)
    y = np.clip(moved + discount[:, None] * (probs_star * z).sum(-1), z[0], z[-1])
    np.testing.assert_allclose(np.asarray(out.y), y, rtol=0, atol=2e-5)
    projected = _project64(probs_star.reshape(18, -1), moved.reshape(-1), np.full(18, 0.85))
    np.testing.assert_allclose(np.asarray(out.projected).reshape(18, -1), projected, atol=2e-6)
    with pytest.raises(ValueError, match="post_trade_values needs next_position"):
        losses.td_target(online, target, reward, discount, cfg)


def _softmax64(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_post_trade_batches_add_back_each_rows_own_trade_cost():
    """The rows a step trains on (sampled and donors) carry the reward before their own trade's
    cost: the same sample with and without post-trade values differs by exactly that cost."""
    from jdqn.agent.batch import sample_batch
    from jdqn.agent.replay import replay_add, replay_init
    from jdqn.agent.transition import example_transition

    rng = np.random.default_rng(2)
    rows, n_features = 32, 4
    stored = example_transition(n_features)._replace(
        features=rng.normal(size=(rows, n_features)).astype(np.float32),
        position=rng.choice([-1.0, 0.0, 1.0], rows).astype(np.float32),
        action=rng.integers(0, 3, rows).astype(np.int32),
        reward=rng.normal(size=rows).astype(np.float32),
        next_features=rng.normal(size=(rows, n_features)).astype(np.float32),
        price_change=rng.normal(size=rows).astype(np.float32),
        done=np.zeros(rows, np.float32),
    )
    replay = replay_add(replay_init(rows, example_transition(n_features)), stored)
    keys = tuple(jax.random.split(jax.random.PRNGKey(0), 3))
    discounts = jnp.asarray([1.0, 0.85])
    sample = jax.jit(sample_batch, static_argnums=(5, 6))
    base = apply_overrides(
        CFG,
        ["train.batch_size=16", "network.bootstrap_prob=1.0", "network.post_trade_values=false"],
    )
    plain, post = (
        sample(replay, keys, jax.random.PRNGKey(1), 0.5, discounts, cfg, 32)
        for cfg in (base, apply_overrides(base, ["network.post_trade_values=true"]))
    )
    taken = np.asarray(CFG.env.positions)[np.asarray(post.transitions.action)]
    own_cost = _costs64(np.asarray(post.transitions.position))
    own_cost = np.take_along_axis(own_cost, np.asarray(post.transitions.action)[:, None], -1)
    assert np.any(taken != np.asarray(post.transitions.position))  # some rows trade
    np.testing.assert_allclose(post.reward - plain.reward, own_cost[:, 0], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(post.next_obs, plain.next_obs)
