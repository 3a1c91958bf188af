"""Evaluation: policy rollouts over a test window, trading metrics, baselines (docs/design.md §8).

A policy is a pure function ``policy(key, obs [F+1]) -> action [] int32``. :func:`rollout` runs it
over one episode window in one ``lax.scan`` (jit-able, vmappable over folds and seeds);
:func:`metrics` turns the record into JSON-safe float64 host numbers. The agent and the baselines
(flat, buy-and-hold, uniform random; all three in one scan) go through the same two.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.agent.transition import observation
from jdqn.config import EnvConfig
from jdqn.evaluation import env
from jdqn.evaluation.stats import per_bar_sharpe

Policy = Callable[[jax.Array, jax.Array], jax.Array]  # (key, obs [F+1]) -> action [] int32


class Rollout(NamedTuple):
    """Per-step record of one episode. Entry i is the action at bar ``start + i``.

    Arrays have the static length ``T - 1`` of the fold; entries at ``i >= end - start - 1``
    (outside the episode window) are zero padding. :func:`trim` drops them.
    """

    positions: jax.Array  # [T-1] float32, position held over the interval start+i -> start+i+1
    pnl_points: jax.Array  # [T-1] float32, gross: position x price change
    cost_points: jax.Array  # [T-1] float32, cost of the trade made at the bar
    net_points: jax.Array  # [T-1] float32, pnl - cost (unscaled)
    actions: jax.Array  # [T-1] int32, index into the position grid


def rollout(policy: Policy, params: env.EnvParams, key: jax.Array) -> Rollout:
    """Run ``policy`` over the episode ``[start, end)`` of ``params``, starting flat."""
    n_scan = params.close.shape[0] - 1  # static; the window's own length may be traced
    _, state0 = env.reset(key, params)

    def body(state: env.EnvState, xs: tuple[jax.Array, jax.Array]):
        index, key_t = xs
        policy_key, step_key = jax.random.split(key_t)
        obs = observation(params.features[state.t], state.position)
        action = jnp.asarray(policy(policy_key, obs), jnp.int32)
        _, state, _, _, info = env.step(step_key, state, action, params)
        # After the window ends the env has auto-reset; keep scanning (static length) but zero it.
        active = index < env.n_steps(params)
        record = Rollout(
            positions=params.positions[action],
            pnl_points=info["pnl_points"],
            cost_points=info["cost_points"],
            net_points=info["pnl_points"] - info["cost_points"],
            actions=action,
        )
        record = jax.tree.map(lambda x: jnp.where(active, x, jnp.zeros_like(x)), record)
        return state, record

    xs = (jnp.arange(n_scan, dtype=jnp.int32), jax.random.split(key, n_scan))
    _, record = jax.lax.scan(body, state0, xs)
    return record


def trim(record: Rollout, params: env.EnvParams) -> Rollout:
    """Host side: drop the zero padding after the episode window; numpy arrays."""
    n = int(env.n_steps(params))
    return Rollout(*(np.asarray(x)[:n] for x in record))  # type: ignore[arg-type]  # numpy fields


def equity_curve(net_points: np.ndarray) -> np.ndarray:
    """Cumulative net PnL after each bar, float64 (points). Starts from 0 before the first bar."""
    return np.cumsum(np.asarray(net_points, np.float64))


# Builders are cached so the same arguments give the same function object, and the jitted rollout
# (policy is a static argument) compiles once per fold shape rather than once per call.


@functools.cache
def _constant_policy(action: int) -> Policy:
    def policy(key: jax.Array, obs: jax.Array) -> jax.Array:
        del key, obs
        return jnp.asarray(action, jnp.int32)

    return policy


def flat_policy(positions: Sequence[float]) -> Policy:
    """Always target position 0 (never trades). Raises if the grid has no flat position."""
    grid = tuple(float(p) for p in positions)
    if 0.0 not in grid:
        raise ValueError(f"flat_policy: position grid {grid} has no 0.0; add 0.0 to env.positions")
    return _constant_policy(grid.index(0.0))


def buy_and_hold_policy(positions: Sequence[float]) -> Policy:
    """Always target the largest long position of the grid (enters once, then holds)."""
    grid = tuple(float(p) for p in positions)
    return _constant_policy(int(np.argmax(grid)))


@functools.cache
def random_policy(n_actions: int) -> Policy:
    """Uniform over the ``n_actions`` grid entries, drawn from the per-step key."""

    def policy(key: jax.Array, obs: jax.Array) -> jax.Array:
        del obs
        return jax.random.randint(key, (), 0, n_actions, dtype=jnp.int32)

    return policy


def greedy_policy(q_fn: Callable[[jax.Array], jax.Array]) -> Policy:
    """argmax_a Q(obs, a) for ``q_fn(obs [F+1]) -> [A]`` (ties: the lowest index)."""

    def policy(key: jax.Array, obs: jax.Array) -> jax.Array:
        del key
        return jnp.argmax(q_fn(obs), axis=-1).astype(jnp.int32)

    return policy


def _closed_trade_pnls(net: np.ndarray, positions: np.ndarray, cost: np.ndarray | None) -> list:
    """Net PnL of each closed round trip (see :func:`metrics` for the definition)."""
    previous = np.concatenate([[0.0], positions[:-1]])
    flips = (previous * positions) < 0
    if cost is None and np.any(flips):
        raise ValueError(
            "metrics: positions flip sign, so the flip's cost must be split between two trades; "
            "pass cost_points (or gross_points)"
        )
    # Only the bars where the held sign changes open or close a trade; a trade's PnL is the
    # running sum of its bars' nets, added in order (np.cumsum does so; np.sum would pair them).
    trade_pnls = []
    changes = np.flatnonzero(np.sign(positions) != np.sign(previous))
    bars = net.tolist()  # Python floats (float64, the same arithmetic), read without numpy calls
    costs = [None] * changes.size if cost is None else cost[changes].tolist()
    olds, news = previous[changes].tolist(), positions[changes].tolist()
    opened: tuple[int, float] | None = None  # (bar, its net with a flip's exit share added)
    for bar, p_old, p_new, bar_cost in zip(changes.tolist(), olds, news, costs, strict=True):
        carry = bars[bar]
        if opened is not None:  # p_new is 0 or of the other sign: the open trade closes here
            # Linear costs: the share of this bar's cost for closing |p_old| contracts.
            exit_cost = -carry if bar_cost is None else bar_cost * abs(p_old) / abs(p_new - p_old)
            start, total = opened
            if bar - start < 64:  # a short trade: a loop is cheaper than numpy's calls
                for value in bars[start + 1 : bar]:
                    total += value
            else:
                total = float(np.cumsum(np.concatenate([[total], net[start + 1 : bar]]))[-1])
            trade_pnls.append(total - exit_cost)
            opened, carry = None, carry + exit_cost
        if p_new != 0.0:
            opened = (bar, carry)
    return trade_pnls


def _ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, with a zero denominator giving 0 (nothing) or None (unbounded)."""
    if denominator > 0:
        return float(numerator / denominator)
    return None if numerator > 0 else 0.0


