"""Synthetic ES-like 1-minute bars with an optional planted trading signal of known size.

They let every part of jdqn run without a data vendor and give learning tests a known answer: at
``signal_strength = 0`` the close is a martingale (up to tick rounding) and no policy beats
costs; above 0 a momentum drift of known size shows in the 15-bar return feature.

Model (per 1-minute bar ``t``; ``x_t`` is the latent log price, ``C_t`` the close):

* Clock: Globex sessions Sunday-Thursday 17:00 to the next day 16:00 CT (1,380 bars each; no
  holidays), the first opening Sunday 2021-01-03 17:00.
* Volatility (log units per bar): ``sigma_t = base * season(time of day) * day_k * exp(h_t)``;
  ``season`` is low overnight, bumps for the 07:30 data releases and is a U over regular trading
  hours (RTH, 08:30-15:00); ``day_k`` is a lognormal level per session; ``h_t = 0.995 h_{t-1} +
  sqrt(1 - 0.995^2) 0.35 eps_t`` (volatility clustering with a ~140-bar half-life).
* Price: ``x_t = x_{t-1} + gap_t + mu_{t-1} + sigma_t z_t`` with ``z_t ~ N(0, 1)``; ``gap_t ~
  N(0, (8 sigma_t)^2)`` at each session's first bar (the hour without trading), else 0.
  ``C_t = 0.25 * max(1, round(exp(x_t) / 0.25))``; ``open_t = C_{t-1}`` except at a session's
  first bar (the gapped price); high and low extend ``max/min(open, close)`` by half-normal
  amounts; all on the tick grid.
* Signal: ``mu_t = signal_strength * sigma_t * tanh(m_t)`` with ``m_t = log(C_t / C_{t-k}) /
  (sigma_t sqrt(k))``, ``k = min(lookback, t)`` (15 by default): the past k-bar return of the
  observed close in units of its expected spread, so ``E[x_{t+1} - x_t | bars <= t] = mu_t`` and
  trends persist. Other shapes (``SIGNAL_KINDS``): ``reversion`` flips the sign (moves fade);
  ``rth_momentum`` plants the momentum drift only at bars inside RTH, none overnight.
* Volume: an integer lognormal count following the intraday shape and the size of the move.

Measured on seeds 0 and 1, 60,000 bars, at strengths 0, 0.1, 0.2 and 0.25 (cost 0.3 points per
side; :func:`synthetic_path` returns the latent drift): the edge ``E|drift_points|`` is about
0.22 x strength points per bar; ``tanh(m_t)`` correlates with the next 15-bar close change (in
units of ``sigma_t C_t``) at 0.00, 0.13, 0.27 and 0.34, with the next bar's at -0.02 (tick
rounding bounces the close), 0.04, 0.11 and 0.15; an oracle long when ``m_t > 1``, short when
``m_t < -1``, else holding, nets -0.017, 0.00, +0.02 and +0.033 points per bar after costs, so
strength >= 0.2 beats costs. Up to 0.3 the price stays within a few hundred points of its start;
much larger strengths make trends feed themselves.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from jdqn.data.bars import Bars
from jdqn.data.bars.core import PRICE_COLUMNS
from jdqn.data.bars.reading import file_kind

TICK = 0.25  # ES tick, index points
SESSION_BARS = 1_380  # 17:00-16:00 CT
MOMENTUM_BARS = 15  # default lookback of the planted signal
SIGNAL_KINDS = ("momentum", "reversion", "rth_momentum")  # shapes of the planted drift
FIRST_SESSION = np.datetime64("2021-01-03T17:00", "m")  # a Sunday
_RTH_OPEN, _RTH_CLOSE = 8 * 60 + 30, 15 * 60  # minutes after midnight CT
_BASE_SIGMA = 3.0e-4  # log-vol per bar at season 1 (about 0.55 points at 1,800)
_VOL_PHI, _VOL_TAU = 0.995, 0.35
_DAY_SIGMA = 0.25
_GAP_SIGMAS = 8.0
_HIGH_LOW_SCALE = 0.6  # half-normal wick size in units of the bar's sigma


class SyntheticPath(NamedTuple):
    """Synthetic bars plus the latent quantities that define the planted signal."""

    bars: Bars
    sigma: np.ndarray  # [T] float64, volatility of bar t (log price per bar)
    momentum: np.ndarray  # [T] float64, m_t: past-k-bar return in units of sigma_t sqrt(k)
    drift: np.ndarray  # [T] float64, E[x_{t+1} - x_t | bars <= t] (log price)
    drift_points: np.ndarray  # [T] float64, C_t * drift: expected next close change, points


def session_timestamps(n_bars: int) -> np.ndarray:
    """[n_bars] datetime64[ns]: consecutive Globex minutes from the first session (Mon-Fri)."""
    bar = np.arange(n_bars)
    session, minute = np.divmod(bar, SESSION_BARS)
    week, weekday = np.divmod(session, 5)  # session k trades for Monday..Friday of its week
    start = FIRST_SESSION + (7 * week + weekday) * np.timedelta64(1440, "m")
    return (start + minute * np.timedelta64(1, "m")).astype("datetime64[ns]")


def _season(minute_of_day: np.ndarray) -> np.ndarray:
    """Intraday volatility multiplier (RTH midday ~1)."""
    u = (minute_of_day - _RTH_OPEN).astype(np.float64)
    rth = (minute_of_day >= _RTH_OPEN) & (minute_of_day < _RTH_CLOSE)
    u_shape = 0.9 + 1.6 * np.exp(-np.clip(u, 0, None) / 20.0)
    u_shape += 0.6 * np.exp(-np.clip(_RTH_CLOSE - 1 - minute_of_day, 0, None) / 15.0)
    pre_open = (minute_of_day >= 7 * 60) & (minute_of_day < _RTH_OPEN)
    release = (minute_of_day >= 7 * 60 + 30) & (minute_of_day < 7 * 60 + 40)
    return np.where(rth, u_shape, np.where(release, 1.2, np.where(pre_open, 0.6, 0.45)))


def synthetic_path(
    n_bars: int = 60_000,
    seed: int = 0,
    signal_strength: float = 0.0,
    kind: str = "momentum",
    lookback: int = MOMENTUM_BARS,
) -> SyntheticPath:
    """Generate synthetic ES bars and their latent volatility, momentum and drift (module doc)."""
    if n_bars < 2:
        raise ValueError(f"synthetic_bars: n_bars={n_bars}; fix: use at least 2 bars")
    if signal_strength < 0:
        raise ValueError(f"synthetic_bars: signal_strength={signal_strength}; fix: use >= 0")
    if kind not in SIGNAL_KINDS or lookback < 1:
        raise ValueError(
            f"synthetic_bars: signal kind {kind!r}, lookback {lookback}; "
            f"fix: use one of {SIGNAL_KINDS} and a lookback of at least 1 bar"
        )
    rng = np.random.default_rng(seed)
    timestamp = session_timestamps(n_bars)
    minute_of_day = timestamp.astype("datetime64[m]").astype(np.int64) % 1440
    season = _season(minute_of_day)
    session = np.arange(n_bars) // SESSION_BARS
    session_start = np.arange(n_bars) % SESSION_BARS == 0
    session_start[0] = False
    rth = (minute_of_day >= _RTH_OPEN) & (minute_of_day < _RTH_CLOSE)
    # The drift planted after bar t: signed strength, 0 where this shape has no edge.
    gain = signal_strength * (-1.0 if kind == "reversion" else 1.0)
    planted = np.where(rth | (kind != "rth_momentum"), gain, 0.0).tolist()

    # Draws in a fixed order so a seed always gives the same path.
    start_price = TICK * round(rng.uniform(1600.0, 2000.0) / TICK)
    day_level = np.exp(_DAY_SIGMA * rng.standard_normal(session[-1] + 1))[session]
    vol_shock = rng.standard_normal(n_bars)
    price_shock = rng.standard_normal(n_bars)
    gap_shock = rng.standard_normal(n_bars) * session_start
    wick_up, wick_down = np.abs(rng.standard_normal((2, n_bars)))
    volume_noise = rng.standard_normal(n_bars)

    # Log-vol AR(1) and the price recursion are sequential; plain-float loops keep them fast.
    sigma_scale = (_BASE_SIGMA * season * day_level).tolist()
    vol_gain = math.sqrt(1.0 - _VOL_PHI**2) * _VOL_TAU
    vol_bias = 0.5 * _VOL_TAU**2  # so E[exp(h)] = 1
    shocks, z, gaps = vol_shock.tolist(), price_shock.tolist(), (_GAP_SIGMAS * gap_shock).tolist()
    log_close, opens, closes, sigma, momentum, drift = ([0.0] * n_bars for _ in range(6))
    h, mu, x = 0.0, 0.0, math.log(start_price)
    opens[0] = start_price
    exp, log, tanh, sqrt = math.exp, math.log, math.tanh, math.sqrt
    for t in range(n_bars):
        h = _VOL_PHI * h + vol_gain * shocks[t]
        s_t = sigma_scale[t] * exp(h - vol_bias)
        if t:
            x += gaps[t] * s_t
            opens[t] = closes[t - 1] if gaps[t] == 0.0 else TICK * max(1, round(exp(x) / TICK))
            x += mu + s_t * z[t]
        close = TICK * max(1, round(exp(x) / TICK))
        log_c = log(close)
        log_close[t] = log_c
        k = t if t < lookback else lookback
        m = (log_c - log_close[t - k]) / (s_t * sqrt(k)) if k else 0.0
        mu = planted[t] * s_t * tanh(m)
        closes[t], sigma[t], momentum[t], drift[t] = close, s_t, m, mu

    open_, close_, sigma_ = np.asarray(opens), np.asarray(closes), np.asarray(sigma)
    wick = _HIGH_LOW_SCALE * (sigma_ * close_)  # [T] points
    high = np.maximum(open_, close_) + TICK * np.round(wick * wick_up / TICK)
    low = np.maximum(np.minimum(open_, close_) - TICK * np.round(wick * wick_down / TICK), TICK)
    # Volume follows the intraday shape, the volatility state and the size of the move.
    log_volume = (
        math.log(3000.0)
        + 2.5 * np.log(season)
        + 0.8 * np.log(sigma_ / (_BASE_SIGMA * season))
        + 0.35 * np.abs(price_shock)
        + 0.3 * volume_noise
    )
    volume = np.maximum(1.0, np.round(np.exp(log_volume)))
    bars = Bars(timestamp=timestamp, open=open_, high=high, low=low, close=close_, volume=volume)
    drift_ = np.asarray(drift)
    return SyntheticPath(bars, sigma_, np.asarray(momentum), drift_, drift_ * close_)


def synthetic_bars(
    n_bars: int = 60_000,
    seed: int = 0,
    signal_strength: float = 0.0,
    kind: str = "momentum",
    lookback: int = MOMENTUM_BARS,
) -> Bars:
    """ES-like 1-minute bars, deterministic per seed (model and signal: module docstring)."""
    return synthetic_path(n_bars, seed, signal_strength, kind, lookback).bars


def write_bars(bars: Bars, path: str | os.PathLike[str]) -> None:
    """Write bars as CSV (.csv, .txt, .gz) or Parquet (.parquet, .pq) that load_bars reads back."""
    volume = bars.volume
    if np.all(volume == np.round(volume)):
        volume = volume.astype(np.int64)
    prices = {name: getattr(bars, name) for name in PRICE_COLUMNS}
    frame = pd.DataFrame(
        {"timestamp": bars.timestamp.astype("datetime64[ns]"), **prices, "volume": volume}
    )
    final = Path(path)
    kind = file_kind(final)
    if kind not in ("parquet", "csv"):
        raise ValueError(f"write_bars: unsupported extension of {path}; fix: use .csv or .parquet")
    # Written beside it and renamed: a full disk or a kill leaves no half-written file. The name
    # ends as the file's does (pandas reads the compression from it); open() follows the umask.
    staging = final.with_name(f".{os.getpid()}.tmp.{final.name}")
    try:
        if kind == "parquet":
            frame.to_parquet(staging, index=False)
        else:
            frame.to_csv(staging, index=False, date_format="%Y-%m-%d %H:%M:%S")
        os.replace(staging, final)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
