"""jdqn.evaluation.baselines against hand-computed cases."""

import itertools

import numpy as np
import pytest

from jdqn.config import SMOKETEST, apply_overrides
from jdqn.evaluation import baselines


def test_band_positions_enter_beyond_the_band_and_hold_inside_it():
    signal = np.array([0.2, 1.5, 0.3, -0.4, -2.0, 0.9, 1.01])
    assert baselines.band_positions(signal, 1.0).tolist() == [0, 1, 1, 1, -1, -1, 1]
    assert baselines.band_positions(signal, 0.0).tolist() == [1, 1, 1, -1, -1, 1, 1]


def test_position_record_charges_each_contract_traded():
    close = np.array([100.0, 101.0, 100.5, 102.0, 101.0])
    record = baselines.position_record(close, np.array([1.0, 1.0, -1.0, 0.0]), 0.3)
    # long 1 (+1 - 0.3), hold (-0.5), flip to short (-1.5 - 0.6), flat (0 - 0.3)
    np.testing.assert_allclose(record.net_points, [0.7, -0.5, -2.1, -0.3])
    np.testing.assert_allclose(record.cost_points, [0.3, 0.0, 0.6, 0.3])
    assert baselines.net_points(close, np.array([1.0, 1.0, -1.0, 0.0]), 0.3) == pytest.approx(-2.2)


def test_momentum_signal_is_the_past_k_bar_change_in_train_units():
    close = np.array([10.0, 11.0, 13.0, 12.0, 15.0])
    np.testing.assert_allclose(baselines.momentum_signal(close, 2, 2.0), [0, 0, 1.5, 0.5, 1.0])
    # k = 2 changes: 3, 1, 2 -> population std sqrt(2/3)
    assert baselines.momentum_scale(close, 2) == pytest.approx(np.sqrt(2 / 3))


def test_macd_signal_is_past_only():
    rng = np.random.default_rng(0)
    close = 100 + np.cumsum(rng.standard_normal(2_000))
    full = baselines.macd_signal(close, 1)
    cut = baselines.macd_signal(close[:1_500], 1)
    np.testing.assert_allclose(full[:1_500], cut)  # later bars never change an earlier signal
    assert np.all(full[: baselines.MACD_PRICE_WINDOW - 1] == 0)  # warm-up is flat
    assert np.std(full[1_000:]) > 0.1


def test_ridge_recovers_a_linear_forecast():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5_000, 3))
    y = x @ np.array([2.0, -1.0, 0.5]) + 3.0
    weights = baselines.ridge_fit(x, y, penalty=0.0)
    np.testing.assert_allclose(weights, [2.0, -1.0, 0.5, 3.0], atol=1e-9)
    np.testing.assert_allclose(baselines.ridge_forecast(x[:2], weights), y[:2])


def test_tuning_uses_the_train_window_and_the_informed_rule_needs_synthetic_data():
    """Momentum picked on a trending train window keeps a short lookback; a bar file has no
    planted drift; the synthetic one is the drift in points of the configured shape."""
    rng = np.random.default_rng(2)
    steps = np.repeat(rng.choice([-1.0, 1.0], 100), 50) * 0.5 + 0.1 * rng.standard_normal(5_000)
    close = 1_000 + np.cumsum(steps)
    picked = baselines.tune_momentum(close, 0.3)
    assert picked["lookback"] <= 30
    assert (
        baselines.net_points(
            close,
            baselines.band_positions(
                baselines.momentum_signal(close, picked["lookback"], picked["scale"]),
                picked["band"],
            ),
            0.3,
        )
        > 1_000
    )
    assert baselines.planted_drift(apply_overrides(SMOKETEST, ["data.path=x.csv"]), 0, 10) is None
    from jdqn.data.synth import synthetic_path

    cfg = apply_overrides(
        SMOKETEST,
        ["data.signal_strength=0.3", "data.synthetic_bars=2000", "data.signal_kind=reversion"],
    )
    np.testing.assert_array_equal(
        baselines.planted_drift(cfg, 100, 200),
        synthetic_path(2_000, 0, 0.3, "reversion", 15).drift_points[100:200],
    )


def test_causal_bound_is_the_best_position_path_by_brute_force():
    """Every path in {-1, 0, 1}^7 from flat: the dynamic programme finds the best one's value."""
    rng = np.random.default_rng(5)
    for cost in (0.0, 0.3, 2.0):
        drift = rng.normal(0.0, 0.5, 7)
        paths = np.array(list(itertools.product((-1, 0, 1), repeat=7)), np.float64)
        traded = np.abs(np.diff(np.concatenate([np.zeros((len(paths), 1)), paths], 1), axis=1))
        best = np.max(paths @ drift - cost * traded.sum(1))
        assert baselines.causal_bound_points(drift, cost) == pytest.approx(best, abs=1e-12)
    assert baselines.causal_bound_points(np.zeros(50), 0.3) == 0.0


def test_the_informed_rule_trades_a_planted_drift_and_sits_out_none():
    """Tuned on the train window's drift; on a martingale it never trades (drift 0), on planted
    momentum it nets more than 0, and its expected net is at most the causal bound."""
    from jdqn.data.synth import synthetic_path

    for strength in (0.0, 0.3):
        path = synthetic_path(24_000, 3, strength)
        close, drift = path.bars.close, path.drift_points
        picked = baselines.tune_informed(close[:12_000], drift[:12_000], 0.3)
        held = baselines.band_positions(drift[12_000:] / picked["scale"], picked["band"])
        net = baselines.net_points(close[12_000:], held, 0.3)
        bound = baselines.causal_bound_points(drift[12_000:-1], 0.3)
        traded = np.abs(np.diff(np.concatenate([[0.0], held[:-1]])))
        expected = float(held[:-1] @ drift[12_000:-1] - 0.3 * traded.sum())
        if strength == 0.0:
            assert net == 0.0 and bound == 0.0
        else:
            assert net > 0.0 and 0.0 < expected <= bound