def metrics(
    net_points: np.ndarray | jax.Array,
    positions: np.ndarray | jax.Array,
    *,
    point_value_usd: float,
    bars_per_year: float,
    gross_points: np.ndarray | jax.Array | None = None,
    cost_points: np.ndarray | jax.Array | None = None,
) -> dict[str, Any]:
    """Trading metrics of one per-bar record, float64 on the host, all values JSON-safe.

    ``net_points[i]``/``positions[i]``: net PnL (points: one contract, no capital) and position
    held over bar interval i, from flat. Ratios are annualised with sqrt(bars_per_year).

    - ``sharpe`` (Sharpe, 1994): mean / sample std (ddof=1); 0 for a zero std or under 2 bars.
    - ``sortino`` (Sortino & van der Meer, 1991): mean / sqrt(mean(min(net, 0)^2)) (target 0,
      over all bars). ``calmar`` (Young, 1991): mean x bars_per_year / max drawdown. Either with
      a zero denominator: None when the numerator is > 0 (unbounded), else 0.
    - ``max_drawdown_points``/``_usd``: largest fall of the cumulative net PnL from a peak, the
      starting 0 counted; >= 0.
    - ``hit_rate``: fraction of closed round trips with net PnL > 0; None when none closed. A round
      trip is a maximal run of bars holding one sign (resizing stays in it), closed at the first
      bar holding 0 or the other sign; its net PnL is that of its bars minus the closing bar's
      cost share |p_old| / |p_new - p_old| (a flip's cost is split between the two trades, so
      flips need ``cost_points`` or ``gross_points``). A trade still open is not counted.
    - ``n_trades``: bars where the position changes; ``turnover``: sum of |position change|, the
      initial entry included; ``exposure``: fraction of bars holding a position.
    - ``gross_pnl_*``/``cost_*``: None unless ``gross_points`` or ``cost_points`` is given.
    """
    net = np.asarray(net_points, np.float64)
    position = np.asarray(positions, np.float64)
    if net.ndim != 1 or net.shape != position.shape:
        raise ValueError(
            f"metrics: need 1-D net and positions of one length; got {net.shape}, {position.shape}"
        )
    gross = None if gross_points is None else np.asarray(gross_points, np.float64)
    cost = None if cost_points is None else np.asarray(cost_points, np.float64)
    if gross is not None and cost is None:
        cost = gross - net
    if cost is not None and gross is None:
        gross = net + cost
    for name, array in (("net_points", net), ("positions", position), ("cost_points", cost)):
        if array is not None and (array.shape != net.shape or not np.all(np.isfinite(array))):
            raise ValueError(f"metrics: {name} must be finite and of shape {net.shape}")

    n_bars = net.size
    mean = float(net.mean()) if n_bars else 0.0
    root_year = math.sqrt(bars_per_year)
    sharpe = per_bar_sharpe(net) * root_year
    downside = float(np.sqrt(np.mean(np.minimum(net, 0.0) ** 2))) if n_bars else 0.0
    sortino = _ratio(mean * root_year, downside)

    equity = np.concatenate([[0.0], equity_curve(net)])
    max_drawdown = float(np.max(np.maximum.accumulate(equity) - equity))
    calmar = _ratio(mean * bars_per_year, max_drawdown)

    previous = np.concatenate([[0.0], position[:-1]])
    trade_pnls = _closed_trade_pnls(net, position, cost)
    hit_rate = float(np.mean(np.array(trade_pnls) > 0)) if trade_pnls else None

    def usd(points: float | None) -> float | None:
        return None if points is None else float(points * point_value_usd)

    gross_total = None if gross is None else float(gross.sum())
    cost_total = None if cost is None else float(cost.sum())
    return {
        "n_bars": int(n_bars),
        "net_pnl_points": float(net.sum()),
        "net_pnl_usd": usd(float(net.sum())),
        "gross_pnl_points": gross_total,
        "gross_pnl_usd": usd(gross_total),
        "cost_points": cost_total,
        "cost_usd": usd(cost_total),
        "sharpe": float(sharpe),
        "sortino": sortino,
        "max_drawdown_points": max_drawdown,
        "max_drawdown_usd": usd(max_drawdown),
        "calmar": calmar,
        "hit_rate": hit_rate,
        "n_round_trips": len(trade_pnls),
        "n_trades": int(np.count_nonzero(position != previous)),
        "turnover": float(np.abs(position - previous).sum()),
        "exposure": float(np.mean(position != 0.0)) if n_bars else 0.0,
    }


