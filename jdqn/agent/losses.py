"""Loss parts of the learner step, each a small pure function in float32 (docs/design.md,
section 5, steps 4-5 and 9); rank/dtype checks run at trace time and cost nothing.

Adding a loss term: compute it in :func:`loss_parts` under a new name, weighted from the
config; the step pulls every part back on its own, gradient surgery treats the MSE and C51
parts, and every other part joins Adam's sum unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jdqn.accel.pieces import PLAIN, Pieces
from jdqn.agent import acting, networks
from jdqn.config import Config
from pallas_kernels import c51_project


def select_action(values: jax.Array, action: jax.Array, n_trailing: int = 0) -> jax.Array:
    """``values[..., a, *trailing]`` at ``a = action[...]``: the actions axis is the one before
    the last ``n_trailing`` axes, and ``action`` (int) broadcasts against the axes before it.

    A select and a sum, not a gather: its gradient is a select that XLA fuses into neighbouring
    elementwise work, where a gather's is a scatter-add kernel of its own. The other actions'
    values are selected away, never multiplied by zero, so an inf or NaN there cannot leak.
    """
    axis = values.ndim - 1 - n_trailing
    taken = _taken(action, values.shape[axis])
    taken = taken.reshape(taken.shape + (1,) * n_trailing)
    return jnp.sum(jnp.where(taken, values, jnp.zeros((), values.dtype)), axis=axis)


def _taken(action: jax.Array, n_actions: int) -> jax.Array:
    """[..., A] bool, true at each row's ``action``."""
    return jnp.arange(n_actions) == jnp.asarray(action)[..., None]


