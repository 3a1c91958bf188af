"""Pure-JAX single-contract futures trading environment (docs/design.md §3).

gymnax-style (``gymnax/environments/environment.py``): state in :class:`EnvState`, data and
settings in :class:`EnvParams`, pure ``reset``/``step`` that vmap over slices, folds and seeds.
Actions index a grid of target positions (contracts); acting at bar ``t`` earns, in index points,

    reward_t = reward_scale * (pos_new * (close[t+1] - close[t])
                               - train_cost_scale * cost_points * |pos_new - pos_old|)
               - hold_penalty * |pos_new|

with ``cost_points`` the per-unit, per-side cost of ``EnvConfig.cost_points`` (slippage and
commission in ticks, a dollar commission, a fraction of notional at ``cost_reference_price``:
:func:`resolve_costs`), constant over a run, so the learner's donors price every action alike,
and ``hold_penalty`` (``EnvConfig.hold_penalty``, reward units per bar and unit held) a risk
charge in the training reward only: a mean-variance utility's variance term (Moody & Saffell,
2001; Zhang, Zohren & Roberts, 2020), so that holding on a martingale loses in expectation
instead of breaking even; ``train_cost_scale`` (``EnvConfig.train_cost_scale``, 1 by default)
scales the cost the training reward charges. ``info``'s ``pnl_points`` and ``cost_points``, which
the judged PnL reads, never include the charge or the scale.

The observation at bar ``t`` is ``features[t]`` with the held position appended. Without
market impact the environment is deterministic; ``key`` only keeps the gymnax signature.
Training steps one fold as ``n_slices`` contiguous slices in lock-step (:func:`slice_params`,
:func:`step_slices`), the price and feature arrays shared across slices.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, cast

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jdqn.agent.transition import Transition, observation
from jdqn.config import EnvConfig


@flax.struct.dataclass
class EnvParams:
    """Data and settings of one episode window (or of S slices: start/end gain a leading axis)."""

    features: jax.Array  # [T, F] float32, normalised, computed from bars <= t
    close: jax.Array  # [T] float32, index points on the tick grid
    positions: jax.Array  # [A] float32, action index -> target position (contracts)
    cost_points: jax.Array  # [] float32, cost per contract traded, index points
    reward_scale: jax.Array  # [] float32, reward = scale x net points - hold charge
    hold_penalty: jax.Array  # [] float32, reward units per bar and unit of |position| held
    train_cost_scale: jax.Array  # [] float32, the training reward's cost multiplier
    start: jax.Array  # [] int32, first bar of the episode (numpy from make_params/slice_params)
    end: jax.Array  # [] int32, one past the last bar (last action at end-2 needs close[end-1])


@flax.struct.dataclass
class EnvState:
    """Where one episode (slice) stands."""

    t: jax.Array  # [] int32, current bar
    position: jax.Array  # [] float32, contracts held (before acting at bar t)


# vmap axes of sliced params: only the window bounds differ, the data are shared (not copied).
# The fields hold vmap axes, not arrays, hence the cast.
SLICE_AXES: EnvParams = cast(Any, EnvParams)(
    **{f.name: None for f in dataclasses.fields(EnvParams)} | {"start": 0, "end": 0}
)


def make_params(
    features: np.ndarray | jax.Array,
    close: np.ndarray | jax.Array,
    env_cfg: EnvConfig,
    start: int = 0,
    end: int | None = None,
) -> EnvParams:
    """Episode params over bars ``[start, end)`` of one fold's arrays (host side, validated)."""
    features = jnp.asarray(features, jnp.float32)
    close = jnp.asarray(close, jnp.float32)
    if features.ndim != 2 or close.ndim != 1 or features.shape[0] != close.shape[0]:
        raise ValueError(
            f"make_params: need features [T, F] and close [T]; got {features.shape}, {close.shape}"
        )
    n_bars = close.shape[0]
    end = n_bars if end is None else int(end)
    start = int(start)
    if not (start >= 0 and start + 2 <= end <= n_bars):
        raise ValueError(
            f"make_params: need 0 <= start, start + 2 <= end <= T={n_bars} (an episode needs two "
            f"bars for one reward); got start={start}, end={end}"
        )
    return EnvParams(
        features=features,
        close=close,
        positions=jnp.asarray(env_cfg.positions, jnp.float32),
        cost_points=jnp.asarray(env_cfg.cost_points, jnp.float32),
        reward_scale=jnp.asarray(env_cfg.reward_scale, jnp.float32),
        hold_penalty=jnp.asarray(env_cfg.hold_penalty, jnp.float32),
        train_cost_scale=jnp.asarray(env_cfg.train_cost_scale, jnp.float32),
        # numpy, not jnp: built inside a trace they stay concrete, so slice_params still works
        start=cast(jax.Array, np.asarray(start, np.int32)),
        end=cast(jax.Array, np.asarray(end, np.int32)),
    )


