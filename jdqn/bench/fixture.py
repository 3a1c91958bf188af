"""The step benchmarks' shared fixture: the smoketest learner with a buffer full of random
transitions (:func:`filled_learner`), learner steps inside one ``lax.scan`` and their timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jdqn.agent import Learner, LearnerState, make_learner, pack_metrics
from jdqn.agent.transition import NStepReturn, Transition
from jdqn.config import SMOKETEST, Config

# Synthetic ES features of the smoketest run: 4 returns + 4 range + 1 volume + 6 calendar
# columns (jdqn.data.features); the calendar group (columns 9..14) is the non-causal one.
N_FEATURES = 15
NON_CAUSAL = tuple(range(9, 15))
ALPHA, BETA = 0.2, 0.7  # epoch-2 blend: every component (C51 included) on


def random_transitions(key: jax.Array, n: int, n_features: int, cfg: Config) -> Transition:
    """``n`` plausible transitions: normal features, positions/actions on the grid, rewards
    from price changes with costs (so donors recompute consistent rewards), 2% terminal; at
    ``loss.n_step`` > 1 with n-step returns of 1..n steps."""
    keys = jax.random.split(key, 6)
    positions = jnp.asarray(cfg.env.positions, jnp.float32)
    held = jax.random.randint(keys[0], (n,), 0, len(cfg.env.positions))
    action = jax.random.randint(keys[1], (n,), 0, len(cfg.env.positions)).astype(jnp.int32)
    price_change = 0.25 * jnp.round(4.0 * jax.random.normal(keys[2], (n,)))  # ticks of 0.25
    reward = positions[action] * price_change - cfg.env.cost_points * jnp.abs(
        positions[action] - positions[held]
    )
    done = (jax.random.uniform(keys[5], (n,)) < 0.02).astype(jnp.float32)
    n_step = None
    if cfg.loss.n_step > 1:  # the rows' n-step returns: m steps of rewards like the first one
        n_keys = jax.random.split(keys[5], 3)
        steps = jax.random.randint(n_keys[0], (n,), 1, cfg.loss.n_step + 1).astype(jnp.int32)
        n_step = NStepReturn(
            reward=(cfg.env.reward_scale * reward * steps).astype(jnp.float32),
            next_features=jax.random.normal(n_keys[1], (n, n_features), jnp.float32),
            next_position=positions[jax.random.randint(n_keys[2], (n,), 0, len(cfg.env.positions))],
            done=done,
            steps=steps,
        )
    return Transition(
        features=jax.random.normal(keys[3], (n, n_features), jnp.float32),
        position=positions[held],
        action=action,
        reward=(cfg.env.reward_scale * reward).astype(jnp.float32),
        next_features=jax.random.normal(keys[4], (n, n_features), jnp.float32),
        price_change=price_change.astype(jnp.float32),
        done=done,
        n_step=n_step,
    )


def filled_learner(cfg: Config = SMOKETEST) -> tuple[Learner, LearnerState]:
    """The learner of ``cfg`` and a state whose buffer is full of random transitions."""
    learner = make_learner(cfg, N_FEATURES, NON_CAUSAL)
    return learner, filled_state(learner, jax.random.PRNGKey(0), cfg)


def filled_state(
    learner: Learner, key: jax.Array, cfg: Config, n_features: int = N_FEATURES
) -> LearnerState:
    """A fresh state of ``learner`` whose buffer is full of random transitions (``key``: the
    init's and the transitions')."""
    key, data_key = jax.random.split(key)
    state = learner.init(key)
    capacity = cfg.replay.capacity
    return jax.jit(learner.insert)(state, random_transitions(data_key, capacity, n_features, cfg))


def scan_steps_fn(learner: Learner, n_steps: int, vmapped: bool = False) -> jax.stages.Wrapped:
    """jit(state -> n_steps learner steps in one lax.scan), state donated; metrics kept."""
    return jax.jit(scan_steps(learner, n_steps, vmapped), donate_argnums=0)


def scan_steps(
    learner: Learner, n_steps: int, vmapped: bool = False
) -> Callable[[LearnerState], tuple[LearnerState, Any]]:
    """state -> (state after ``n_steps`` learner steps in one lax.scan, packed metrics [n, M]);
    ``vmapped``: over a leading learner axis, in lock-step."""
    step = jax.vmap(learner.step, in_axes=(0, None, None, None)) if vmapped else learner.step

    def run(state: LearnerState) -> tuple[LearnerState, Any]:
        def body(carry: LearnerState, _: None) -> tuple[LearnerState, Any]:
            # The vmapped learners start together and step in lock-step: their step counter,
            # unbatched, is the learner's clock (as jdqn.agent.train gives it).
            clock = carry.step[0] if vmapped else None
            carry, metrics = step(carry, jnp.float32(ALPHA), jnp.float32(BETA), clock)
            # Metrics packed into one vector per step, as jdqn.agent.train records them.
            return carry, pack_metrics(metrics)

        return jax.lax.scan(body, state, None, length=n_steps)

    return run


def time_repeated(
    fn: Callable[[Any], Any], carry: Any, repeats: int, unpack: bool = True, warmup: int = 0
) -> tuple[dict[str, float], Any]:
    """Compile (first call), ``warmup`` untimed calls, then time ``repeats`` chained calls, each
    blocked on. Seconds: compile, median, min."""
    start = time.perf_counter()
    out = fn(carry)
    jax.block_until_ready(out)
    compile_s = time.perf_counter() - start
    carry = out[0] if unpack else out
    for _ in range(warmup):
        out = fn(carry)
        carry = out[0] if unpack else out
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(carry)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - start)
        carry = out[0] if unpack else out
    return {
        "compile_s": compile_s,
        "median_s": statistics.median(times),
        "min_s": min(times),
    }, carry


def time_scan_steps(
    learner: Learner, state: LearnerState, n_steps: int, repeats: int
) -> dict[str, float]:
    """Learner steps inside one lax.scan: microseconds per step (median and min over repeats)."""
    timing, _ = time_repeated(scan_steps_fn(learner, n_steps), state, repeats)
    return {
        "us_per_step": 1e6 * timing["median_s"] / n_steps,
        "us_per_step_min": 1e6 * timing["min_s"] / n_steps,
        "compile_s": timing["compile_s"],
        "n_steps": n_steps,
        "repeats": repeats,
    }
