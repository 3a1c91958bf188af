"""Which columns of a bar file hold the bar time, prices and volume.

Header names are compared lower-cased, stripped of ``<>`` (MetaTrader, MetaStock) and with spaces
and dashes as ``_``, so ``<DATE>``, ``Date`` and ``date`` are one name. Besides the generic names
the loader knows the headers of Binance klines (``open_time``, ms or us epoch; header-less files
get these names when read), Polygon.io (``t`` ms epoch, ``o h l c v``; flat files
``window_start``, ns epoch), Databento (``ts_event``, ns epoch or ISO 8601 UTC; fixed-point
prices in 1e-9 units are scaled), Dukascopy (``Gmt time``, UTC), CryptoDataDownload (``unix``
before ``date``; ``Volume BTC``), MetaTrader 4/5 (``<DATE> <TIME>``, ``<TICKVOL>``, ``<VOL>``)
and yfinance (``Datetime`` or ``Date``; ``Adj Close`` is ignored). ``data.columns`` maps anything
else and takes precedence over these names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from jdqn.data.bars.core import BarFileError

# The order of the timestamp aliases is the priority when several are present.
TIMESTAMP_ALIASES = ("timestamp", "datetime", "date_time", "dt")
EPOCH_ALIASES = ("open_time", "ts_event", "window_start", "unix", "unix_timestamp", "t")
UTC_ALIASES = ("gmt_time", "utc_time", "time_utc", "timestamp_utc")  # naive text, but UTC
COLUMN_ALIASES: dict[str, tuple[str, ...]] = {
    "open": ("open", "o"),
    "high": ("high", "h"),
    "low": ("low", "l"),
    "close": ("close", "c", "last"),
    "volume": ("volume", "vol", "v"),
}
# Volume columns taken when no exact alias is present, first match wins (CryptoDataDownload's
# "Volume BTC" is the base-asset volume; MetaTrader's tick volume when it has no real one).
_VOLUME_FALLBACK = re.compile(r"volume_.+|tickvol|tick_volume")
_SYMBOL_COLUMNS = ("symbol", "ticker", "instrument_id")
_NO_HEADER_FIX = "the file seems to have no header line; add 'timestamp,open,high,low,close,volume'"


@dataclass(frozen=True)
class ColumnMap:
    """Role -> column name of one file."""

    prices: dict[str, str]  # open, high, low, close [, volume] -> column
    timestamp: tuple[str, ...]  # the bar time column, or (date column, time column)
    utc: bool = False  # the header says naive times are UTC (Dukascopy's "Gmt time")

    @property
    def timestamp_name(self) -> str:
        return "+".join(self.timestamp)


def header_key(name: object) -> str:
    key = str(name).strip().strip("<>").strip().lower()
    return re.sub(r"[\s\-]+", "_", key)


def map_columns(
    frame: pd.DataFrame, path: str | os.PathLike[str], user: Mapping[str, str] | None = None
) -> ColumnMap:
    """The roles of ``frame``'s columns; ``user`` (``data.columns``) overrides the aliases."""
    user = dict(user or {})
    keys = {str(column): header_key(column) for column in frame.columns}
    found = ", ".join(str(c) for c in frame.columns)
    for role, column in user.items():
        if column not in keys:
            raise BarFileError(
                path,
                f"data.columns maps {role} to '{column}', which is not a column "
                f"(columns found: {found})",
                "correct data.columns (column names are case-sensitive)",
            )
    no_header = not any(re.search("[a-z]", key) for key in keys.values())

    def missing(role: str, accepted: str, fix: str) -> BarFileError:
        problem = f"missing required column (columns found: {found}; accepted names, any case: "
        fix = _NO_HEADER_FIX if no_header else fix
        return BarFileError(path, f"{problem}{accepted})", fix, column=role)

    prices: dict[str, str] = {}
    for role, aliases in COLUMN_ALIASES.items():
        if role in user:
            prices[role] = user[role]
            continue
        matches = [column for column, key in keys.items() if key in aliases]
        if role == "volume" and not matches:
            matches = [c for c, key in keys.items() if _VOLUME_FALLBACK.fullmatch(key)][:1]
        if len(matches) > 1:
            raise BarFileError(
                path,
                f"columns {matches} all mean '{role}'",
                "keep one of them, rename the others or name one in data.columns",
                column=matches[1],
            )
        if matches:
            prices[role] = matches[0]
        elif role != "volume":
            fix = f"rename the {role} price column to '{role}' or set data.columns={role}:NAME"
            raise missing(role, ", ".join(aliases), fix)
    timestamp, utc = _timestamp_columns(keys, user)
    if timestamp is None:
        names = ", ".join(TIMESTAMP_ALIASES + EPOCH_ALIASES + UTC_ALIASES)
        fix = "name the bar time column 'timestamp' or set data.columns=timestamp:NAME"
        raise missing("timestamp", f"{names}, time, date, or a Date and a Time column", fix)
    return ColumnMap(prices=prices, timestamp=timestamp, utc=utc)


def _timestamp_columns(
    keys: dict[str, str], user: dict[str, str]
) -> tuple[tuple[str, ...] | None, bool]:
    single = user.get("timestamp", user.get("time"))
    if "date" in user:
        return ((user["date"], single) if single else (user["date"],)), False
    if single is not None:  # a named column keeps its vendor's convention ("Gmt time": UTC)
        return (single,), header_key(single) in UTC_ALIASES
    by_key = {key: column for column, key in reversed(keys.items())}
    for alias in TIMESTAMP_ALIASES + EPOCH_ALIASES:
        if alias in by_key:
            return (by_key[alias],), False
    for alias in UTC_ALIASES:
        if alias in by_key:
            return (by_key[alias],), True
    if "date" in by_key and "time" in by_key:
        return (by_key["date"], by_key["time"]), False
    for alias in ("time", "date"):
        if alias in by_key:
            return (by_key[alias],), False
    return None, False


def check_one_symbol(frame: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """A file with several symbols (e.g. every ES contract month) is not one bar series."""
    for column in frame.columns:
        if header_key(column) not in _SYMBOL_COLUMNS:
            continue
        values = frame[column].dropna().astype(str).unique()
        if len(values) > 1:
            shown = ", ".join(sorted(values)[:4]) + (", ..." if len(values) > 4 else "")
            raise BarFileError(
                path,
                f"the file holds {len(values)} symbols ({shown})",
                "keep the rows of one symbol (or a continuous contract) in the file",
                column=str(column),
            )


def fixed_point_scale(frame: pd.DataFrame, columns: ColumnMap) -> float:
    """1e-9 for Databento files written with integer fixed-point prices, else 1."""
    if header_key(columns.timestamp[0]) != "ts_event":
        return 1.0
    close = pd.to_numeric(frame[columns.prices["close"]], errors="coerce")
    integral = bool((close.dropna() == close.dropna().round()).all())
    return 1e-9 if integral and close.median() > 1e6 else 1.0
