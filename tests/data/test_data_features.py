"""Features: float64 loop reference, hand-computed calendar rows, no look-ahead, normalisation."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jdqn.config import DataConfig
from jdqn.data import (
    Bars,
    Normaliser,
    compute_features,
    fit_normaliser,
    load_bars,
    normalise,
    synthetic_bars,
)
from jdqn.data.features import odd_features

ES_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "es_2013-09_1min.csv"
SMALL_CFG = DataConfig(return_horizons=(1, 3, 7), volume_window=10)
BASE = synthetic_bars(1500, seed=5, signal_strength=0.2)


def _reference_features(bars: Bars, cfg: DataConfig) -> np.ndarray:
    """Row by row, from the definitions in the features module docstring (float64 loops)."""
    rows = []
    window = cfg.volume_window
    c, h, lo, v = bars.close, bars.high, bars.low, bars.volume
    for t in range(len(bars)):
        past = range(max(0, t - window + 1), t + 1)
        row = [math.log(c[t] / c[max(0, t - k)]) for k in cfg.return_horizons]
        squared = [math.log(c[i] / c[max(0, i - 1)]) ** 2 for i in past]
        vol = math.sqrt(sum(squared) / len(squared))
        if cfg.scaled_returns:
            row += [r / (vol * math.sqrt(k)) if vol > 0 else 0.0
                    for r, k in zip(row, cfg.return_horizons, strict=True)]  # fmt: skip
        log_ranges = [math.log(h[i] / lo[i]) for i in past]
        row.append(log_ranges[-1])
        spread = h[t] - lo[t]
        row.append(2 * (c[t] - lo[t]) / spread - 1 if spread > 0 else 0.0)
        mean_range = sum(log_ranges) / len(log_ranges)
        row.append(log_ranges[-1] / mean_range if mean_range > 0 else 0.0)
        row.append(vol)
        if bars.has_volume:
            log_volume = np.array([math.log1p(v[i]) for i in past])
            std = log_volume.std()
            row.append((log_volume[-1] - log_volume.mean()) / std if std > 1e-8 else 0.0)
        else:
            row.append(0.0)
        stamp = bars.timestamp[t].astype("datetime64[m]").item()  # datetime.datetime
        minute = stamp.hour * 60 + stamp.minute
        rth = 8 * 60 + 30 <= minute < 15 * 60
        trading_day = (stamp + (np.timedelta64(7, "h")).item()).weekday()
        row += [
            math.sin(2 * math.pi * minute / 1440),
            math.cos(2 * math.pi * minute / 1440),
            ((minute - 17 * 60) % 1440) / 1380,
            (minute - 510) / 390 if rth else 0.0,
            trading_day / 4,
            float(rth),
        ]
        rows.append(row)
    return np.array(rows)


def test_layout_and_groups():
    features = compute_features(BASE, DataConfig())
    assert features.names == (
        "ret_1", "ret_5", "ret_15", "ret_60",
        "log_range", "close_location", "range_ratio", "realized_vol",
        "volume_z",
        "tod_sin", "tod_cos", "session_progress", "rth_progress", "day_of_week", "is_rth",
    )  # fmt: skip
    assert features.groups == {
        "returns": (0, 1, 2, 3),
        "range": (4, 5, 6, 7),
        "volume": (8,),
        "calendar": (9, 10, 11, 12, 13, 14),
    }
    assert features.values.shape == (len(BASE), 15) and features.values.dtype == np.float32


def test_scaled_returns_follow_the_raw_ones_in_their_group():
    features = compute_features(BASE, DataConfig(scaled_returns=True))
    assert features.names[:8] == (
        "ret_1", "ret_5", "ret_15", "ret_60",
        "ret_1_scaled", "ret_5_scaled", "ret_15_scaled", "ret_60_scaled",
    )  # fmt: skip
    assert features.groups["returns"] == tuple(range(8))
    assert features.groups["calendar"] == tuple(range(13, 19))


@pytest.mark.parametrize("scaled", [False, True])
def test_odd_features_change_sign_on_the_mirrored_path_and_no_other_does(scaled):
    """network.mirror's parity: each price mirrored about the first close (log C -> 2 log C_0 -
    log C, highs and lows swapped), the odd features' values change sign and the others keep
    theirs (close_location to within the bars' relative range: it is taken in prices)."""
    cfg = dataclasses.replace(SMALL_CFG, scaled_returns=scaled)
    square = BASE.close[0] ** 2
    mirrored = dataclasses.replace(
        BASE, open=square / BASE.open, high=square / BASE.low, low=square / BASE.high,
        close=square / BASE.close,
    )  # fmt: skip
    plain = compute_features(BASE, cfg).values.astype(np.float64)
    flipped = compute_features(mirrored, cfg).values.astype(np.float64)
    odd = list(odd_features(cfg))
    even = [i for i in range(plain.shape[1]) if i not in odd]
    names = compute_features(BASE, cfg).names
    assert [names[i] for i in odd] == [n for n in names if n.startswith("ret_")] + [
        "close_location"
    ]
    assert np.abs(plain[:, odd]).mean(axis=0).min() > 1e-4  # the sign carries information
    returns, location = odd[:-1], odd[-1]
    np.testing.assert_allclose(flipped[:, returns], -plain[:, returns], rtol=1e-4, atol=1e-7)
    widest = float(np.max(np.log(BASE.high / BASE.low)))  # the widest bar's relative range
    np.testing.assert_allclose(flipped[:, location], -plain[:, location], rtol=0, atol=widest)
    np.testing.assert_allclose(flipped[:, even], plain[:, even], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("source", ["synthetic", "es_sample", "no_volume", "scaled"])
def test_matches_float64_loop_reference(source):
    if source == "es_sample":
        bars, cfg = load_bars(ES_SAMPLE), DataConfig(scaled_returns=True)
    else:
        bars, cfg = BASE, SMALL_CFG
        if source == "no_volume":
            bars = dataclasses.replace(bars, volume=np.zeros(len(bars)), has_volume=False)
        if source == "scaled":
            cfg = dataclasses.replace(cfg, scaled_returns=True)
    got = compute_features(bars, cfg).values
    want = _reference_features(bars, cfg)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_hand_computed_calendar_rows():
    stamps = np.array(
        ["2013-09-01T17:00", "2013-09-03T08:30", "2013-09-03T14:59", "2013-09-03T15:00"],
        dtype="datetime64[ns]",
    )
    ones = np.ones(4)
    bars = Bars(stamps, ones, ones, ones, ones, ones)
    features = compute_features(bars, DataConfig())
    calendar = features.values[:, features.groups["calendar"]]
    # tod_sin, tod_cos, session_progress, rth_progress, day_of_week, is_rth
    expected = [
        [math.sin(2 * math.pi * 1020 / 1440), math.cos(2 * math.pi * 1020 / 1440), 0, 0, 0, 0],
        [math.sin(2 * math.pi * 510 / 1440), math.cos(2 * math.pi * 510 / 1440), 930 / 1380, 0,
         0.25, 1],
        [math.sin(2 * math.pi * 899 / 1440), math.cos(2 * math.pi * 899 / 1440), 1319 / 1380,
         389 / 390, 0.25, 1],
        [math.sin(2 * math.pi * 900 / 1440), math.cos(2 * math.pi * 900 / 1440), 1320 / 1380, 0,
         0.25, 0],
    ]  # fmt: skip
    np.testing.assert_allclose(calendar, expected, atol=1e-6)


def test_hand_computed_price_rows():
    stamps = np.array(
        ["2013-09-03T09:00", "2013-09-03T09:01", "2013-09-03T09:02"], "datetime64[ns]"
    )
    close = np.array([100.0, 101.0, 99.0])
    high = np.array([100.0, 102.0, 101.0])
    low = np.array([100.0, 100.0, 99.0])
    bars = Bars(stamps, close, high, low, close, np.array([10.0, 10.0, 40.0]))
    cfg = DataConfig(return_horizons=(1, 2), volume_window=2)
    f = compute_features(bars, cfg)
    col = {name: f.values[:, i] for i, name in enumerate(f.names)}
    np.testing.assert_allclose(col["ret_1"], [0, math.log(1.01), math.log(99 / 101)], rtol=1e-6)
    np.testing.assert_allclose(col["ret_2"], [0, math.log(1.01), math.log(0.99)], rtol=1e-6)
    np.testing.assert_allclose(col["close_location"], [0, 0, -1])
    r1, r2 = math.log(1.02), math.log(101 / 99)
    np.testing.assert_allclose(col["log_range"], [0, r1, r2], rtol=1e-6)
    np.testing.assert_allclose(col["range_ratio"], [0, 2, r2 / ((r1 + r2) / 2)], rtol=1e-6)
    # Window of 2: z of the newer of two values is +1 (or 0 when they are equal).
    np.testing.assert_allclose(col["volume_z"], [0, 0, 1], atol=1e-6)


def test_no_nan_for_two_bars_and_flat_prices():
    stamps = np.array(["2013-09-03T09:00", "2013-09-03T09:01"], "datetime64[ns]")
    flat = np.full(2, 1600.0)
    features = compute_features(Bars(stamps, flat, flat, flat, flat, np.zeros(2)), DataConfig())
    assert np.isfinite(features.values).all()


@given(
    cut=st.integers(0, len(BASE) - 2),
    seed=st.integers(0, 2**31 - 1),
    shift_minutes=st.integers(1, 10_000),
)
def test_no_look_ahead(cut, seed, shift_minutes):
    """Altering any bars after ``cut`` never changes feature rows <= cut."""
    rng = np.random.default_rng(seed)
    later = slice(cut + 1, None)
    n = len(BASE) - cut - 1
    scale = np.exp(rng.normal(0, 0.05, n))
    changed = {name: getattr(BASE, name).copy() for name in ("open", "high", "low", "close")}
    for name in changed:
        changed[name][later] *= scale * (1.01 if name == "high" else 1.0)
    volume = BASE.volume.copy()
    volume[later] = rng.integers(1, 50_000, n)
    timestamp = BASE.timestamp.copy()
    timestamp[later] += np.timedelta64(shift_minutes, "m")
    altered = Bars(timestamp=timestamp, volume=volume, **changed)
    cfg = DataConfig(scaled_returns=True)
    before = compute_features(BASE, cfg).values
    after = compute_features(altered, cfg).values
    np.testing.assert_array_equal(after[: cut + 1], before[: cut + 1])
    assert not np.array_equal(after[cut + 1 :], before[cut + 1 :])  # the alteration is visible


# ---------------------------------------------------------------------------------------------
# Normalisation


def test_fit_normaliser_and_normalise_match_numpy():
    values = compute_features(BASE, DataConfig()).values
    norm = fit_normaliser(values, 100, 1400)  # spans RTH and two sessions
    window = values[100:1400].astype(np.float64)
    np.testing.assert_allclose(norm.mean, window.mean(0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(norm.std, window.std(0), rtol=1e-12)
    z = normalise(values, norm, clip=2.0)
    reference = np.clip((values - window.mean(0)) / window.std(0), -2.0, 2.0)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z, reference, rtol=1e-5, atol=1e-5)
    assert z.min() == -2.0 and z.max() == 2.0
    inside = normalise(values[100:1400], norm, clip=1e9)
    np.testing.assert_allclose(inside.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(inside.std(0), 1, atol=1e-4)


def test_constant_column_maps_to_zero():
    values = np.stack([np.arange(10.0), np.full(10, 3.0)], axis=1).astype(np.float32)
    norm = fit_normaliser(values, 0, 10)
    assert norm.std[1] == 1.0
    np.testing.assert_array_equal(normalise(values, norm, 5.0)[:, 1], 0.0)


def test_fit_normaliser_rejects_bad_window():
    values = np.zeros((5, 2), np.float32)
    for start, end in ((3, 3), (-1, 2), (0, 6)):
        with pytest.raises(ValueError, match="fit_normaliser"):
            fit_normaliser(values, start, end)


@given(
    start=st.integers(0, 1000),
    length=st.integers(2, 400),
    seed=st.integers(0, 2**31 - 1),
)
def test_normaliser_ignores_rows_outside_its_window(start, length, seed):
    values = compute_features(BASE, DataConfig()).values
    end = start + length
    noisy = values.copy()
    rng = np.random.default_rng(seed)
    noisy[:start] = rng.normal(0, 100, noisy[:start].shape)
    noisy[end:] = rng.normal(0, 100, noisy[end:].shape)
    a, b = fit_normaliser(values, start, end), fit_normaliser(noisy, start, end)
    assert isinstance(b, Normaliser)
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.std, b.std)
