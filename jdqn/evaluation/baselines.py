"""The quant baselines: rules and a forecaster tuned on the train window only, and the informed
rule (docs/design.md §8). Each is a position path over the test window, computed on the host in
float64 from bars ``<= t``, with the environment's convention (``jdqn.evaluation.env``):
``positions[i]`` is chosen at bar ``i`` and held over ``i -> i+1``, trading costs
``cost_points`` per contract, from flat.

- ``momentum``: time-series momentum (Moskowitz, Ooi & Pedersen, 2012), with a no-trade band.
- ``macd``: the volatility-normalised MACD signal of Baz, Granger, Harvey, Le Roux & Rattray
  (2015), with a no-trade band.
- ``ridge``: a ridge forecast of the next ``h``-bar price change from the agent's own features.
- ``informed`` (synthetic data only): a trader who knows the planted drift (``jdqn.data.synth``)
  and trades it with a no-trade band tuned on the train window; its metrics carry
  ``causal_bound_usd``, an upper bound on the expected net of any causal policy on the window
  (:func:`causal_bound_points`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from jdqn.config import Config
from jdqn.config.sections import DataConfig
from jdqn.evaluation.rollouts import Rollout, record_metrics

MOMENTUM_LOOKBACKS = (5, 15, 30, 60, 120)  # bars
BANDS = (0.0, 0.5, 1.0, 1.5, 2.0)  # signal units (standard deviations)
MACD_PAIRS = ((8, 24), (16, 48), (32, 96))  # Baz et al. (2015), in bars x the scale below
MACD_SCALES = (1, 4)
MACD_PRICE_WINDOW, MACD_SIGNAL_WINDOW = 63, 252
RIDGE_HORIZONS = (1, 5, 15, 30)  # bars
RIDGE_PENALTIES = (1.0, 1e3)  # x the number of rows
RIDGE_THRESHOLDS = (0.0, 1.0, 2.0)  # x cost_points
RIDGE_FIT_SHARE = 0.7


def band_positions(signal: np.ndarray, band: float) -> np.ndarray:
    """+1 where ``signal > band``, -1 where ``signal < -band``, else the previous position (0 at
    first). [T] float64 -> [T] float64."""
    signal = np.asarray(signal, np.float64)
    target = np.where(signal > band, 1.0, np.where(signal < -band, -1.0, np.nan))
    filled = pd.Series(target).ffill().fillna(0.0)
    return filled.to_numpy(np.float64)


def position_record(close: np.ndarray, positions: np.ndarray, cost_points: float) -> Rollout:
    """Per-bar record of holding ``positions[i]`` over bar ``i -> i+1`` (``len(close) - 1`` bars),
    from flat, with ``cost_points`` per contract traded. numpy float64 fields."""
    close = np.asarray(close, np.float64)
    held = np.asarray(positions, np.float64)[: close.size - 1]
    previous = np.concatenate([[0.0], held[:-1]])
    pnl = held * np.diff(close)
    cost = cost_points * np.abs(held - previous)
    actions = np.sign(held).astype(np.int32) + 1
    return Rollout(held, pnl, cost, pnl - cost, actions)  # type: ignore[arg-type]  # numpy fields


def net_points(close: np.ndarray, positions: np.ndarray, cost_points: float) -> float:
    """Total net PnL (points) of :func:`position_record`."""
    return float(position_record(close, positions, cost_points).net_points.sum())


def momentum_signal(close: np.ndarray, lookback: int, scale: float) -> np.ndarray:
    """``(close_t - close_{t-k}) / scale``; 0 for the first ``k`` bars (no full lookback)."""
    close = np.asarray(close, np.float64)
    change = np.zeros_like(close)
    change[lookback:] = close[lookback:] - close[:-lookback]
    return change / scale


def momentum_scale(close: np.ndarray, lookback: int) -> float:
    """Standard deviation of the ``k``-bar price change over a (train) window; 1 if degenerate."""
    close = np.asarray(close, np.float64)
    changes = close[lookback:] - close[:-lookback]
    scale = float(np.std(changes)) if changes.size > 1 else 0.0
    return scale if scale > 0 else 1.0


def macd_signal(close: np.ndarray, scale: int) -> np.ndarray:
    """Mean over :data:`MACD_PAIRS` (time scales x ``scale``) of Baz et al.'s normalised MACD
    ``y = q / std(q, 252)``, ``q = (EWMA_short - EWMA_long) / std(price, 63)``; past-only (EWMAs
    and trailing windows); 0 while a window is still filling."""
    price = pd.Series(np.asarray(close, np.float64))
    price_std = price.rolling(MACD_PRICE_WINDOW * scale).std()
    ys = []
    for short, long in MACD_PAIRS:
        fast = price.ewm(alpha=1.0 / (short * scale), adjust=False).mean()
        slow = price.ewm(alpha=1.0 / (long * scale), adjust=False).mean()
        q = (fast - slow) / price_std
        ys.append(q / q.rolling(MACD_SIGNAL_WINDOW * scale).std())
    signal = pd.concat(ys, axis=1).mean(axis=1, skipna=False)
    return signal.replace([np.inf, -np.inf], np.nan).fillna(0.0).to_numpy(np.float64)


def ridge_fit(features: np.ndarray, target: np.ndarray, penalty: float) -> np.ndarray:
    """Ridge weights [F+1] (last: intercept, not penalised) of ``target ~ features``; float64."""
    x = np.asarray(features, np.float64)
    design = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
    regulariser = penalty * x.shape[0] * np.eye(design.shape[1])
    regulariser[-1, -1] = 0.0
    return np.linalg.solve(design.T @ design + regulariser, design.T @ np.asarray(target))


def ridge_forecast(features: np.ndarray, weights: np.ndarray) -> np.ndarray:
    x = np.asarray(features, np.float64)
    return x @ weights[:-1] + weights[-1]


def forward_change(close: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, close[t+h] - close[t]) for the rows t that have ``h`` bars ahead in the window."""
    close = np.asarray(close, np.float64)
    rows = np.arange(close.size - horizon)
    return rows, close[rows + horizon] - close[rows]


