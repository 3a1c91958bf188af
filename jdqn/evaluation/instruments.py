"""Instrument presets: contract specifications, costs, trading calendar, reward scale and C51
support for the markets users trade, picked with ``--instrument NAME`` (default ES).

A preset is a set of config values (:func:`instrument_overrides`) applied after the profile and
before the command's flags and ``--set`` overrides (which still win); ``config.json`` records the
resolved values. Contract specifications (tick size, point value) are the exchanges' published ones:

====== ============================================================ ===========================
name   specification                                                source
====== ============================================================ ===========================
ES     E-mini S&P 500: 0.25 index points = $12.50, $50 x index      CME Group contract specs
NQ     E-mini Nasdaq-100: 0.25 index points = $5.00, $20 x index    CME Group contract specs
CL     WTI crude oil: $0.01 per barrel = $10, 1,000 barrels         CME Group (NYMEX) specs
GC     Gold: $0.10 per troy ounce = $10, 100 troy ounces            CME Group (COMEX) specs
ZN     10-Year T-Note: 1/64 point (half of 1/32) = $15.625,         CME Group (CBOT) specs
       $1,000 per point ($100,000 face)
6E     Euro FX: $0.00005 per EUR = $6.25, 125,000 EUR               CME Group contract specs
EURUSD spot EUR/USD quoted to 5 decimals (0.00001, a "pipette");    ECN quoting convention
       one position unit = one standard lot of 100,000 EUR
BTCUSD spot BTC/USD(T): $0.01 tick, one position unit = 1 BTC       Binance BTCUSDT filters
====== ============================================================ ===========================

Costs are per side, in ticks: one tick of slippage (the spread of liquid futures) and a commission
of $2.50 per futures contract (retail all-in), $3.50 per EURUSD lot (ECN) and BTCUSD's 0.1 % taker
fee at $60,000 (6,000 ticks: re-set it at your price level; costs are per unit, not proportional).

The reward is ``reward_scale`` x net points, in a natural unit (points, cents, ticks, pips, $10).
The C51 support is ``v_max = -v_min = SUPPORT_IN_TYPICAL_MOVES x typical_move_points x
reward_scale`` (ES: +-240 points for its ~1 point mean absolute 1-minute change; ``jdqn data
check`` prints your data's), so every instrument's distributions have the same room for its moves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from jdqn.config import Config, DataConfig, apply_overrides

SUPPORT_IN_TYPICAL_MOVES = 240.0  # ES: +-240 points of support for a ~1 point typical move


@dataclass(frozen=True)
class Instrument:
    """One preset; prices in the instrument's quote unit ("points")."""

    name: str
    description: str
    tick_size: float  # points per tick
    point_value_usd: float  # dollars per point per position unit
    slippage_ticks: float  # per side
    commission_ticks: float  # per side
    calendar: str  # jdqn.data.calendars.CALENDARS key
    typical_move_points: float  # approximate mean |1-minute close change|
    reward_scale: float  # reward = reward_scale x net points
    reward_unit: str  # what one reward unit is

    @property
    def v_max(self) -> float:
        """Upper end of the C51 support, in reward units (module docstring)."""
        return round(SUPPORT_IN_TYPICAL_MOVES * self.typical_move_points * self.reward_scale, 6)


def _futures(
    name: str,
    description: str,
    tick: float,
    point_value: float,
    calendar: str,
    typical: float,
    scale: float,
    unit: str,
) -> Instrument:
    commission = round(2.50 / (tick * point_value), 6)  # $2.50 per side in ticks
    return Instrument(
        name, description, tick, point_value, 1.0, commission, calendar, typical, scale, unit
    )


INSTRUMENTS: dict[str, Instrument] = {
    i.name: i
    for i in (
        _futures("ES", "E-mini S&P 500 futures", 0.25, 50.0, "cme_equity", 1.0, 1.0, "points"),
        _futures("NQ", "E-mini Nasdaq-100 futures", 0.25, 20.0, "cme_equity", 4.0, 1.0, "points"),
        _futures("CL", "WTI crude oil futures", 0.01, 1000.0, "cme_energy", 0.04, 100.0, "cents"),
        _futures("GC", "Gold futures", 0.10, 100.0, "cme_metals", 0.6, 1.0, "dollars per ounce"),
        _futures(
            "ZN", "10-Year T-Note futures", 1 / 64, 1000.0, "cme_rates_fx", 0.02, 64.0, "ticks"
        ),
        _futures("6E", "Euro FX futures", 0.00005, 125_000.0, "cme_rates_fx", 8e-5, 1e4, "pips"),
        Instrument(
            "EURUSD",
            "EUR/USD spot, one standard lot (100,000 EUR) per position unit",
            tick_size=0.00001,
            point_value_usd=100_000.0,
            slippage_ticks=1.0,
            commission_ticks=3.5,
            calendar="fx_24x5",
            typical_move_points=8e-5,
            reward_scale=1e4,
            reward_unit="pips",
        ),
        Instrument(
            "BTCUSD",
            "BTC/USD spot, 1 BTC per position unit",
            tick_size=0.01,
            point_value_usd=1.0,
            slippage_ticks=1.0,
            commission_ticks=6000.0,
            calendar="crypto_24x7",
            typical_move_points=40.0,
            reward_scale=0.1,
            reward_unit="tens of dollars",
        ),
    )
}


