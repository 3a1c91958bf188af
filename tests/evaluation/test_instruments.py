"""Instrument presets and trading calendars: contract specs, costs, support rule, overrides,
calendar features by hand, and the CLI's --instrument."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import numpy as np
import pytest
from smoke import SMOKE

from jdqn import cli
from jdqn.config import DEFAULT, SMOKETEST, DataConfig, apply_overrides
from jdqn.config.sections import _CALENDAR_NAMES, EnvConfig
from jdqn.data import (
    bars_per_year,
    compute_features,
    load_source,
    prepare_walkforward,
    synthetic_bars,
)
from jdqn.data.calendars import CALENDARS, calendar_features
from jdqn.evaluation.env import cost_notices, make_params, reset, resolve_costs, step
from jdqn.evaluation.instruments import (
    INSTRUMENTS,
    apply_instrument,
    instrument,
    instrument_overrides,
)
from jdqn.run.walkforward import resolve_reward_unit

ES_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "es_2013-09_1min.csv"
# Dollar value of one tick per position unit, from the exchanges' contract specifications.
TICK_DOLLARS = {
    "ES": 12.50,
    "NQ": 5.00,
    "CL": 10.00,
    "GC": 10.00,
    "ZN": 15.625,
    "6E": 6.25,
    "EURUSD": 1.00,
    "BTCUSD": 0.01,
}


def test_the_table_holds_the_required_instruments_with_their_contract_specs():
    assert set(INSTRUMENTS) == set(TICK_DOLLARS)
    for name, preset in INSTRUMENTS.items():
        assert preset.tick_size * preset.point_value_usd == pytest.approx(TICK_DOLLARS[name])
        assert preset.calendar in CALENDARS
    for name in ("ES", "NQ", "CL", "GC", "ZN", "6E"):  # $2.50 per contract side, in dollars
        assert (INSTRUMENTS[name].commission_usd, INSTRUMENTS[name].commission_fraction) == (2.5, 0)
    assert INSTRUMENTS["EURUSD"].commission_usd == 3.5  # ECN, per lot side
    assert (INSTRUMENTS["BTCUSD"].commission_usd, INSTRUMENTS["BTCUSD"].commission_fraction) == (
        0,
        0.001,  # 0.1 % taker fee of notional
    )
    assert INSTRUMENTS["ZN"].tick_size == 1 / 64 and INSTRUMENTS["6E"].tick_size == 0.00005


def test_support_rule_by_hand():
    # v_max = 240 x typical 1-minute move x reward scale
    assert INSTRUMENTS["ES"].v_max == 240.0  # 240 x 1 point x 1
    assert INSTRUMENTS["CL"].v_max == 960.0  # 240 x $0.04 x 100 (cents)
    assert INSTRUMENTS["ZN"].v_max == 307.2  # 240 x 0.02 x 64 (ticks)
    assert INSTRUMENTS["EURUSD"].v_max == 192.0  # 240 x 0.00008 x 10,000 (pips)


def test_es_preset_is_what_the_profiles_already_hold():
    assert apply_instrument(SMOKETEST, "ES") == SMOKETEST
    assert apply_instrument(DEFAULT, "es") == DEFAULT


@pytest.mark.parametrize("name", list(INSTRUMENTS))
def test_each_preset_resolves_and_builds_its_features(name):
    in_points = apply_overrides(SMOKETEST, ["env.reward_unit=points"])
    cfg = apply_instrument(in_points, name)
    # In the profiles' volatility units the support and reward scale stay the profile's.
    volatility = apply_instrument(SMOKETEST, name)
    assert volatility.network == SMOKETEST.network and volatility.env.reward_scale == 1.0
    preset = INSTRUMENTS[name]
    assert cfg.env.instrument == name and cfg.env.tick_size == preset.tick_size
    assert cfg.env.point_value_usd == preset.point_value_usd
    assert cfg.env.cost_points == pytest.approx(  # before the reference price is set
        preset.slippage_ticks * preset.tick_size + preset.commission_usd / preset.point_value_usd
    )
    assert (cfg.network.v_min, cfg.network.v_max) == (-preset.v_max, preset.v_max)
    assert cfg.data.calendar == preset.calendar and cfg.env.reward_scale == preset.reward_scale
    features = compute_features(synthetic_bars(1_000, seed=1), cfg.data)
    assert np.isfinite(features.values).all()
    assert features.names[features.groups["calendar"][0]] == "tod_sin"


def test_unknown_instrument_names_the_presets():
    with pytest.raises(ValueError, match="unknown instrument 'XX'; presets: ES, NQ"):
        instrument("XX")


def test_cli_instrument_then_set_overrides(tmp_path, capsys):
    args = cli._build_parser().parse_args(
        [*SMOKE, "--instrument", "CL", "--set", "env.slippage_ticks=2"]
    )
    cfg = cli.resolve_config(args)
    assert cfg.env.instrument == "CL" and cfg.env.tick_size == 0.01
    assert cfg.env.slippage_ticks == 2.0 and cfg.network.v_max == SMOKETEST.network.v_max
    assert cli.main([*SMOKE, "--instrument", "XX", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jdqn: error: unknown instrument 'XX'") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []
    assert instrument_overrides("GC")[-1] == "data.calendar=cme_metals"


def test_data_check_reports_the_typical_move(capsys):
    assert cli.main(["data", "check", str(ES_SAMPLE), "--instrument", "ES"]) == 0
    first, costs, second, *reading = capsys.readouterr().out.splitlines()
    moves = np.abs(np.diff(load_source(DataConfig(path=str(ES_SAMPLE))).close))
    assert f"mean |1-bar close change| {moves.mean():.6g} points" in first
    assert f"network.v_max={240 * moves.mean():.4g} (preset: 240)" in first
    assert costs.endswith(
        "one round trip at the ES preset's costs is 0.6 points ($30.00); the median |1-bar close "
        "change| is 0.25 points"
    )
    assert second.endswith(
        ": 2,264 valid bars, 2013-09-01T17:00:00.000000000 .. 2013-09-03T13:51:00.000000000"
    )
    assert any(
        line.endswith(": calendar cme_equity (America/Chicago), instrument ES, bar interval 1 min")
        for line in reading
    )


# ---------------------------------------------------------------------------------------------
# Costs in the unit each market charges


def _preset_env(name: str, **changes) -> EnvConfig:
    return dataclasses.replace(apply_instrument(SMOKETEST, name).env, **changes)


def test_costs_per_side_by_hand():
    """Per unit and side, in points and dollars, from the exchanges' and venues' fees."""
    es = _preset_env("ES")  # 1 tick of 0.25 + $2.50 / $50 per point
    assert es.cost_points == pytest.approx(0.25 + 0.05) and es.cost_points * 50 == 15.0
    cl = _preset_env("CL")  # 1 tick ($10) + $2.50 = $12.50 = 0.0125 dollars per barrel
    assert cl.cost_points == pytest.approx(0.0125) and cl.cost_points * 1000 == pytest.approx(12.5)
    fx = _preset_env("EURUSD")  # 1 pipette ($1 a lot) + $3.50 a lot
    assert fx.cost_points * 100_000 == pytest.approx(4.5)
    # BTC at $6,332: 0.1 % of notional is $6.332, plus one $0.01 tick: $6.342, not the $60 a
    # fixed fee charged whatever the price (issue 48).
    btc = _preset_env("BTCUSD", cost_reference_price=6332.0)
    assert btc.cost_points == pytest.approx(6.342) and btc.point_value_usd == 1.0
    assert _preset_env("BTCUSD", cost_reference_price=60_000.0).cost_points == pytest.approx(60.01)


def test_the_notional_fee_is_charged_at_the_first_train_window_s_last_close():
    close = np.array([6000.0, 6200.0, 6332.0])
    btc = resolve_costs(_preset_env("BTCUSD"), close)
    assert btc.cost_reference_price == 6332.0 and resolve_costs(btc, close * 10) == btc
    assert resolve_costs(_preset_env("ES"), close) == _preset_env("ES")  # no fraction: no price
    with pytest.raises(ValueError, match="env.cost_reference_price"):
        resolve_costs(_preset_env("BTCUSD"), np.array([1.0, 0.0]))


def test_a_trade_in_the_env_pays_the_resolved_fee():
    env_cfg = _preset_env("BTCUSD", cost_reference_price=6332.0)
    params = make_params(np.zeros((3, 1)), np.array([6332.0, 6342.0, 6342.0]), env_cfg)
    _, state = reset(None, params)
    _, _, _, _, info = step(None, state, 2, params)  # flat -> long 1 BTC over +$10
    assert float(info["pnl_points"]) == pytest.approx(10.0)
    assert float(info["cost_points"]) == pytest.approx(6.342, rel=1e-6)


def test_a_notice_when_a_round_trip_costs_more_than_the_median_move():
    close = np.array([100.0, 100.5, 100.0, 101.0, 100.0])  # |moves| 0.5, 0.5, 1, 1: median 0.75
    cheap = EnvConfig(tick_size=0.25, point_value_usd=50.0, slippage_ticks=1.0, commission_ticks=0)
    assert cost_notices(cheap, close, []) == []  # 0.5 points a round trip
    dear = dataclasses.replace(cheap, slippage_ticks=2.0, commission_usd=2.5)  # 2 x 0.55 points
    (notice,) = cost_notices(dear, close, [])
    assert notice.startswith(
        "jdqn: notice: a round trip costs 1.1 points ($55.00 per unit), 1.47x the median "
        "|1-bar close change| of the first train window (0.75)"
    )
    btc = _preset_env("BTCUSD", cost_reference_price=100.0)  # 0.1 % of 100 x 2 < 0.75
    assert cost_notices(btc, close, [np.array([90.0, 150.0])]) == []
    (drift,) = cost_notices(btc, close, [np.array([90.0, 250.0])])
    assert "trade between 90 and 250: fees there are off by up to 2.5x" in drift


def test_the_walk_forward_records_the_price_and_warns(caplog):
    caplog.set_level(logging.INFO, logger="jdqn.run")
    cfg = apply_instrument(SMOKETEST, "BTCUSD")
    data = prepare_walkforward(load_source(cfg.data), cfg, source="synthetic")
    resolved = resolve_reward_unit(cfg, data)
    assert resolved.env.cost_reference_price == float(data.train[0].close[-1])
    assert resolved.env.cost_points == pytest.approx(0.01 + 0.001 * data.train[0].close[-1])
    # Synthetic ES-like bars: 0.1 % of ~1,800 points a side is many times the median move.
    round_trip = f"{2 * resolved.env.cost_points:.6g} points"
    (notice,) = [r.message for r in caplog.records if r.message.startswith("jdqn: notice")]
    assert notice.startswith(f"jdqn: notice: a round trip costs {round_trip}")


def test_config_keys_describe_the_instrument_s_units(capsys):
    assert cli.main(["config", "keys", "--instrument", "BTCUSD"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "dollars per bitcoin per tick (BTCUSD: 0.01)" in rows["env.tick_size"]
    assert "per side, a fraction of notional" in rows["env.commission_fraction"]
    assert "0.001" in rows["env.commission_fraction"] and "BTC" in rows["env.positions"]
    assert "index points" not in "".join(rows.values())


# ---------------------------------------------------------------------------------------------
# Calendars


def test_calendar_names_match_the_config_literal():
    assert set(typing.get_args(_CALENDAR_NAMES)) == set(CALENDARS)


def _stamps(*values: str) -> np.ndarray:
    return np.array(values, "datetime64[ns]")


def test_crypto_calendar_by_hand():
    # 2013-09-01 was a Sunday: weekday 6 of 0..6 -> 1.0; Monday 00:00 UTC -> 0.
    stamps = _stamps("2013-09-01T06:00", "2013-09-02T00:00")
    features = calendar_features(stamps, CALENDARS["crypto_24x7"])
    assert list(features) == ["tod_sin", "tod_cos", "day_of_week"]
    np.testing.assert_allclose(features["tod_sin"], [1.0, 0.0], atol=1e-12)  # 06:00 = quarter day
    np.testing.assert_array_equal(features["day_of_week"], [1.0, 0.0])


def test_fx_calendar_by_hand():
    # Sunday 17:00 New York opens Monday's FX day; 08:00-12:00 is the London/New York overlap.
    stamps = _stamps("2013-09-01T17:00", "2013-09-02T05:00", "2013-09-02T09:00", "2013-09-02T12:00")
    features = calendar_features(stamps, CALENDARS["fx_24x5"])
    np.testing.assert_allclose(features["session_progress"], [0.0, 0.5, 16 / 24, 19 / 24])
    np.testing.assert_array_equal(features["day_of_week"], [0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(features["is_rth"], [0, 0, 1, 0])
    np.testing.assert_allclose(features["rth_progress"], [0, 0, 0.25, 0])


def test_cme_day_sessions_by_hand():
    stamps = _stamps("2013-09-03T08:00", "2013-09-03T10:45", "2013-09-03T13:30")
    energy = calendar_features(stamps, CALENDARS["cme_energy"])  # CL 08:00-13:30 CT
    np.testing.assert_array_equal(energy["is_rth"], [1, 1, 0])
    np.testing.assert_allclose(energy["rth_progress"], [0, 165 / 330, 0])
    np.testing.assert_allclose(energy["session_progress"], [900 / 1380, 1065 / 1380, 1230 / 1380])


def test_bars_per_year_follows_the_calendar():
    stamps = np.arange(
        np.datetime64("2013-09-01T00:00"), np.datetime64("2013-09-03T00:00"), np.timedelta64(1, "m")
    ).astype("datetime64[ns]")
    assert bars_per_year(stamps, CALENDARS["crypto_24x7"]) == 1440 * 365


def test_bars_load_in_the_calendar_clock(tmp_path):
    path = tmp_path / "btc.csv"
    path.write_text("timestamp,o,h,l,c\n1378072800,1,2,1,1.5\n1378072860,1,2,1,1.5\n")
    utc = load_source(DataConfig(path=str(path), calendar="crypto_24x7"))
    np.testing.assert_array_equal(utc.timestamp, _stamps("2013-09-01T22:00", "2013-09-01T22:01"))
    chicago = load_source(DataConfig(path=str(path)))
    np.testing.assert_array_equal(
        chicago.timestamp, _stamps("2013-09-01T17:00", "2013-09-01T17:01")
    )


def test_data_check_reads_with_data_settings(tmp_path, capsys):
    path = tmp_path / "odd.csv"
    path.write_text(
        "ts,first,max,min,last_trade\n2013-09-01 22:00,1,2,1,1.5\n2013-09-01 22:01,1,2,1,1.25\n"
    )
    assert cli.main(["data", "check", str(path)]) == 2
    assert "set data.columns=open:NAME" in capsys.readouterr().err
    columns = "data.columns=time:ts,open:first,high:max,low:min,close:last_trade"
    argv = ["data", "check", str(path), "--set", columns, "--set", "data.timezone=UTC"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert ": 2 valid bars, 2013-09-01T17:00:00.000000000 .. 2013-09-01T17:01:00.000000000\n" in out
    assert ": timestamps: UTC (data.timezone)\n" in out
    assert "columns timestamp=ts, open=first, high=max, low=min, close=last_trade" in out
    assert cli.main(["data", "check", str(path), "--set", "train.epochs=2"]) == 2
    assert "reads only data.* keys" in capsys.readouterr().err
