"""Synthetic ES bars: determinism, tick grid, OHLC, sessions, volatility, and the planted signal."""

from __future__ import annotations

import numpy as np
import pytest
from child import run_child

from jdqn.data import load_bars, synthetic_bars, synthetic_path, write_bars
from jdqn.data.synth import MOMENTUM_BARS, SESSION_BARS, TICK

N_BARS = 60_000


@pytest.fixture(scope="module")
def flat():
    return synthetic_path(N_BARS, seed=0, signal_strength=0.0)


@pytest.fixture(scope="module")
def signal():
    return synthetic_path(N_BARS, seed=0, signal_strength=0.2)


def _minute_of_day(timestamp: np.ndarray) -> np.ndarray:
    return timestamp.astype("datetime64[m]").astype(np.int64) % 1440


def _weekday(timestamp: np.ndarray) -> np.ndarray:
    return (timestamp.astype("datetime64[D]").astype(np.int64) + 3) % 7  # Monday = 0


def test_deterministic_per_seed():
    a, b, c = synthetic_bars(3000, seed=7), synthetic_bars(3000, seed=7), synthetic_bars(3000, 8)
    for name in ("timestamp", "open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.close, c.close)


def test_prices_on_tick_grid_and_ohlc_consistent(flat):
    bars = flat.bars
    prices = np.stack([bars.open, bars.high, bars.low, bars.close])
    np.testing.assert_array_equal(prices / TICK, np.round(prices / TICK))
    assert np.all(bars.low > 0)
    assert np.all(bars.low <= np.minimum(bars.open, bars.close))
    assert np.all(bars.high >= np.maximum(bars.open, bars.close))
    assert bars.close.min() > 1000 and bars.close.max() < 3000
    assert 1600 <= bars.open[0] <= 2000


def test_open_is_previous_close_except_after_the_session_break(flat):
    bars = flat.bars
    session_start = np.arange(1, len(bars)) % SESSION_BARS == 0
    same = bars.open[1:] == bars.close[:-1]
    assert np.all(same[~session_start])
    assert not np.all(same[session_start])  # the hour without trading gaps the open


def test_integer_volume_higher_in_rth(flat):
    bars = flat.bars
    np.testing.assert_array_equal(bars.volume, np.round(bars.volume))
    assert bars.has_volume and np.all(bars.volume >= 1)
    minute = _minute_of_day(bars.timestamp)
    rth = (minute >= 8 * 60 + 30) & (minute < 15 * 60)
    assert bars.volume[rth].mean() > 3 * bars.volume[~rth].mean()
    move = np.abs(np.diff(bars.close))
    assert move[rth[1:]].mean() > 1.5 * move[~rth[1:]].mean()


def test_session_structure(flat):
    timestamp = flat.bars.timestamp
    minute, weekday = _minute_of_day(timestamp), _weekday(timestamp)
    assert not np.any((minute >= 16 * 60) & (minute < 17 * 60))  # daily break
    assert not np.any(weekday == 5)  # Saturday
    assert np.all(minute[weekday == 6] >= 17 * 60)  # Sunday: evening open only
    assert np.all(minute[weekday == 4] < 16 * 60)  # Friday: closes at 16:00
    step = np.diff(timestamp).astype("timedelta64[m]").astype(np.int64)
    session_start = np.arange(1, len(timestamp)) % SESSION_BARS == 0
    assert np.all(step[~session_start] == 1)
    assert set(step[session_start].tolist()) == {61, 2 * 1440 + 61}  # next evening / weekend
    assert np.all(minute[::SESSION_BARS] == 17 * 60)


def test_volatility_clusters(flat):
    # Within overnight hours the intraday shape is flat, so |change| autocorrelation comes from
    # the log-vol AR(1) and the daily level, not from the clock.
    bars = flat.bars
    minute = _minute_of_day(bars.timestamp)
    overnight = ((minute < 7 * 60) | (minute >= 17 * 60 + 10))[1:]
    move = np.abs(np.diff(bars.close))[overnight]
    assert np.corrcoef(move[:-30], move[30:])[0, 1] > 0.1


def test_drift_matches_documented_formula(signal):
    # Independent float64 recomputation of m_t and mu_t from the observed closes and sigma_t.
    close, sigma = signal.bars.close, signal.sigma
    t = np.arange(len(close))
    k = np.minimum(t, MOMENTUM_BARS)
    log_close = np.log(close)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(k > 0, (log_close - log_close[t - k]) / (sigma * np.sqrt(k)), 0.0)
    np.testing.assert_allclose(signal.momentum, m, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(signal.drift, 0.2 * sigma * np.tanh(m), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(signal.drift_points, signal.drift * close, rtol=1e-12)


@pytest.mark.parametrize("kind", ["reversion", "rth_momentum"])
def test_other_shapes_plant_their_drift_as_documented(kind):
    """Independent float64 recomputation at lookback 45: reversion flips the sign, the RTH-only
    shape is 0 outside 08:30-15:00 CT; an unknown shape is refused with the valid ones."""
    path = synthetic_path(8_000, 4, 0.3, kind, 45)
    close, sigma = path.bars.close, path.sigma
    t = np.arange(len(close))
    k = np.minimum(t, 45)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.where(k > 0, np.log(close / close[t - k]) / (sigma * np.sqrt(k)), 0.0)
    minute = _minute_of_day(path.bars.timestamp)
    rth = (minute >= 8 * 60 + 30) & (minute < 15 * 60)
    gate = -1.0 if kind == "reversion" else np.where(rth, 1.0, 0.0)
    np.testing.assert_allclose(path.drift, gate * 0.3 * sigma * np.tanh(m), rtol=1e-9, atol=1e-15)
    assert np.count_nonzero(path.drift) > 1_000
    with pytest.raises(ValueError, match="fix: use one of"):
        synthetic_path(3_000, 4, 0.3, "trend", 15)


def _forward_correlation(path, horizon: int) -> float:
    close, sigma = path.bars.close, path.sigma
    change = (close[horizon:] - close[:-horizon]) / (sigma[:-horizon] * close[:-horizon])
    return float(np.corrcoef(np.tanh(path.momentum[:-horizon]), change)[0, 1])


def _hysteresis_oracle_points_per_bar(path, threshold: float = 1.0, cost: float = 0.3) -> float:
    position, current = np.zeros(len(path.momentum) - 1), 0.0
    for i, m in enumerate(path.momentum[:-1].tolist()):
        current = 1.0 if m > threshold else -1.0 if m < -threshold else current
        position[i] = current
    traded = np.abs(np.diff(np.concatenate([[0.0], position])))
    return float(np.mean(position * np.diff(path.bars.close) - cost * traded))


def test_planted_signal_strength_as_documented(flat, signal):
    # Documented (module docstring): 15-bar correlation ~0.00 at 0 and ~0.27 at 0.2; 1-bar ~-0.02
    # (tick bounce) and ~0.11; E|drift| ~0.045 points at 0.2; the oracle nets ~-0.017 and ~+0.02.
    assert np.all(flat.drift == 0.0)
    assert abs(_forward_correlation(flat, 15)) < 0.02
    assert _forward_correlation(signal, 15) > 0.22
    assert _forward_correlation(flat, 1) < 0.0
    assert _forward_correlation(signal, 1) > 0.08
    assert 0.035 < np.abs(signal.drift_points).mean() < 0.055
    assert _hysteresis_oracle_points_per_bar(flat) < -0.01
    assert _hysteresis_oracle_points_per_bar(signal) > 0.01


def test_strong_signal_keeps_prices_positive_and_bounded():
    bars = synthetic_bars(N_BARS, seed=3, signal_strength=0.3)
    assert bars.low.min() > 1000 and bars.high.max() < 3000


@pytest.mark.parametrize("suffix", ["csv", "parquet", "csv.gz"])
def test_write_bars_round_trips_through_load_bars(tmp_path, suffix):
    bars = synthetic_bars(2000, seed=1, signal_strength=0.1)
    path = tmp_path / f"bars.{suffix}"
    write_bars(bars, path)
    loaded = load_bars(path)
    for name in ("timestamp", "open", "high", "low", "close", "volume"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(bars, name))
    if suffix == "csv":
        assert path.read_text().splitlines()[0] == "timestamp,open,high,low,close,volume"


def test_invalid_arguments():
    with pytest.raises(ValueError, match="n_bars"):
        synthetic_bars(1)
    with pytest.raises(ValueError, match="signal_strength"):
        synthetic_bars(100, signal_strength=-0.1)
    with pytest.raises(ValueError, match="unsupported extension"):
        write_bars(synthetic_bars(10), "bars.xlsx")


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_storage_failure_while_synthesising_leaves_no_file(tmp_path, suffix):
    """Case F6: a full disk left a truncated CSV or a 0-byte Parquet (here the file-size limit
    fails the write)."""
    out = tmp_path / f"bars{suffix}"
    child = (
        "import resource, signal, sys\n"
        "from jdqn import cli\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))\n"
        f"sys.exit(cli.main(['data', 'synth', '--bars', '5000', '--out', {str(out)!r}]))\n"
    )
    done = run_child(child)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "File too large" in done.stderr and list(tmp_path.iterdir()) == []
