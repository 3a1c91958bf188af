"""The seed's explosion traced to one of its flaws: targets projected beyond the support.

The seed blended C51 into an MSE-trained learner at epoch 2 and its Q values ran off to -1e30.
Its three suspected flaws are copied here, each on its own switch, on one state's return
distribution (51 logits, the +-10 support, gamma 0.9, returns drawn 3 x wider than the support,
alpha 0.2), descended with budgeted gradient steps:

- ``projection``: the textbook floor/ceil projection with the lower atom index clipped into the
  support but the position ``b`` not, so a target beyond an edge gets one weight above 1 and one
  below 0: negative target mass, for which cross-entropy is unbounded below;
- ``bf16``: log-probabilities in bfloat16;
- ``budget``: a gradient budget that gives C51 70 % whatever alpha is.

The projection flaw alone drives the loss below zero (impossible for a proper cross-entropy) and
the logits off without bound; the budget flaw only speeds that up (C51 gets 70 % of the budget,
not 20 %), and neither it nor bfloat16 does anything of the kind with jdqn's projection, which
clips ``r + gamma z`` onto the support (mass kept, never negative). What runs off is the logits
and the loss: Q = sum_i p_i z_i stays inside the support by construction, so this scenario does
not reproduce the seed's -1e30 Q values; it shows the flaw that makes the loss unbounded.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def _losses(logits, rewards, flaws):
    """(MSE part, C51 part, target) of the blended loss on one state's distribution."""
    probs = jax.nn.softmax(logits)
    frozen = jnp.broadcast_to(jax.lax.stop_gradient(probs), (rewards.shape[0], N_ATOMS))
    if "projection" in flaws:
        target = seed_projection(frozen, rewards, GAMMA)
    else:
        discounts = jnp.full(rewards.shape, GAMMA, jnp.float32)
        target = c51_project(frozen, rewards, discounts, V_MIN, V_MAX, impl="reference")
    if "bf16" in flaws:
        log_probs = jax.nn.log_softmax(logits.astype(jnp.bfloat16)).astype(jnp.float32)
    else:
        log_probs = jax.nn.log_softmax(logits)
    q = jnp.sum(probs * ATOMS)
    y = jax.lax.stop_gradient(jnp.clip(rewards + GAMMA * q, V_MIN, V_MAX))
    mse = jnp.mean((q - y) ** 2) / (V_MAX - V_MIN) ** 2
    log_probs = jnp.broadcast_to(log_probs, target.shape)
    c51 = jnp.mean(losses.cross_entropy(log_probs, jax.lax.stop_gradient(target)))
    return mse, c51, target


@functools.cache
def _descend(flaws: frozenset[str]):
    """Budgeted gradient descent on (1 - alpha) MSE + alpha C51 with the seed's ``flaws``; the
    losses, logits and target mass seen."""
    rewards = 30.0 * jax.random.normal(jax.random.PRNGKey(0), (64,))
    shares = (0.3, 0.7) if "budget" in flaws else budget_shares(ALPHA, "alpha", 0.3)

    def step(logits, _):
        g_mse = jax.grad(lambda w: (1 - ALPHA) * _losses(w, rewards, flaws)[0])(logits)
        g_c51 = jax.grad(lambda w: ALPHA * _losses(w, rewards, flaws)[1])(logits)
        g_mse, _ = budget_clip(g_mse, shares[0], BUDGET)
        g_c51, _ = budget_clip(g_c51, shares[1], BUDGET)
        logits = logits - LEARNING_RATE * (g_mse + g_c51)
        _, c51, target = _losses(logits, rewards, flaws)
        return logits, jnp.stack([c51, jnp.max(jnp.abs(logits)), jnp.min(target)])

    _, history = jax.lax.scan(step, jnp.zeros((N_ATOMS,)), None, length=STEPS)
    return np.asarray(history)  # [STEPS, 3]: C51 loss, max |logit|, smallest target mass


ALL_FLAWS = frozenset({"projection", "bf16", "budget"})


def _runs_off(history) -> bool:
    """Negative target mass, a cross-entropy below zero, logits still growing at the end."""
    grows = history[-1, 1] > history[-100, 1] + 10.0
    return bool(history[:, 2].min() < -1.0 and history[-1, 0] < 0.0 and grows)


def _stays_proper(history) -> bool:
    """No negative mass, a cross-entropy >= 0 throughout, logits settled below 50."""
    settled = history[-1, 1] < 50.0 and abs(history[-1, 1] - history[-100, 1]) < 5.0
    proper = history[:, 2].min() >= 0.0 and np.all(history[:, 0] >= 0.0)
    return bool(proper and np.all(np.isfinite(history)) and settled)


@pytest.mark.slow
@pytest.mark.parametrize("flaws", [ALL_FLAWS, frozenset({"projection"})], ids=["all", "alone"])
def test_the_unclipped_projection_makes_the_blended_loss_run_off(flaws):
    assert _runs_off(_descend(flaws))


@pytest.mark.slow
def test_the_budget_flaw_only_speeds_the_run_off():
    alone, with_budget = _descend(frozenset({"projection"})), _descend(ALL_FLAWS - {"bf16"})
    assert with_budget[-1, 1] > 3.0 * alone[-1, 1]  # |logit| 137 against 33 after 300 steps


@pytest.mark.slow
@pytest.mark.parametrize(
    "flaws",
    [frozenset(), frozenset({"bf16"}), frozenset({"budget"}), ALL_FLAWS - {"projection"}],
    ids=["none", "bf16", "budget", "bf16+budget"],
)
def test_without_the_projection_flaw_the_loss_stays_a_proper_cross_entropy(flaws):
    assert _stays_proper(_descend(flaws))
