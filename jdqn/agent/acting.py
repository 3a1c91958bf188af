"""Action selection from the C51 return distribution: the mean (risk-neutral), the mean minus a
multiple of its standard deviation (risk-averse; Dabney et al., ICML 2018), minus a multiple of
the ensemble heads' disagreement (the doubt the data leave; Osband et al., 2016), and a no-trade
band in cost units that favours the held position."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdqn.agent import networks
from jdqn.config import Config


def action_scores(
    logits: jax.Array,
    position: jax.Array,
    cfg: Config,
    risk: jax.Array | None = None,
    cost_scale: jax.Array | None = None,
) -> jax.Array:
    """What acting takes the argmax of, ``[..., A]``, from the heads' ``logits [..., K, A, N]``
    with ``position [...]`` held: the heads' mean Q, minus ``train.act_risk`` x the standard
    deviation of the heads' mixture (their spread and their disagreement), minus
    ``train.act_disagreement`` x the heads' disagreement on each action's gain over flat
    (:func:`disagreement`), plus ``train.act_band_costs`` round-trip costs in reward units on
    the action that keeps the held position. At 0, 0 and 0 it is the head-mean Q. The double-DQN
    target picks a* at s' by each head's own mean minus act_risk x std
    (``jdqn.agent.losses.td_target``), so the distributions learned are those of the policy that
    acts. ``risk``: the learner's value of act_risk (None: the config's); the std is computed
    only where the config's is above 0 (a program whose learners carry several values is built
    with one of those above 0, and a learner's 0 then gives the mean exactly). ``cost_scale``:
    the learner's ``env.train_cost_scale``, which post-trade values' costs carry (None: the
    config's)."""
    support = networks.atoms(cfg.network)  # [N]
    heads = networks.q_values(logits, support)  # [..., K, A]
    q = jnp.mean(heads, axis=-2)  # [..., A]
    if cfg.train.act_risk > 0:
        mixture = jnp.mean(jax.nn.softmax(logits.astype(jnp.float32), axis=-1), axis=-3)
        q = mean_minus_std(mixture, q, support, cfg.train.act_risk if risk is None else risk)
    if cfg.train.act_disagreement > 0:
        q = q - cfg.train.act_disagreement * disagreement(heads, cfg.env.positions)
    if cfg.network.post_trade_values:
        q = q - trade_costs(position, cfg, cost_scale)
    if cfg.train.act_band_costs > 0:
        # Two sides of the cost per contract: the band is in round trips.
        band = cfg.train.act_band_costs * 2.0 * cfg.env.cost_points * cfg.env.reward_scale
        positions = jnp.asarray(cfg.env.positions, jnp.float32)  # [A]
        q = q + band * (positions == position[..., None].astype(jnp.float32))
    return q


def disagreement(heads: jax.Array, positions: tuple[float, ...]) -> jax.Array:
    """``[..., A]``: the standard deviation over the heads of each action's value gain over the
    flattest position's, from ``heads [..., K, A]`` (each head's mean Q); 0 for that position.
    Costs known in advance (post-trade values) are the same in every head and cancel."""
    flat = min(range(len(positions)), key=lambda a: abs(positions[a]))
    gains = heads - heads[..., flat : flat + 1]
    return jnp.std(gains, axis=-2)


def mean_minus_std(
    probs: jax.Array, mean: jax.Array, support: jax.Array, risk: float | jax.Array
) -> jax.Array:
    """``mean - risk x std`` of distributions ``probs [..., N]`` over ``support [N]`` whose
    means are ``mean [...]`` (Dabney et al., ICML 2018, a risk-averse distortion)."""
    variance = jnp.sum(probs * (support - mean[..., None]) ** 2, axis=-1)  # [...]
    return mean - risk * jnp.sqrt(variance)


def trade_costs(
    position: jax.Array, cfg: Config, cost_scale: jax.Array | float | None = None
) -> jax.Array:
    """``[..., A]`` reward units each action's trade costs from ``position [...]``, as the
    training reward charges them (``cost_scale``: the learner's ``env.train_cost_scale``; None:
    the config's): what ``network.post_trade_values`` adds to the heads' values of the position
    after the trade."""
    positions = jnp.asarray(cfg.env.positions, jnp.float32)  # [A]
    moved = jnp.abs(positions - jnp.asarray(position, jnp.float32)[..., None])  # [..., A]
    scale = cfg.env.train_cost_scale if cost_scale is None else cost_scale
    return cfg.env.cost_points * cfg.env.reward_scale * moved * scale  # exact at a scale of 1
