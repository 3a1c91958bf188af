"""Checks of a bar series' values and order, and the newest-first files that are turned round."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from jdqn.data.bars.core import PRICE_COLUMNS, BarFileError, more_rows, reject_rows
from jdqn.data.bars.timestamps import as_text, missing_mask

# Above any traded instrument's price in index points (BTCUSD ~1e5): a scaled or corrupt column,
# and prices near float32's range (3.4e38) overflow the features.
MAX_PRICE = 1e9
_LISTED_ROWS = 5  # rows named in a duplicate message before "and N more"


def numeric(raw: pd.Series, path: str | os.PathLike[str], column: str) -> np.ndarray:
    """A column as float64 [T]; missing, NaN, non-numeric and infinite values are errors."""
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        values = raw.to_numpy(np.float64, na_value=np.nan)
    else:
        values = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        non_numeric = np.isnan(values) & ~missing_mask(raw)
        text = as_text(raw)
        non_numeric &= ~text.str.lower().isin(("nan", "-nan", "+nan")).to_numpy()
        reject_rows(
            non_numeric,
            path,
            "'{text}' is not a number",
            "write plain decimal numbers such as 1640.25 (no thousands separators or units)",
            column,
            text=text,
        )
    reject_rows(
        np.isnan(values), path, "value is missing or NaN", "fill in or delete the bar", column
    )
    reject_rows(
        np.isinf(values), path, "value is infinite", "replace it with the real value", column
    )
    return values.copy()  # pandas hands out read-only views


def check_values(
    prices: dict[str, np.ndarray],
    volume: np.ndarray,
    columns: dict[str, str],
    path: str | os.PathLike[str],
) -> None:
    """Positive prices up to :data:`MAX_PRICE`, low <= open, close <= high, and volume >= 0."""
    for name in PRICE_COLUMNS:
        reject_rows(
            prices[name] <= 0,
            path,
            "price {price:g} is not positive",
            "prices must be > 0 index points; correct or drop the bar",
            columns[name],
            price=prices[name],
        )
        reject_rows(
            prices[name] > MAX_PRICE,
            path,
            "price {price:g} is above " + f"{MAX_PRICE:g}",
            "no instrument trades there (float32 features would lose it); check the column",
            columns[name],
            price=prices[name],
        )
    high, low = prices["high"], prices["low"]
    reject_rows(
        high < low,
        path,
        "high {high:g} is below low {low:g}",
        "check that the high and low columns are not swapped",
        columns["high"],
        high=high,
        low=low,
    )
    for name in ("open", "close"):
        reject_rows(
            (prices[name] < low) | (prices[name] > high),
            path,
            name + " {value:g} is outside the bar's range [low {low:g}, high {high:g}]",
            f"correct the bar so low <= {name} <= high",
            columns[name],
            value=prices[name],
            low=low,
            high=high,
        )
    reject_rows(
        volume < 0,
        path,
        "volume {volume:g} is negative",
        "volume must be >= 0 contracts",
        columns.get("volume"),  # absent: volume is zeros
        volume=volume,
    )


def newest_first(order_ns: np.ndarray) -> bool:
    """True when the file lists the newest bar first: more steps back in time than forward
    (so a short stretch of repeated rows in a newest-first file is reported where it is, and the
    repeated autumn DST hour of naive local time counts as the one step it is)."""
    step = np.diff(order_ns)
    back = int(np.count_nonzero(step < 0))
    return back >= 2 and back > int(np.count_nonzero(step > 0))


def check_order(
    local_ns: np.ndarray,
    order_ns: np.ndarray,
    written: np.ndarray,
    rows: np.ndarray,
    column: str,
    path: str | os.PathLike[str],
    exchange_timezone: str,
    unit: str = "row",
) -> None:
    """Timestamps strictly increase (naive exchange time may repeat the autumn DST hour).

    ``rows`` [T] are the bars' 1-based file lines (``unit`` "line") or data rows (descending
    for a newest-first file) and ``written`` [T] their timestamps as written, so a message names
    what a user finds in the file: every duplicate, or the stretch that overlaps earlier bars
    (two downloads joined end to end, a few rows repeated).
    """
    step = np.diff(order_ns)
    bad = np.flatnonzero(step <= 0) + 1  # 0-based index of the later bar
    if len(bad) and order_ns is local_ns:
        bad = bad[~_in_repeated_dst_hour(local_ns[bad - 1], local_ns[bad], exchange_timezone)]
    if len(bad) == 0:
        return
    i = int(bad[0])
    stamp, previous = f"'{written[i]}'", f"'{written[i - 1]}'"
    if step[i - 1] == 0:
        others = [int(rows[k]) for k in bad[1:] if step[k - 1] == 0]
        listed = ", ".join(str(r) for r in others[:_LISTED_ROWS])
        if len(others) > _LISTED_ROWS:
            listed += f" and {len(others) - _LISTED_ROWS} more"
        raise BarFileError(
            path,
            f"duplicate timestamp {stamp} (same as {unit} {rows[i - 1]})"
            + (f"; more duplicates at {unit}s {listed}" if others else ""),
            "keep one bar per timestamp",
            int(rows[i]),
            column,
            unit,
        )
    start = int(np.searchsorted(order_ns[:i], order_ns[i], side="left"))  # first overlapped bar
    after = np.flatnonzero(order_ns[i:] > order_ns[i - 1])
    end = i + int(after[0]) - 1 if len(after) else len(order_ns) - 1  # last overlapping bar
    raise BarFileError(
        path,
        f"timestamp {stamp} is earlier than {unit} {rows[i - 1]} ({previous}): timestamps "
        f"decrease; the stretch {_span(rows[i], rows[end], unit)} overlaps "
        f"{_span(rows[start], rows[i - 1], unit)}{more_rows(len(bad) - 1)}",
        "sort the bars by time, oldest first, and drop the repeated stretch",
        int(rows[i]),
        column,
        unit,
    )


def _span(a: int, b: int, unit: str) -> str:
    low, high = sorted((int(a), int(b)))
    return f"{unit} {low}" if low == high else f"{unit}s {low}-{high}"


def _in_repeated_dst_hour(earlier_ns: np.ndarray, later_ns: np.ndarray, zone: str) -> np.ndarray:
    """True where both naive local times fall in the hour that repeats when DST ends."""

    def ambiguous(values_ns: np.ndarray) -> np.ndarray:
        index = pd.DatetimeIndex(values_ns.astype("datetime64[ns]"))
        n = len(index)
        summer = index.tz_localize(zone, ambiguous=np.ones(n, bool), nonexistent="NaT")
        winter = index.tz_localize(zone, ambiguous=np.zeros(n, bool), nonexistent="NaT")
        return (summer != winter) & ~summer.isna()

    return ambiguous(earlier_ns) & ambiguous(later_ns)