def record_metrics(
    record: Rollout, *, point_value_usd: float, bars_per_year: float
) -> dict[str, Any]:
    """:func:`metrics` of a trimmed (numpy) rollout record."""
    return metrics(
        record.net_points,
        record.positions,
        point_value_usd=point_value_usd,
        bars_per_year=bars_per_year,
        gross_points=record.pnl_points,
        cost_points=record.cost_points,
    )


# The baselines' names, in the order of :func:`baseline_rollouts`' leading axis.
BASELINES = ("flat", "buy_and_hold", "random")


def baseline_rollouts(params: env.EnvParams, key: jax.Array, env_cfg: EnvConfig) -> Rollout:
    """The three baselines over one window in one scan: leaves [len(BASELINES), T-1].

    Each lane runs :func:`rollout` with its policy picked by a ``lax.switch`` on the lane index,
    which ``vmap`` turns into a select: every lane sees the same keys, so each record is the one
    its policy gives alone. One loop over the window instead of three matters on a GPU, where a
    sequential scan pays per iteration and hardly per lane.
    """
    positions = env_cfg.positions
    branches = (  # in the order of BASELINES
        flat_policy(positions),
        buy_and_hold_policy(positions),
        random_policy(env_cfg.n_actions),
    )

    def lane(index: jax.Array) -> Rollout:
        def policy(policy_key: jax.Array, obs: jax.Array) -> jax.Array:
            return jax.lax.switch(index, branches, policy_key, obs)

        return rollout(policy, params, key)

    return jax.vmap(lane)(jnp.arange(len(BASELINES)))


def baseline_results(
    records: Rollout, n_steps: int, *, point_value_usd: float, bars_per_year: float
) -> dict[str, dict[str, Any]]:
    """Host side: ``{name: {"metrics": dict, "rollout": Rollout}}`` from
    :func:`baseline_rollouts`' records, each trimmed to the episode's ``n_steps`` actions."""
    host = jax.device_get(records)
    results = {}
    for lane, name in enumerate(BASELINES):
        record = Rollout(*(np.asarray(x)[lane, :n_steps] for x in host))  # type: ignore[arg-type]  # numpy fields
        result = record_metrics(
            record, point_value_usd=point_value_usd, bars_per_year=bars_per_year
        )
        results[name] = {"metrics": result, "rollout": record}
    return results


_baseline_rollouts_jit = jax.jit(baseline_rollouts, static_argnums=2)


def evaluate_baselines(
    params: env.EnvParams, key: jax.Array, env_cfg: EnvConfig, bars_per_year: float
) -> dict[str, dict[str, Any]]:
    """``{name: {"metrics": dict, "rollout": Rollout}}`` for flat, buy_and_hold and random;
    ``key`` seeds the random one, so a fold's baselines are reproducible from the fold's key."""
    return baseline_results(
        _baseline_rollouts_jit(params, key, env_cfg),
        int(env.n_steps(params)),
        point_value_usd=env_cfg.point_value_usd,
        bars_per_year=bars_per_year,
    )
