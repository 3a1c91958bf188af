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

Costs are per side, in the unit each market charges: one tick of slippage (the spread of liquid
futures and spot), plus a commission of $2.50 per futures contract (retail all-in) and $3.50 per
EURUSD lot (ECN), or, for BTCUSD, the 0.1 % taker fee as a fraction of notional, charged at
``env.cost_reference_price`` (0: the first train window's last close, so that no later price is
used; a run over prices that move far from it says so).

The reward is ``reward_scale`` x net points, in a natural unit (points, cents, ticks, pips, $10).
The C51 support is ``v_max = -v_min = SUPPORT_IN_TYPICAL_MOVES x typical_move_points x
reward_scale`` (ES: +-240 points for its ~1 point mean absolute 1-minute change; ``jdqn data
check`` prints your data's), so every instrument's distributions have the same room for its moves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from jdqn.config import Config, DataConfig, apply_overrides
from jdqn.evaluation.env import resolve_costs

SUPPORT_IN_TYPICAL_MOVES = 240.0  # ES: +-240 points of support for a ~1 point typical move


@dataclass(frozen=True)
class Instrument:
    """One preset; prices in the instrument's quote unit ("points")."""

    name: str
    description: str
    tick_size: float  # points per tick
    point_value_usd: float  # dollars per point per position unit
    calendar: str  # jdqn.data.calendars.CALENDARS key
    typical_move_points: float  # approximate mean |1-minute close change|
    reward_scale: float  # reward = reward_scale x net points
    reward_unit: str  # what one reward unit is
    price_unit: str  # what one point is ("index points", "dollars per bitcoin")
    position_unit: str  # what one position unit is ("contract", "BTC")
    slippage_ticks: float = 1.0  # per side
    commission_usd: float = 0.0  # per side, dollars per position unit
    commission_fraction: float = 0.0  # per side, of notional

    @property
    def v_max(self) -> float:
        """Upper end of the C51 support, in reward units (module docstring)."""
        return round(SUPPORT_IN_TYPICAL_MOVES * self.typical_move_points * self.reward_scale, 6)


def _futures(*spec: Any) -> Instrument:
    return replace(Instrument(*spec), commission_usd=2.50)  # $2.50 per contract per side


INSTRUMENTS: dict[str, Instrument] = {
    i.name: i
    for i in (
        _futures(
            "ES", "E-mini S&P 500 futures", 0.25, 50.0, "cme_equity", 1.0, 1.0, "points",
            "index points", "contract",
        ),
        _futures(
            "NQ", "E-mini Nasdaq-100 futures", 0.25, 20.0, "cme_equity", 4.0, 1.0, "points",
            "index points", "contract",
        ),
        _futures(
            "CL", "WTI crude oil futures", 0.01, 1000.0, "cme_energy", 0.04, 100.0, "cents",
            "dollars per barrel", "contract (1,000 barrels)",
        ),
        _futures(
            "GC", "Gold futures", 0.10, 100.0, "cme_metals", 0.6, 1.0, "dollars per ounce",
            "dollars per troy ounce", "contract (100 troy ounces)",
        ),
        _futures(
            "ZN", "10-Year T-Note futures", 1 / 64, 1000.0, "cme_rates_fx", 0.02, 64.0, "ticks",
            "points of par", "contract ($100,000 face)",
        ),
        _futures(
            "6E", "Euro FX futures", 0.00005, 125_000.0, "cme_rates_fx", 8e-5, 1e4, "pips",
            "dollars per euro", "contract (125,000 EUR)",
        ),
        Instrument(
            "EURUSD", "EUR/USD spot, one standard lot (100,000 EUR) per position unit",
            0.00001, 100_000.0, "fx_24x5", 8e-5, 1e4, "pips",
            "dollars per euro", "lot (100,000 EUR)", commission_usd=3.50,
        ),
        Instrument(
            "BTCUSD", "BTC/USD spot, 1 BTC per position unit",
            0.01, 1.0, "crypto_24x7", 40.0, 0.1, "tens of dollars",
            "dollars per bitcoin", "BTC", commission_fraction=0.001,
        ),
    )
}  # fmt: skip


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


def unit_descriptions(preset: Instrument) -> dict[str, str]:
    """The env keys' descriptions in the preset's own units (``jdqn config keys --instrument``)."""
    tick, unit, per = preset.tick_size, preset.price_unit, preset.position_unit
    return {
        "env.positions": f"action i -> target position, in units of one {per}",
        "env.tick_size": f"{unit} per tick ({preset.name}: {tick:g})",
        "env.point_value_usd": f"dollars a move of 1 ({unit}) makes per position unit, one {per}",
        "env.slippage_ticks": f"per side, in ticks of {tick:g} {unit} "
        f"(${tick * preset.point_value_usd:,.6g} per {per})",
        "env.commission_ticks": "per side, in ticks (the presets charge commission_usd or "
        "commission_fraction instead)",
        "env.commission_usd": f"per side, dollars per {per}",
        "env.commission_fraction": f"per side, a fraction of notional (price in {unit} x "
        f"${preset.point_value_usd:,.6g} x position; 0.001 = 0.1 %)",
        "env.cost_reference_price": f"price ({unit}) at which commission_fraction is charged; "
        "0: the first fold's train window's last close, set by the walk-forward",
        "env.reward_scale": f"reward = price points ({unit}) x reward_scale",
    }


def instrument_overrides(name: str) -> list[str]:
    """The preset as ``--set`` strings, in the order they apply."""
    preset = instrument(name)
    return [
        f"env.instrument={preset.name}",
        f"env.tick_size={preset.tick_size!r}",
        f"env.point_value_usd={preset.point_value_usd!r}",
        f"env.slippage_ticks={preset.slippage_ticks!r}",
        "env.commission_ticks=0.0",
        f"env.commission_usd={preset.commission_usd!r}",
        f"env.commission_fraction={preset.commission_fraction!r}",
        "env.cost_reference_price=0.0",
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
    """Two lines for ``jdqn data check``: the file's mean absolute 1-bar close change and the
    support the preset's rule would give it (the numbers a user-defined instrument needs), then
    its bars and span. ``settings``: the data section to read it with (:func:`data_settings`)."""
    from jdqn.data import load_bars
    from jdqn.data.calendars import CALENDARS

    bars = load_bars(
        path,
        columns=settings.column_map,
        timezone=settings.timezone,
        exchange_timezone=CALENDARS[settings.calendar].timezone,
    )
    changes = np.abs(np.diff(bars.close))
    move, median = float(np.mean(changes)), float(np.median(changes))
    support = SUPPORT_IN_TYPICAL_MOVES * move * preset.reward_scale
    preset_env = apply_overrides(Config(), instrument_overrides(preset.name)).env
    env = resolve_costs(preset_env, bars.close)
    round_trip = 2 * env.cost_points
    at_close = " at its last close" if env.commission_fraction else ""
    return (
        f"{path}: mean |1-bar close change| {move:.6g} points ({move / preset.tick_size:.3g} "
        f"ticks of {preset.tick_size:g}); at env.reward_scale={preset.reward_scale:g} the "
        f"{preset.name} rule gives network.v_max={support:.4g} (preset: {preset.v_max:g})\n"
        f"{path}: one round trip at the {preset.name} preset's costs is {round_trip:.6g} points "
        f"(${round_trip * env.point_value_usd:,.2f}){at_close}; the median |1-bar close change| "
        f"is {median:.6g} points\n"
        f"{path}: {len(bars):,} valid bars, {bars.timestamp[0]} .. {bars.timestamp[-1]}"
    )
