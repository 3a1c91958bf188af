"""Walk-forward arrays: bars -> past-only features -> folds -> per-fold train-normalised arrays,
what the trainer and evaluator consume (docs/design.md §3). Each fold's normaliser is fit on its
train rows only, so nothing in a fold's training inputs depends on its test window or later bars.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from jdqn.config import Config, DataConfig, WalkForwardConfig
from jdqn.data.bars import Bars, load_bars
from jdqn.data.calendars import CALENDARS, TradingCalendar, trading_day
from jdqn.data.features import Normaliser, compute_features, fit_normaliser, normalise
from jdqn.data.folds import Fold, make_folds
from jdqn.data.intervals import describe_reading, resolve_purge
from jdqn.data.synth import synthetic_bars


class FoldArrays(NamedTuple):
    """One window (train or test) of one fold, ready for the environment."""

    features: np.ndarray  # [T, F] float32, normalised with the fold's train statistics
    close: np.ndarray  # [T] float32, index points


@dataclass(frozen=True, eq=False)  # eq=False: arrays have no single truth value
class WalkForwardData:
    """All folds of one bar series."""

    folds: tuple[Fold, ...]
    feature_names: tuple[str, ...]  # [F]
    feature_groups: dict[str, tuple[int, ...]]  # group -> feature indices
    train: tuple[FoldArrays, ...]  # per fold
    test: tuple[FoldArrays, ...]  # per fold
    test_timestamps: tuple[np.ndarray, ...]  # per fold, [T_test] datetime64[ns] exchange time
    bars_per_year: float  # median bars per trading day x 252 (annualises Sharpe)
    source: str  # file path or "synthetic(seed=..., bars=..., signal=...)"
    normalisers: tuple[Normaliser, ...] = ()  # per fold, fit on its train rows
    n_bars: int = 0  # bars in the whole series
    has_volume: bool = True  # the bars have volume (else the volume feature is all zeros)
    reading: dict[str, Any] = field(default_factory=dict)  # intervals.describe_reading
    # the fold layout used: the config's, with the purge resolved from the data's interval
    walkforward: WalkForwardConfig = field(default_factory=WalkForwardConfig)

    @property
    def n_features(self) -> int:
        return len(self.feature_names)


def stack_folds(arrays: Sequence[FoldArrays]) -> FoldArrays:
    """Stack per-fold arrays along a new leading fold axis: [K, T, F] and [K, T]."""
    lengths = [len(a.close) for a in arrays]
    if not arrays or len(set(lengths)) != 1:
        raise ValueError(
            f"stack_folds: folds have window lengths {lengths}; only equal lengths stack "
            "(fix: use walkforward.mode=rolling, or run the folds one at a time)"
        )
    return FoldArrays(
        features=np.stack([a.features for a in arrays]),
        close=np.stack([a.close for a in arrays]),
    )


def describe_source(cfg: DataConfig) -> str:
    """The data source as a short string for logs and results."""
    if cfg.path is not None:
        return str(cfg.path)
    shape = (cfg.signal_kind, cfg.signal_lookback)
    return (
        f"synthetic(seed={cfg.synthetic_seed}, bars={cfg.synthetic_bars}, "
        f"signal={cfg.signal_strength:g}"
        + ("" if shape == ("momentum", 15) else f", {shape[0]} over {shape[1]} bars")
        + ")"
    )


def read_bars(cfg: DataConfig, path: str | os.PathLike[str]) -> Bars:
    """The bars of ``path`` read as the data section says (columns, the zone of naive times,
    the timestamp format, the calendar's clock): the one way a run, ``jdqn data check``,
    ``jdqn evaluate`` and a saved policy read a bar file."""
    return load_bars(
        path,
        columns=cfg.column_map,
        timezone=cfg.timezone,
        exchange_timezone=CALENDARS[cfg.calendar].timezone,
        timestamp_format=cfg.timestamp_format,
    )


def load_source(cfg: DataConfig) -> Bars:
    """Bars from ``cfg.path`` (validated) or, when it is None, the synthetic generator."""
    if cfg.path is not None:
        return read_bars(cfg, cfg.path)
    return synthetic_bars(
        cfg.synthetic_bars,
        cfg.synthetic_seed,
        cfg.signal_strength,
        cfg.signal_kind,
        cfg.signal_lookback,
    )


def bars_per_year(timestamp: np.ndarray, calendar: TradingCalendar) -> float:
    """Median bars per trading day (the calendar's session: a full Globex one is 1,380 bars,
    RTH-only data give 390) x the calendar's trading days per year; the median ignores partial
    first and last days and holiday sessions."""
    _, counts = np.unique(trading_day(timestamp, calendar), return_counts=True)
    return float(np.median(counts)) * calendar.trading_days_per_year


def split_folds(
    values: np.ndarray, close: np.ndarray, folds: Sequence[Fold], clip: float
) -> tuple[tuple[FoldArrays, ...], tuple[FoldArrays, ...], tuple[Normaliser, ...]]:
    """Per fold: fit on train rows, normalise train and test rows -> (train, test, normalisers)."""
    close32 = close.astype(np.float32)
    normalisers = tuple(fit_normaliser(values, f.train_start, f.train_end) for f in folds)

    def window(lo: int, hi: int, normaliser: Normaliser) -> FoldArrays:
        return FoldArrays(normalise(values[lo:hi], normaliser, clip), close32[lo:hi])

    pairs = list(zip(folds, normalisers, strict=True))
    train = tuple(window(f.train_start, f.train_end, n) for f, n in pairs)
    test = tuple(window(f.test_start, f.test_end, n) for f, n in pairs)
    return train, test, normalisers


def prepare_walkforward(bars: Bars, cfg: Config, source: str = "") -> WalkForwardData:
    """Features, folds and per-fold train-normalised arrays for a walk-forward run (the purge
    resolved from the bars' interval: :func:`jdqn.data.intervals.resolve_purge`)."""
    cfg = resolve_purge(cfg, bars)
    # Fail fast before computing features.
    folds = make_folds(len(bars), cfg.walkforward, min_purge=cfg.data.lookback_bars)
    features = compute_features(bars, cfg.data)
    train, test, normalisers = split_folds(
        features.values, bars.close, folds, cfg.data.feature_clip
    )
    return WalkForwardData(
        folds=tuple(folds),
        feature_names=features.names,
        feature_groups=features.groups,
        train=train,
        test=test,
        test_timestamps=tuple(bars.timestamp[f.test_start : f.test_end] for f in folds),
        bars_per_year=bars_per_year(bars.timestamp, CALENDARS[cfg.data.calendar]),
        source=source or describe_source(cfg.data),
        normalisers=normalisers,
        n_bars=len(bars),
        has_volume=bars.has_volume,
        reading=describe_reading(bars, cfg.data, cfg.env.instrument)
        | {"purge_bars": cfg.walkforward.purge_bars},
        walkforward=cfg.walkforward,
    )