def _best(grid: Sequence[tuple[Any, ...]], score: Callable[..., float]) -> tuple[Any, ...]:
    """The grid point with the highest score (the first one on ties)."""
    scores = [score(*point) for point in grid]
    return grid[int(np.argmax(scores))]


def _tune_band(
    close: np.ndarray, cost_points: float, settings: Sequence[Any], signal: Callable[[Any], Any]
) -> tuple[Any, float]:
    """The (setting, band) whose band-traded ``signal(setting)`` earns the most over ``close``."""
    signals = {setting: signal(setting) for setting in settings}

    def score(setting: Any, band: float) -> float:
        return net_points(close, band_positions(signals[setting], band), cost_points)

    return _best(list(itertools.product(settings, BANDS)), score)


def tune_momentum(train_close: np.ndarray, cost_points: float) -> dict[str, float]:
    """(lookback, band) with the best net PnL on the train window."""

    def signal(lookback: int) -> np.ndarray:
        return momentum_signal(train_close, lookback, momentum_scale(train_close, lookback))

    lookback, band = _tune_band(train_close, cost_points, MOMENTUM_LOOKBACKS, signal)
    return {"lookback": lookback, "band": band, "scale": momentum_scale(train_close, lookback)}


def tune_macd(train_close: np.ndarray, cost_points: float) -> dict[str, float]:
    """(time-scale multiplier, band) with the best net PnL on the train window."""
    signal = functools.partial(macd_signal, train_close)
    scale, band = _tune_band(train_close, cost_points, MACD_SCALES, signal)
    return {"scale": scale, "band": band}


def tune_ridge(
    train_features: np.ndarray, train_close: np.ndarray, cost_points: float
) -> dict[str, Any]:
    """Fit on the first 70 % of the train window, pick (h, penalty, threshold) on the rest by
    net PnL, refit with those on the whole train window."""
    n_fit = int(RIDGE_FIT_SHARE * train_close.size)
    fit_x, val_x = train_features[:n_fit], train_features[n_fit:]
    fit_close, val_close = train_close[:n_fit], train_close[n_fit:]

    def score(horizon: int, penalty: float, threshold: float) -> float:
        rows, target = forward_change(fit_close, horizon)
        weights = ridge_fit(fit_x[rows], target, penalty)
        forecast = ridge_forecast(val_x, weights)
        return net_points(val_close, band_positions(forecast, threshold * cost_points), cost_points)

    grid = list(itertools.product(RIDGE_HORIZONS, RIDGE_PENALTIES, RIDGE_THRESHOLDS))
    horizon, penalty, threshold = _best(grid, score)
    rows, target = forward_change(train_close, horizon)
    weights = ridge_fit(train_features[rows], target, penalty)
    return {
        "horizon": horizon,
        "penalty": penalty,
        "threshold": threshold,
        "weights": [float(w) for w in weights],
    }