def n_steps(params: EnvParams) -> jax.Array:
    """Actions in one episode: one per bar in ``[start, end-1)``. [] or [S] int32."""
    return params.end - params.start - 1


def _initial_state(params: EnvParams) -> EnvState:
    return EnvState(t=params.start, position=jnp.zeros_like(params.positions[0]))


def _observe(state: EnvState, params: EnvParams) -> jax.Array:
    # features[t] only: the observation never reads bar t+1 or later.
    return observation(params.features[state.t], state.position)


def reset(key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
    """Start an episode flat at bar ``start``. Returns (obs [F+1] float32, state)."""
    del key  # deterministic
    state = _initial_state(params)
    return _observe(state, params), state


def training_reward(
    pnl_points: jax.Array,
    cost_points: jax.Array,
    position_new: jax.Array,
    reward_scale: Any,
    hold_penalty: Any,
    cost_scale: Any,
) -> jax.Array:
    """The reward the learner trains on (module docstring): points net of ``cost_scale`` x the
    cost, scaled, less the hold charge; the judged PnL includes neither the scale nor the charge.
    The environment's step and the HER donors' recomputed rewards (``jdqn.agent.donors``) both
    use it, so the two cannot drift apart."""
    net_points = pnl_points - cost_scale * cost_points  # exactly pnl - cost at a scale of 1
    return reward_scale * net_points - hold_penalty * jnp.abs(position_new)


def step(
    key: jax.Array, state: EnvState, action: jax.Array, params: EnvParams
) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, Any]]:
    """Act at bar ``t``: move to ``positions[action]``, earn over bar t -> t+1.

    Returns ``(obs, state, reward, done, info)`` (gymnax convention). ``done`` when ``t+1 ==
    end-1``; ``obs``/``state`` are then already reset, while ``info`` (``"transition"``,
    unscaled ``"pnl_points"`` and ``"cost_points"``) describes the real step.
    """
    del key  # no market impact, no randomness
    action = jnp.asarray(action, jnp.int32)
    t_next = state.t + 1
    position_new = params.positions[action]
    price_change = params.close[t_next] - params.close[state.t]  # [] float32
    pnl_points = position_new * price_change
    cost_points = params.cost_points * jnp.abs(position_new - state.position)
    charges = (params.reward_scale, params.hold_penalty, params.train_cost_scale)
    reward = training_reward(pnl_points, cost_points, position_new, *charges)
    done = t_next >= params.end - 1

    transition = Transition(
        features=params.features[state.t],
        position=state.position,
        action=action,
        reward=reward,
        next_features=params.features[t_next],
        price_change=price_change,
        done=done.astype(jnp.float32),
    )
    stepped = EnvState(t=t_next, position=position_new)
    # Auto-reset by select (not cond): both branches are cheap and this stays vmap-friendly.
    state_out = jax.tree.map(functools.partial(jnp.where, done), _initial_state(params), stepped)
    info = {"transition": transition, "pnl_points": pnl_points, "cost_points": cost_points}
    return _observe(state_out, params), state_out, reward, done, info


def volatility_reward_scale(env_cfg: EnvConfig, train_close: np.ndarray) -> EnvConfig:
    """``env_cfg`` with rewards in units of ``train_close``'s per-bar price-change RMS when
    ``reward_unit`` is "train_volatility" (then "points" with ``reward_scale / RMS``: idempotent).
    Bellemare et al. (2017) fit their support to rewards clipped to +-1; this matches that scale."""
    if env_cfg.reward_unit != "train_volatility":
        return env_cfg
    change = np.diff(np.asarray(train_close, np.float64))
    rms = float(np.sqrt(np.mean(change**2))) if change.size else 0.0
    if not np.isfinite(rms) or rms <= 0:
        raise ValueError(
            "env.reward_unit: the train window's close never changes, so it has no volatility "
            "unit; fix: use env.reward_unit=points"
        )
    return dataclasses.replace(
        env_cfg, reward_unit="points", reward_scale=env_cfg.reward_scale / rms
    )


