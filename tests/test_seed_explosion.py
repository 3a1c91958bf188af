"""The seed's explosion, reproduced with a faithful copy of its suspected flaws, and jdqn passing
the same scenario.

The seed blended C51 into an MSE-trained learner at epoch 2 and its Q values ran off to -1e30.
Its suspected flaws, copied here on one state's return distribution (51 logits, the +-10
support, gamma 0.9, returns drawn 3 x wider than the support, alpha 0.2):

- targets outside the support: the textbook floor/ceil projection with the lower atom index
  clipped into the support but the position ``b`` not, so a target beyond an edge gets one weight
  above 1 and one below 0: negative target mass, for which cross-entropy is unbounded below;
- log-probabilities in bfloat16;
- a gradient budget that gives C51 70 % whatever alpha is.

With them, descending the blended loss drives the loss below zero (impossible for a proper
cross-entropy) and the logits off without bound. jdqn's projection clips ``r + gamma z`` onto the
support (mass kept, never negative), computes log-probabilities in float32 and splits the budget
as the loss blends: the same descent stays a proper, bounded cross-entropy.
"""

import jax
import jax.numpy as jnp
import numpy as np
from surgery_forms import budget_clip

from jdqn.agent import losses
from jdqn.agent.surgery import budget_shares
from pallas_kernels import c51_project

N_ATOMS, V_MIN, V_MAX, GAMMA, ALPHA = 51, -10.0, 10.0, 0.9, 0.2
ATOMS = jnp.linspace(V_MIN, V_MAX, N_ATOMS)
DELTA_Z = (V_MAX - V_MIN) / (N_ATOMS - 1)
BUDGET, LEARNING_RATE, STEPS = 1.0, 1.0, 300


def seed_projection(probs, rewards, discount):
    """The seed's projection: the lower atom index clipped into [0, N-2], the position b not."""
    b = (rewards[:, None] + discount * ATOMS[None, :] - V_MIN) / DELTA_Z  # [B, N], unclipped
    low_index = jnp.clip(jnp.floor(b), 0, N_ATOMS - 2)
    up_index = low_index + 1
    rows = jnp.arange(rewards.shape[0])[:, None]
    target = jnp.zeros((rewards.shape[0], N_ATOMS))
    target = target.at[rows, low_index.astype(jnp.int32)].add(probs * (up_index - b))
    return target.at[rows, up_index.astype(jnp.int32)].add(probs * (b - low_index))


def _losses(logits, rewards, seed_flaws):
    """(MSE part, C51 part) of the blended loss on one state's distribution."""
    probs = jax.nn.softmax(logits)
    frozen = jnp.broadcast_to(jax.lax.stop_gradient(probs), (rewards.shape[0], N_ATOMS))
    if seed_flaws:
        target = seed_projection(frozen, rewards, GAMMA)
        log_probs = jax.nn.log_softmax(logits.astype(jnp.bfloat16)).astype(jnp.float32)
    else:
        discounts = jnp.full(rewards.shape, GAMMA, jnp.float32)
        target = c51_project(frozen, rewards, discounts, V_MIN, V_MAX, impl="reference")
        log_probs = jax.nn.log_softmax(logits)
    q = jnp.sum(probs * ATOMS)
    y = jax.lax.stop_gradient(jnp.clip(rewards + GAMMA * q, V_MIN, V_MAX))
    mse = jnp.mean((q - y) ** 2) / (V_MAX - V_MIN) ** 2
    log_probs = jnp.broadcast_to(log_probs, target.shape)
    c51 = jnp.mean(losses.cross_entropy(log_probs, jax.lax.stop_gradient(target)))
    return mse, c51, target


def _descend(seed_flaws: bool):
    """Budgeted gradient descent on (1 - alpha) MSE + alpha C51; the losses and logits seen."""
    rewards = 30.0 * jax.random.normal(jax.random.PRNGKey(0), (64,))
    shares = (0.3, 0.7) if seed_flaws else budget_shares(ALPHA, "alpha", 0.3)

    def step(logits, _):
        g_mse = jax.grad(lambda w: (1 - ALPHA) * _losses(w, rewards, seed_flaws)[0])(logits)
        g_c51 = jax.grad(lambda w: ALPHA * _losses(w, rewards, seed_flaws)[1])(logits)
        g_mse, _ = budget_clip(g_mse, shares[0], BUDGET)
        g_c51, _ = budget_clip(g_c51, shares[1], BUDGET)
        logits = logits - LEARNING_RATE * (g_mse + g_c51)
        _, c51, target = _losses(logits, rewards, seed_flaws)
        return logits, jnp.stack([c51, jnp.max(jnp.abs(logits)), jnp.min(target)])

    _, history = jax.lax.scan(step, jnp.zeros((N_ATOMS,)), None, length=STEPS)
    return np.asarray(history)  # [STEPS, 3]: C51 loss, max |logit|, smallest target mass


def test_the_seeds_flaws_make_the_blended_loss_run_off():
    history = _descend(seed_flaws=True)
    assert history[:, 2].min() < -1.0  # negative target mass from targets beyond the support
    assert history[-1, 0] < 0.0  # a cross-entropy below zero: the loss has no floor
    # The logits grow without bound: still growing over the last hundred steps.
    assert history[-1, 1] > 50.0 and history[-1, 1] > history[-100, 1] + 10.0


def test_jdqn_stays_a_proper_bounded_cross_entropy_on_the_same_scenario():
    history = _descend(seed_flaws=False)
    assert history[:, 2].min() >= 0.0  # the projection never makes negative mass
    assert np.all(history[:, 0] >= 0.0) and np.all(np.isfinite(history))
    assert history[-1, 1] < 50.0  # the logits settle on the clipped returns' distribution
    assert abs(history[-1, 1] - history[-100, 1]) < 5.0