def causal_bound_points(drift_points: np.ndarray, cost_points: float) -> float:
    """The most any position path in {-1, 0, 1} (from flat) earns in expectation when it sees the
    whole drift path ``d`` in advance: max over paths of sum_t p_t d_t - cost |p_t - p_{t-1}|,
    by dynamic programming over the position. A causal policy's expected net is
    E[sum_t p_t d_t - costs] (p_t known at t, E[close_{t+1} - close_t | bars <= t] = d_t), at
    most this maximum's expectation; one path's value estimates that bound."""
    short, flat, long = -math.inf, 0.0, -math.inf  # best net so far ending in each position
    one, two = cost_points, 2.0 * cost_points  # the cost of moving one or two units
    for d in np.asarray(drift_points, np.float64).tolist():
        short, flat, long = (
            max(short, flat - one, long - two) - d,
            max(short - one, flat, long - one),
            max(short - two, flat - one, long) + d,
        )
    return max(short, flat, long)


@functools.lru_cache(maxsize=4)
def _synthetic_drift(data: DataConfig) -> np.ndarray:
    from jdqn.data.synth import synthetic_path

    path = synthetic_path(
        data.synthetic_bars,
        data.synthetic_seed,
        data.signal_strength,
        data.signal_kind,
        data.signal_lookback,
    )
    return path.drift_points


def planted_drift(cfg: Config, start: int, end: int) -> np.ndarray | None:
    """The planted drift in points (expected next close change) over bars ``[start, end)`` of the
    synthetic series, or None for a bar file (no known drift)."""
    if cfg.data.path is not None:
        return None
    return _synthetic_drift(cfg.data)[start:end]


def tune_informed(train_close: np.ndarray, train_drift: np.ndarray, cost: float) -> dict[str, Any]:
    """The band on the drift (in units of its train standard deviation) with the best net PnL
    on the train window."""
    scale = float(np.std(train_drift)) or 1.0
    _, band = _tune_band(train_close, cost, [scale], lambda s: np.asarray(train_drift) / s)
    return {"scale": scale, "band": band}


def fold_baselines(cfg: Config, data: Any, fold: int) -> dict[str, dict[str, Any]]:
    """``{name: {"metrics": dict (with the picked "params"), "rollout": Rollout}}`` for momentum,
    MACD, ridge and, on synthetic data (its planted drift known), the informed rule with the
    causal bound: tuned on the train window of ``fold`` of ``data`` (a ``WalkForwardData``),
    judged on its test window."""
    w, train, test = data.folds[fold], data.train[fold], data.test[fold]
    train_drift = planted_drift(cfg, w.train_start, w.train_end)
    test_drift = planted_drift(cfg, w.test_start, w.test_end)
    cost = cfg.env.cost_points
    train_close = np.asarray(train.close, np.float64)
    test_close = np.asarray(test.close, np.float64)
    momentum = tune_momentum(train_close, cost)
    macd = tune_macd(train_close, cost)
    ridge = tune_ridge(np.asarray(train.features, np.float64), train_close, cost)
    weights = np.asarray(ridge.pop("weights"))
    signal = momentum_signal(test_close, int(momentum["lookback"]), momentum["scale"])
    forecast = ridge_forecast(test.features, weights)
    paths = {
        "momentum": (band_positions(signal, momentum["band"]), momentum),
        "macd": (band_positions(macd_signal(test_close, int(macd["scale"])), macd["band"]), macd),
        "ridge": (band_positions(forecast, ridge["threshold"] * cost), ridge),
    }
    usd = cfg.env.point_value_usd
    bound: dict[str, Any] = {}
    if train_drift is not None and test_drift is not None:
        informed = tune_informed(train_close, train_drift, cost)
        signal = np.asarray(test_drift, np.float64) / informed["scale"]
        paths["informed"] = (band_positions(signal, informed["band"]), informed)
        bound = {"causal_bound_usd": usd * causal_bound_points(test_drift[:-1], cost)}
    results = {}
    for name, (positions, params) in paths.items():
        record = position_record(test_close, positions, cost)
        result = record_metrics(record, point_value_usd=usd, bars_per_year=data.bars_per_year)
        extra = bound if name == "informed" else {}
        results[name] = {"metrics": result | {"params": params} | extra, "rollout": record}
    return results