def instrument(name: str) -> Instrument:
    """The preset called ``name`` (case-insensitive); unknown names raise with the valid ones."""
    for key, preset in INSTRUMENTS.items():
        if key.lower() == name.strip().lower():
            return preset
    raise ValueError(
        f"unknown instrument {name!r}; presets: {', '.join(INSTRUMENTS)} "
        "(another instrument: --set env.instrument=NAME and its env.*, network.v_min/v_max and "
        "data.calendar values)"
    )


def instrument_overrides(name: str) -> list[str]:
    """The preset as ``--set`` strings, in the order they apply."""
    preset = instrument(name)
    return [
        f"env.instrument={preset.name}",
        f"env.tick_size={preset.tick_size!r}",
        f"env.point_value_usd={preset.point_value_usd!r}",
        f"env.slippage_ticks={preset.slippage_ticks!r}",
        f"env.commission_ticks={preset.commission_ticks!r}",
        f"env.reward_scale={preset.reward_scale!r}",
        f"network.v_min={-preset.v_max!r}",
        f"network.v_max={preset.v_max!r}",
        f"data.calendar={preset.calendar}",
    ]


# Set only where rewards are in the instrument's own unit: with env.reward_unit=train_volatility
# a bar's reward is about +-1 whatever the instrument, and the profile's support already fits it.
_POINT_UNIT_KEYS = ("env.reward_scale=", "network.v_min=", "network.v_max=")


def apply_instrument(cfg: Config, name: str) -> Config:
    """``cfg`` with the preset's values (validated once, like any override). Its reward scale and
    support apply only where rewards are in points (``env.reward_unit=points``)."""
    overrides = instrument_overrides(name)
    if cfg.env.reward_unit != "points":
        overrides = [item for item in overrides if not item.startswith(_POINT_UNIT_KEYS)]
    return apply_overrides(cfg, overrides)


def data_settings(overrides: list[str], preset: Instrument) -> DataConfig:
    """The data section ``jdqn data check`` reads a file with: the preset's calendar, then
    ``data.*`` overrides (other sections do not change how a file is read)."""
    others = [item for item in overrides if not item.strip().startswith("data.")]
    if others:
        raise ValueError(
            f"--set {others[0]}: data check reads only data.* keys; fix: drop it or use data.*"
        )
    cfg = apply_overrides(Config(), [f"data.calendar={preset.calendar}", *overrides])
    return cfg.data


def describe_bar_file(
    path: str | os.PathLike[str], preset: Instrument, settings: DataConfig
) -> str:
    """Lines for ``jdqn data check``: the file's mean absolute 1-bar close change and the
    support the preset's rule would give it (the numbers a user-defined instrument needs), its
    bars and span, then how it was read (columns, zone assumed, calendar, interval, gaps, a
    notice for daily or irregular bars). ``settings``: the data section to read it with
    (:func:`data_settings`)."""
    from jdqn.data import read_bars
    from jdqn.data.intervals import describe_reading, reading_lines

    bars = read_bars(settings, path)
    reading = describe_reading(bars, settings, preset.name)
    move = float(np.mean(np.abs(np.diff(bars.close))))
    support = SUPPORT_IN_TYPICAL_MOVES * move * preset.reward_scale
    return (
        f"{path}: mean |1-bar close change| {move:.6g} points ({move / preset.tick_size:.3g} "
        f"ticks of {preset.tick_size:g}); at env.reward_scale={preset.reward_scale:g} the "
        f"{preset.name} rule gives network.v_max={support:.4g} (preset: {preset.v_max:g})\n"
        f"{path}: {len(bars):,} valid bars, {bars.timestamp[0]} .. {bars.timestamp[-1]}"
        + "".join(f"\n{path}: {line}" for line in reading_lines(reading))
    )
