"""The rows one learner step trains on: a PER sample and its HER donors (docs/design.md, section
5, steps 1-2), with each row's weight per ensemble head."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jdqn.agent import acting, networks
from jdqn.agent.donors import make_donors
from jdqn.agent.losses import select_action
from jdqn.agent.replay import ReplayState, replay_sample, replay_serials
from jdqn.agent.transition import Transition, observation
from jdqn.config import Config


class Batch(NamedTuple):
    """``B`` sampled transitions, then ``R - B`` donors (R rows).

    The target of a row is ``reward + discount * Q(next_obs)``. At ``loss.n_step`` n > 1 a
    sampled row bootstraps after its ``m <= n`` steps (``Transition.n_step``); donors stay
    one-step, since another action at bar t changes every later position and cost."""

    indices: jax.Array  # [B] int32, the sampled rows' replay slots (donors have none)
    is_weights: jax.Array  # [B] float32, PER importance weights normalised by their max
    transitions: Transition  # leaves [R, ...]: sampled rows, then donors (one-step fields only)
    obs: jax.Array  # [R, F+1] float32, features and the position held before acting
    reward: jax.Array  # [R] float32, sum_{k<m} gamma^k r_(t+k) (m = 1: the one-step reward)
    next_obs: jax.Array  # [R, F+1] float32, features at bar t+m and the position held then
    discount: jax.Array  # [R] float32, gamma^m * (1 - done)
    weights: jax.Array  # [R, K] float32, IS weight (1 for donors) times bootstrap head mask


def sample_batch(
    replay: ReplayState,
    keys: tuple[jax.Array, jax.Array, jax.Array],
    bootstrap_key: jax.Array,
    beta: jax.Array | float,
    discounts: jax.Array,
    cfg: Config,
    n_donors: int,
    hold_penalty: jax.Array | float | None = None,
    cost_scale: jax.Array | float | None = None,
) -> Batch:
    """Sample ``B`` transitions (stratified proportional PER, Schaul et al., ICLR 2016) and add
    ``n_donors`` hindsight donors (another action at the same bar with its recomputed reward;
    Andrychowicz et al., NeurIPS 2017); ``keys`` = (sample, donors, donors' head masks);
    ``discounts [n_step + 1]``: gamma's powers, ``hold_penalty`` and ``cost_scale``: the donors'
    hold charge and the cost multiplier of their rewards and of the trade costs post-trade values
    add back (the learner's ``Hyper``; None: the config's).

    Bootstrap head masks (Osband et al., NeurIPS 2016): one per stored transition for its whole
    life (keyed on its insertion serial, so an overwritten slot gets a fresh draw), fresh for
    donors."""
    sample_key, donor_key, donor_mask_key = keys
    positions = jnp.asarray(cfg.env.positions, jnp.float32)  # [A]
    batch_size, net = cfg.train.batch_size, cfg.network
    with jax.named_scope("per_sample"):
        indices, sampled, is_weights = replay_sample(
            replay, sample_key, batch_size, cfg.replay.alpha, jnp.asarray(beta, jnp.float32)
        )
    # The sampled rows' targets: one-step, or their stored n-step returns.
    if sampled.n_step is None:
        reward = sampled.reward
        next_obs = observation(sampled.next_features, positions[sampled.action])
        discount = discounts[1] * (1.0 - sampled.done)
    else:
        n_step = sampled.n_step
        reward = n_step.reward
        next_obs = observation(n_step.next_features, n_step.next_position)
        discount = discounts[n_step.steps] * (1.0 - n_step.done)
        sampled = sampled._replace(n_step=None)
    rows, row_weights = sampled, is_weights
    if n_donors > 0:
        with jax.named_scope("donors"):
            donors = make_donors(
                donor_key,
                sampled,
                positions,
                cfg.env.cost_points,
                cfg.env.reward_scale,
                cfg.env.hold_penalty if hold_penalty is None else hold_penalty,
                cfg.loss.donor_mode,
                n_donors,
                cfg.env.train_cost_scale if cost_scale is None else cost_scale,
            )
            rows = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), sampled, donors)
            row_weights = jnp.concatenate([is_weights, jnp.ones((n_donors,), jnp.float32)])
            # Donors are one-step: their recomputed reward, the next bar with the donor's
            # position, discount gamma.
            reward = jnp.concatenate([reward, donors.reward])
            next_obs = jnp.concatenate(
                [next_obs, observation(donors.next_features, positions[donors.action])]
            )
            discount = jnp.concatenate([discount, discounts[1] * (1.0 - donors.done)])
    if net.post_trade_values:  # the heads learn the value after the row's own trade
        costs = acting.trade_costs(rows.position, cfg, cost_scale)  # [rows, A]
        reward = reward + select_action(costs, rows.action)
    n_rows = batch_size + n_donors
    if net.n_heads > 1 and net.bootstrap_prob < 1:
        head_masks = jnp.concatenate(
            [
                networks.bootstrap_masks(
                    bootstrap_key, replay_serials(replay, indices), net.n_heads, net.bootstrap_prob
                ),
                networks.bootstrap_masks(
                    donor_mask_key, jnp.arange(n_donors), net.n_heads, net.bootstrap_prob
                ),
            ]
        )
    else:
        head_masks = jnp.ones((n_rows, net.n_heads), jnp.float32)
    return Batch(
        indices=indices,
        is_weights=is_weights,
        transitions=rows,
        obs=observation(rows.features, rows.position),
        reward=reward,
        next_obs=next_obs,
        discount=discount,
        weights=row_weights[:, None] * head_masks,
    )
