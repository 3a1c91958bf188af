"""Past-only bar features and train-window normalisation (docs/design.md §3).

The feature row at bar ``t`` is a function of bars ``0..t`` only. During warm-up, trailing
statistics use the bars that exist (an ``h``-bar return at ``t < h`` is the return since bar 0; a
mean over ``W`` bars at ``t < W - 1`` is the mean over bars ``0..t``; a statistic with no spread
yet, like the volume z-score at bar 0, is 0), so no row is NaN.

Groups, in this order on the feature axis:

* ``returns``: ``ret_<h>`` = ``log(close_t / close_{t-h})`` for each ``h`` in ``return_horizons``;
  with ``scaled_returns`` also ``ret_<h>_scaled`` = ``ret_<h> / (realized_vol_t sqrt(h))``, the
  move in units of its expected spread (0 while ``realized_vol`` is 0), the volatility-scaled
  state time-series momentum trades on (Moskowitz, Ooi & Pedersen, 2012);
* ``range``: ``log_range`` = ``log(high_t / low_t)``; ``close_location`` = ``2 (close - low) /
  (high - low) - 1`` (0 for a flat bar); ``range_ratio`` = ``log_range`` over its trailing mean
  (0 while that is 0); ``realized_vol``, the trailing RMS of 1-bar log returns (both trailing
  windows ``volume_window`` bars);
* ``volume``: ``volume_z``, the trailing z-score of ``log(1 + volume)`` over ``volume_window``
  bars (zeros when the source has no volume);
* ``calendar``: the features of the instrument's calendar (:mod:`jdqn.data.calendars`), the group
  the learner's causal intervention treats as non-causal.

Normalisation z-scores every column (the bounded calendar ones too: one code path, every input on
one scale) with the statistics of a train window only and clips to +-``feature_clip``; a column
constant over the train window gets std 1, so it maps to 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from jdqn.config import DataConfig
from jdqn.data.bars import Bars
from jdqn.data.calendars import CALENDARS, calendar_features

_MIN_STD = 1e-12  # below this a column is treated as constant
_MIN_ZSCORE_STD = 1e-8  # trailing windows flatter than this have z-score 0


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value
class FeatureSet:
    """Raw (unnormalised) features of a bar series."""

    values: np.ndarray  # [T, F] float32, row t computed from bars <= t
    names: tuple[str, ...]  # [F]
    groups: dict[str, tuple[int, ...]]  # group name -> feature indices


@dataclass(frozen=True, eq=False)
class Normaliser:
    """Per-feature z-score statistics of one train window."""

    mean: np.ndarray  # [F] float64
    std: np.ndarray  # [F] float64, > 0 (constant columns get 1)


def _trailing_mean(x: np.ndarray, window: int) -> np.ndarray:
    """[T] mean of x over bars max(0, t-window+1)..t (past-only, expanding during warm-up)."""
    # pandas' rolling kernels run forward with compensated add/remove: row t sees x[:t+1] only.
    return pd.Series(x).rolling(window, min_periods=1).mean().to_numpy()


def _trailing_zscore(x: np.ndarray, window: int) -> np.ndarray:
    """[T] (x_t - trailing mean) / trailing std (population) over the same window; 0 if std ~ 0."""
    rolling = pd.Series(x).rolling(window, min_periods=1)
    mean = rolling.mean().to_numpy()
    std = np.sqrt(np.maximum(rolling.var(ddof=0).to_numpy(), 0.0))
    ok = std > _MIN_ZSCORE_STD
    return np.where(ok, (x - mean) / np.where(ok, std, 1.0), 0.0)


def _lagged_log_return(log_close: np.ndarray, horizon: int) -> np.ndarray:
    """[T] log(C_t / C_{max(0, t-h)})."""
    lagged = np.concatenate([np.full(min(horizon, len(log_close)), log_close[0]), log_close])
    return log_close - lagged[: len(log_close)]


def compute_features(bars: Bars, cfg: DataConfig) -> FeatureSet:
    """Past-only features of ``bars`` (groups and warm-up rules: module docstring)."""
    window = cfg.volume_window
    log_close = np.log(bars.close)
    returns = {f"ret_{h}": _lagged_log_return(log_close, h) for h in cfg.return_horizons}
    return_1 = _lagged_log_return(log_close, 1)
    realized_vol = np.sqrt(np.maximum(_trailing_mean(return_1 * return_1, window), 0.0))
    if cfg.scaled_returns:
        moving = realized_vol > 0
        spread = np.where(moving, realized_vol, 1.0)
        for h in cfg.return_horizons:
            scaled = np.where(moving, returns[f"ret_{h}"] / spread, 0.0) / np.sqrt(h)
            returns[f"ret_{h}_scaled"] = scaled

    log_range = np.log(bars.high / bars.low)
    spread = bars.high - bars.low
    location = np.where(
        spread > 0, 2.0 * (bars.close - bars.low) / np.where(spread > 0, spread, 1.0) - 1.0, 0.0
    )
    range_mean = _trailing_mean(log_range, window)
    range_group = {
        "log_range": log_range,
        "close_location": location,
        "range_ratio": np.where(
            range_mean > 0, log_range / np.where(range_mean > 0, range_mean, 1.0), 0.0
        ),
        "realized_vol": realized_vol,
    }
    volume_z = (
        _trailing_zscore(np.log1p(bars.volume), window)
        if bars.has_volume
        else np.zeros(len(bars), np.float64)
    )
    grouped = {
        "returns": returns,
        "range": range_group,
        "volume": {"volume_z": volume_z},
        "calendar": calendar_features(bars.timestamp, CALENDARS[cfg.calendar]),
    }
    names: list[str] = []
    columns: list[np.ndarray] = []
    groups: dict[str, tuple[int, ...]] = {}
    for group, features in grouped.items():
        groups[group] = tuple(range(len(names), len(names) + len(features)))
        names.extend(features)
        columns.extend(features.values())
    values = np.stack(columns, axis=1).astype(np.float32)
    return FeatureSet(values=values, names=tuple(names), groups=groups)


def odd_features(cfg: DataConfig) -> tuple[int, ...]:
    """Indices of the features whose sign flips when the log price path is mirrored
    (``log C -> 2 log C_0 - log C``, highs and lows swapped): the returns, scaled or not, and
    ``close_location`` (exactly in log prices, to within the bar's relative range in prices);
    every other feature is unchanged. :func:`compute_features`' column order."""
    n_returns = len(cfg.return_horizons) * (2 if cfg.scaled_returns else 1)
    return (*range(n_returns), n_returns + 1)  # close_location: the range group's second


def fit_normaliser(values: np.ndarray, start: int, end: int) -> Normaliser:
    """z-score statistics of rows [start, end) of ``values`` [T, F] only (the train window)."""
    if not 0 <= start < end <= len(values):
        raise ValueError(f"fit_normaliser: rows [{start}, {end}) not inside [0, {len(values)})")
    window = values[start:end].astype(np.float64)
    mean = window.mean(axis=0)
    std = window.std(axis=0)
    return Normaliser(mean=mean, std=np.where(std > _MIN_STD, std, 1.0))


def normalise(values: np.ndarray, normaliser: Normaliser, clip: float) -> np.ndarray:
    """[T, F] float32 ``clip((values - mean) / std, -clip, clip)``."""
    z = (values.astype(np.float64) - normaliser.mean) / normaliser.std
    return np.clip(z, -clip, clip).astype(np.float32)