def double_dqn_target(
    q_online_next: jax.Array, logits_target_next: jax.Array, support: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Online net picks a* at s', target net scores it (van Hasselt et al., AAAI 2016).

    ``q_online_next [..., A]``, ``logits_target_next [..., A, N]`` -> (a* [...] int32,
    target distribution at a* [..., N], target Q at a* [...]). Only a*'s row of the target
    logits goes through the softmax: the other actions' distributions are never used.
    """
    chex.assert_rank(support, 1)
    chex.assert_equal_shape_prefix([q_online_next, logits_target_next], q_online_next.ndim)
    chex.assert_type([q_online_next, logits_target_next], jnp.float32)
    a_star = jnp.argmax(q_online_next, axis=-1).astype(jnp.int32)  # [...]
    probs = jax.nn.softmax(select_action(logits_target_next, a_star, n_trailing=1), axis=-1)
    return a_star, probs, jnp.sum(probs * support, axis=-1)


def scalar_target(
    rewards: jax.Array, discounts: jax.Array, q_next: jax.Array, v_min: float, v_max: float
) -> jax.Array:
    """y = clip(r + gamma (1 - d) Q_target(s', a*), v_min, v_max) (Mnih et al., 2015)."""
    chex.assert_equal_shape([rewards, discounts, q_next])
    return jnp.clip(rewards + discounts * q_next, v_min, v_max)


def smoothing_weights(epsilon: float, n_atoms: int) -> np.ndarray:
    """:func:`label_smooth`'s weights ``(1 - eps, eps / N)``, [2] float32 rounded once from
    float64 (a learner carries them as values, ``jdqn.agent.state.Hyper``)."""
    return np.asarray([1.0 - epsilon, epsilon / n_atoms], np.float32)


def label_smooth(target: jax.Array, weights: jax.Array) -> jax.Array:
    """(1 - eps) m + eps / N (Szegedy et al., CVPR 2016) with ``weights`` =
    :func:`smoothing_weights`; keeps each row's mass."""
    chex.assert_type(target, jnp.float32)
    return weights[0] * target + weights[1]


def q_regression_loss(
    q: jax.Array, y: jax.Array, unit: float, huber_delta: float | None
) -> jax.Array:
    """((Q - y) / unit)^2 per element (Mnih et al., 2015), Huber optional.

    ``unit`` is what the error is measured in (``loss.mse_unit``): the support's width, so that
    one scale serves any ``v`` range, or 1 (reward units). The Huber form is ``e^2`` inside
    ``|e| <= delta`` and ``2 delta |e| - delta^2`` outside (twice the textbook Huber), so it
    equals the squared loss wherever both are quadratic.
    """
    chex.assert_equal_shape([q, y])
    chex.assert_type([q, y], jnp.float32)
    error = (q - y) / unit
    if huber_delta is None:
        return error**2
    abs_error = jnp.abs(error)
    return jnp.where(
        abs_error <= huber_delta, error**2, 2.0 * huber_delta * abs_error - huber_delta**2
    )


def cross_entropy(log_probs: jax.Array, target: jax.Array) -> jax.Array:
    """C51's cross-entropy -sum_i m_i log p_i from log-probabilities (Bellemare et al., 2017),
    float32, [..., N] -> [...]: the learner reuses the log-softmax it already has for Q."""
    chex.assert_equal_shape([log_probs, target])
    chex.assert_type([log_probs, target], jnp.float32)
    return -jnp.sum(target * log_probs, axis=-1)


def c51_head(
    logits: jax.Array,
    support: jax.Array,
    action: jax.Array,
    target: jax.Array,
    pieces: Pieces = PLAIN,
) -> tuple[jax.Array, jax.Array]:
    """Q of every action and the C51 cross-entropy of the taken one, from one log-softmax.

    ``logits [R, K, A, N]``, ``support [N]``, ``action`` (int, broadcasts to [R, K]),
    ``target [R, K, N]`` -> (``q [R, K, A]`` = sum_i p_i z_i, ``ce [R, K]`` = -sum_i m_i
    log p_i at the taken action) (Bellemare et al., 2017). Differentiable in ``logits`` only.

    The gradient is in closed form, dq_a/dl_a = p_a (z - q_a) and, with M = sum_i m_i,
    dce/dl_taken = M p - m: one elementwise expression, where autodiff first reduces the
    cotangent over the atoms (a pass of its own at many vmapped learners). Exact as autodiff's
    up to float32 rounding; ``pieces.vjp="autodiff"`` runs autodiff instead.
    """
    if pieces.vjp == "autodiff":
        return _c51_head_forward(logits, support, action, target)[:2]
    return _c51_head_closed(logits, support, action, target)


@jax.custom_vjp
def _c51_head_closed(
    logits: jax.Array, support: jax.Array, action: jax.Array, target: jax.Array
) -> tuple[jax.Array, jax.Array]:
    q, ce, _ = _c51_head_forward(logits, support, action, target)
    return q, ce


def _c51_head_forward(
    logits: jax.Array, support: jax.Array, action: jax.Array, target: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    chex.assert_type([logits, support, target], jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [R, K, A, N]
    probs = jnp.exp(log_probs)
    q = jnp.sum(probs * support, axis=-1)  # [R, K, A]
    ce = cross_entropy(select_action(log_probs, action, n_trailing=1), target)  # [R, K]
    return q, ce, probs


def _c51_head_fwd(
    logits: jax.Array, support: jax.Array, action: jax.Array, target: jax.Array
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, ...]]:
    q, ce, probs = _c51_head_forward(logits, support, action, target)
    return (q, ce), (probs, q, support, action, target)


def _c51_head_bwd(
    residuals: tuple[jax.Array, ...], cotangents: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, None, None, None]:
    probs, q, support, action, target = residuals
    g_q, g_ce = cotangents  # [R, K, A], [R, K]
    from_q = (g_q[..., None] * probs) * (support - q[..., None])  # [R, K, A, N]
    mass = jnp.sum(target, axis=-1, keepdims=True)  # [R, K, 1], 1 up to rounding
    g_taken = g_ce[..., None, None] * (probs * mass[..., None, :] - target[..., None, :])
    taken = _taken(action, probs.shape[-2])[..., None]  # [R, K, A, 1]
    grad = from_q + jnp.where(taken, g_taken, jnp.zeros((), probs.dtype))
    return grad, None, None, None


_c51_head_closed.defvjp(_c51_head_fwd, _c51_head_bwd)


def ensemble_diversity(q: jax.Array, lambda_div: float) -> jax.Array:
    """lambda * mean_{b, k<l} cos(A_k, A_l), A_k = Q_k - mean_a Q_k (ensemble diversity term).

    ``q [B, K, A]`` with K >= 2 -> [] float32. Minimising it pushes the heads' advantage
    profiles apart (negative correlation learning, Liu & Yao, 1999; as used for bootstrapped
    DQN ensembles). The 1e-12 inside the norm keeps the gradient finite for a flat advantage.
    """
    chex.assert_rank(q, 3)
    chex.assert_type(q, jnp.float32)
    n_heads = q.shape[1]
    if n_heads < 2:
        raise ValueError("ensemble_diversity needs at least 2 heads (network.n_heads)")
    advantage = q - jnp.mean(q, axis=-1, keepdims=True)  # [B, K, A]
    unit = advantage / jnp.sqrt(jnp.sum(advantage**2, axis=-1, keepdims=True) + 1e-12)
    cosine = jnp.einsum("bka,bla->bkl", unit, unit)  # [B, K, K]
    upper_k, upper_l = jnp.triu_indices(n_heads, k=1)
    return lambda_div * jnp.mean(cosine[:, upper_k, upper_l])


def causal_intervention(key: jax.Array, obs: jax.Array, non_causal: tuple[int, ...]) -> jax.Array:
    """do(s): the non-causal columns replaced by those of a random permutation of the batch.

    A policy that ignores spurious features is invariant to this intervention (invariance
    under interventions, Peters et al., JRSS-B 2016). ``obs [B, F+1]`` -> [B, F+1].
    """
    chex.assert_rank(obs, 2)
    columns = jnp.asarray(non_causal, jnp.int32)  # [G]
    permutation = jax.random.permutation(key, obs.shape[0])  # [B]
    return obs.at[:, columns].set(obs[permutation][:, columns])


def causal_kl(log_p: jax.Array, logits_intervened: jax.Array, pieces: Pieces = PLAIN) -> jax.Array:
    """KL(stop_grad(p(s)) || p(do(s))) over the atoms, float32. [..., N] -> [...].

    ``log_p``, the observed pass's log-softmax, is the fixed reference (no gradient); only the
    intervened pass is pulled toward it (docs/design.md, section 5, step 9). The gradient is in
    closed form, M q - p with q = softmax(logits_intervened) and M = sum_i p_i, for the same
    reason and with the same ``pieces.vjp`` switch as :func:`c51_head`'s.
    """
    if pieces.vjp == "autodiff":
        return _causal_kl_fwd(log_p, logits_intervened)[0]
    return _causal_kl_closed(log_p, logits_intervened)


@jax.custom_vjp
def _causal_kl_closed(log_p: jax.Array, logits_intervened: jax.Array) -> jax.Array:
    kl, _ = _causal_kl_fwd(log_p, logits_intervened)
    return kl


def _causal_kl_fwd(
    log_p: jax.Array, logits_intervened: jax.Array
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array]]:
    chex.assert_equal_shape([log_p, logits_intervened])
    chex.assert_type([log_p, logits_intervened], jnp.float32)
    log_p = jax.lax.stop_gradient(log_p)
    log_q = jax.nn.log_softmax(logits_intervened, axis=-1)
    p = jnp.exp(log_p)
    kl = jnp.sum(p * (log_p - log_q), axis=-1)
    mass = jnp.sum(p, axis=-1)
    return kl, (p, log_q, mass)


def _causal_kl_bwd(
    residuals: tuple[jax.Array, jax.Array, jax.Array], g_kl: jax.Array
) -> tuple[jax.Array, jax.Array]:
    p, log_q, mass = residuals
    grad = g_kl[..., None] * (mass[..., None] * jnp.exp(log_q) - p)
    return jnp.zeros_like(p), grad


_causal_kl_closed.defvjp(_causal_kl_fwd, _causal_kl_bwd)


def edge_mass(target: jax.Array) -> jax.Array:
    """Mass on the two edge atoms of a projected target, [..., N] -> [...] (support too narrow?)."""
    return target[..., 0] + target[..., -1]


def support_collapse(
    q: jax.Array, target: jax.Array, v_min: float, v_max: float, n_atoms: int, mass_limit: float
) -> tuple[jax.Array, jax.Array]:
    """What signals a collapsing C51 learner before anything is non-finite: (Q pinned at the
    support's edge, edge mass above ``mass_limit``), two [] bools.

    Q, a convex combination of the atoms, within one atom spacing of an edge means the
    distribution has piled onto that atom (a diverging learner reaches it first); a mean mass
    of the projected ``target [..., N]`` above ``mass_limit`` on the edge atoms means the
    returns do not fit the support."""
    delta_z = (v_max - v_min) / (n_atoms - 1)
    pinned = (jnp.max(q) > v_max - delta_z) | (jnp.min(q) < v_min + delta_z)
    return pinned, jnp.mean(edge_mass(target)) > mass_limit


class TdTarget(NamedTuple):
    """The step's targets for the sampled rows and donors (stop-gradient)."""

    distribution: jax.Array  # [R, K, N] float32, projected and label-smoothed
    projected: jax.Array  # [R, K, N] float32, projected, before smoothing
    y: jax.Array  # [R, K] float32, clip(r + discount Q_target(s', a*), v_min, v_max)
    q_next: jax.Array  # [R, K, A] float32, online Q at s' (picks a*)
    q_star: jax.Array  # [R, K] float32, target Q at (s', a*)


def td_target(
    online_logits_next: jax.Array,
    target_logits_next: jax.Array,
    reward: jax.Array,
    discount: jax.Array,
    cfg: Config,
    pieces: Pieces = PLAIN,
    smoothing: jax.Array | None = None,
    act_risk: jax.Array | None = None,
    next_position: jax.Array | None = None,
    cost_scale: jax.Array | None = None,
) -> TdTarget:
    """Double-DQN target (van Hasselt et al., AAAI 2016) projected onto the support
    (Bellemare et al., 2017) and label-smoothed: ``logits [R, K, A, N]`` of the online and target
    nets at s', ``reward, discount [R]``; ``pieces.projection`` runs the projection. With
    ``train.act_risk`` the online net picks a* as acting does, by mean minus a multiple of the
    standard deviation (``jdqn.agent.acting``). ``smoothing`` (:func:`smoothing_weights`) and
    ``act_risk``: the learner's values (None: the config's). With
    ``network.post_trade_values`` a* also pays its trade from ``next_position [R]`` (the
    position held at s'), and its value at s' is that of the position after the trade, less
    the trade's cost (times ``cost_scale``, the learner's ``env.train_cost_scale``; None: the
    config's); ``reward`` is then the reward before the row's own trade's cost."""
    net = cfg.network
    if smoothing is None:
        smoothing = jnp.asarray(smoothing_weights(cfg.loss.label_smoothing, net.n_atoms))
    support = networks.atoms(net)
    q_next = networks.q_values(online_logits_next, support)  # [R, K, A]
    choice = q_next  # what a* maximises: each head's mean, or mean - act_risk x std
    if cfg.train.act_risk > 0:  # static (acting.action_scores says why)
        probs_next = jax.nn.softmax(online_logits_next.astype(jnp.float32), axis=-1)
        risk = cfg.train.act_risk if act_risk is None else act_risk
        choice = acting.mean_minus_std(probs_next, q_next, support, risk)
    if cfg.network.post_trade_values:
        if next_position is None:
            raise ValueError("td_target: network.post_trade_values needs next_position [R]")
        costs_next = acting.trade_costs(next_position[:, None], cfg, cost_scale)  # [R, 1, A]
        choice = choice - costs_next
    a_star, probs_star, q_star = double_dqn_target(choice, target_logits_next, support)
    rows, heads = q_star.shape
    rewards = jnp.broadcast_to(reward[:, None], (rows, heads))  # [R, K]
    if cfg.network.post_trade_values:  # a*'s cost at s', discounted like its value
        rewards = rewards - discount[:, None] * select_action(costs_next, a_star)
    discounts = jnp.broadcast_to(discount[:, None], (rows, heads))  # [R, K]
    with jax.named_scope("projection"):
        projected = c51_project(
            probs_star.reshape(rows * heads, -1),
            rewards.reshape(-1),
            discounts.reshape(-1),
            net.v_min,
            net.v_max,
            impl=pieces.projection,
        ).reshape(rows, heads, -1)  # [R, K, N]
    return TdTarget(
        distribution=jax.lax.stop_gradient(label_smooth(projected, smoothing)),
        projected=projected,
        y=jax.lax.stop_gradient(scalar_target(rewards, discounts, q_star, net.v_min, net.v_max)),
        q_next=q_next,
        q_star=q_star,
    )


class OnlinePass(NamedTuple):
    """What the online pass over s gives besides the loss parts."""

    log_probs: jax.Array  # [R, K, A, N] float32
    q: jax.Array  # [R, K, A] float32
    q_taken: jax.Array  # [R, K] float32, Q at the taken action


def part_names(cfg: Config) -> tuple[str, ...]:
    """The loss parts :func:`loss_parts` returns, in order: MSE and C51 first (the two that
    gradient surgery treats), then the terms that are on."""
    diversity = cfg.network.n_heads > 1 and cfg.network.lambda_div > 0
    return ("mse", "c51", *(("diversity",) if diversity else ()))


def gradient_rows(cfg: Config) -> int:
    """How many gradient rows the update reads: one per loss part, and one for the causal term
    when on and no third part takes its gradient (jdqn.agent.step adds it to the third)."""
    parts = len(part_names(cfg))
    return max(parts, 3) if cfg.loss.causal_weight > 0 else parts


def loss_parts(
    logits: jax.Array,
    action: jax.Array,
    weights: jax.Array,
    target: TdTarget,
    cfg: Config,
    pieces: Pieces = PLAIN,
) -> tuple[jax.Array, OnlinePass]:
    """The loss parts ``[len(part_names(cfg))]`` of the online logits ``[R, K, A, N]`` at s:
    IS- and bootstrap-``weights [R, K]``-weighted means over (row, head) of the scaled squared
    error to ``y`` (Mnih et al., 2015) and the C51 cross-entropy to the projected target
    (Bellemare et al., 2017), then the diversity term when on. Unblended: the step weights
    the parts' gradients by the C51 blend alpha. ``pieces.vjp``: :func:`c51_head`'s gradient."""
    net = cfg.network
    q, c51 = c51_head(logits, networks.atoms(net), action[:, None], target.distribution, pieces)
    q_taken = select_action(q, action[:, None])  # [R, K]
    unit = net.v_max - net.v_min if cfg.loss.mse_unit == "support" else 1.0
    mse = q_regression_loss(q_taken, target.y, unit, cfg.loss.huber_delta)
    parts = [jnp.mean(weights * mse), jnp.mean(weights * c51)]
    if "diversity" in part_names(cfg):
        parts.append(ensemble_diversity(q, net.lambda_div))
    # The same operation on the same logits as c51_head's own: XLA computes it once.
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.stack(parts), OnlinePass(log_probs, q, q_taken)