def resolve_costs(env_cfg: EnvConfig, train_close: np.ndarray) -> EnvConfig:
    """``env_cfg`` with ``cost_reference_price`` set to ``train_close``'s last close where a
    notional commission needs a price and none is given (idempotent). The first fold's train
    window ends before every test window, so no later price sets a cost."""
    if env_cfg.commission_fraction == 0 or env_cfg.cost_reference_price > 0:
        return env_cfg
    price = float(np.asarray(train_close, np.float64)[-1])
    if not np.isfinite(price) or price <= 0:
        raise ValueError(
            f"env.commission_fraction: the train window's last close ({price:g}) gives no "
            "notional to charge it on; fix: set env.cost_reference_price or a commission in ticks"
        )
    return dataclasses.replace(env_cfg, cost_reference_price=price)


def cost_notices(
    env_cfg: EnvConfig, train_close: np.ndarray, test_closes: list[np.ndarray]
) -> list[str]:
    """Warnings for costs that swamp the moves: a round trip (2 x ``cost_points``) above the
    train window's median |1-bar close change|, and a notional commission charged at a price
    the test windows move more than 2x away from."""
    notices = []
    move = float(np.median(np.abs(np.diff(np.asarray(train_close, np.float64)))))
    round_trip = 2 * env_cfg.cost_points
    if round_trip > move:
        usd = round_trip * env_cfg.point_value_usd
        ratio = f"{round_trip / move:,.3g}x" if move > 0 else "more than"
        notices.append(
            f"jdqn: notice: a round trip costs {round_trip:.6g} points (${usd:,.2f} per unit), "
            f"{ratio} the median |1-bar close change| of the first train window ({move:.6g}): "
            "only moves that last many bars can pay for a trade; check the env.* costs "
            "(jdqn config keys --instrument NAME gives their units)"
        )
    reference = env_cfg.cost_reference_price
    if env_cfg.commission_fraction > 0 and reference > 0 and test_closes:
        low = min(float(np.min(c)) for c in test_closes)
        high = max(float(np.max(c)) for c in test_closes)
        factor = max(high / reference, reference / low)
        if factor > 2:
            notices.append(
                f"jdqn: notice: env.commission_fraction is charged at {reference:,.6g} (the first "
                f"train window's last close) but the test windows trade between {low:,.6g} and "
                f"{high:,.6g}: fees there are off by up to {factor:.3g}x; fix: fewer or shorter "
                "folds, or env.cost_reference_price"
            )
    return notices


def slice_params(params: EnvParams, n_slices: int) -> EnvParams:
    """Split ``[start, end)`` into ``n_slices`` contiguous, disjoint slices of equal length.

    Leftover bars are dropped at the *oldest* end, so the newest bars (next to the test window)
    are always trained on. Start/end gain a leading ``[S]`` axis (vmap with :data:`SLICE_AXES`).
    The price change across each inner boundary is never traded, which keeps slices independent.
    Start/end must be concrete (:func:`make_params` keeps them as numpy, also inside a trace).
    """
    start, end = int(params.start), int(params.end)
    if n_slices < 1:
        raise ValueError(f"slice_params: n_slices must be >= 1; got {n_slices}")
    length = (end - start) // n_slices
    if length < 2:
        raise ValueError(
            f"slice_params: window [{start}, {end}) has {end - start} bars, fewer than 2 per slice "
            f"for {n_slices} slices; use at most {(end - start) // 2} slices or a longer window"
        )
    starts = (end - length * n_slices + length * np.arange(n_slices)).astype(np.int32)
    ends = cast(jax.Array, starts + length)
    return dataclasses.replace(params, start=cast(jax.Array, starts), end=ends)


def reset_slices(key: jax.Array, params: EnvParams, n_slices: int) -> tuple[jax.Array, EnvState]:
    """Reset S slices of sliced ``params`` (from :func:`slice_params`). obs [S, F+1]."""
    if params.start.shape != (n_slices,):
        raise ValueError(
            f"reset_slices: params.start has shape {params.start.shape}, expected ({n_slices},); "
            "pass the output of slice_params(params, n_slices)"
        )
    keys = jax.random.split(key, n_slices)
    return jax.vmap(reset, in_axes=(0, SLICE_AXES))(keys, params)


def step_slices(
    key: jax.Array, states: EnvState, actions: jax.Array, params: EnvParams
) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict[str, Any]]:
    """Step all S slices in lock-step; every output gains a leading ``[S]`` axis."""
    keys = jax.random.split(key, params.start.shape[0])
    return jax.vmap(step, in_axes=(0, 0, 0, SLICE_AXES))(keys, states, actions, params)
