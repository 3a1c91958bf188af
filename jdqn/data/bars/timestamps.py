"""Bar times: the timestamp forms vendors write, unix epochs and time zones.

Forms tried: ISO 8601 (with or without a UTC offset), US slashes, compact ``YYYYMMDD[ HHMM[SS]]``,
dotted ``YYYY.MM.DD`` (MetaTrader) and ``DD.MM.YYYY`` (Dukascopy), split date and time columns
(digit-only times ``830`` / ``170000`` get their colons back) and unix epochs in s, ms, us or ns,
told apart by magnitude. Epochs and offsets are instants (UTC); naive times are wall-clock times.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import numpy as np
import pandas as pd

from jdqn.data.bars.columns import ColumnMap
from jdqn.data.bars.core import BarFileError, error_detail, reject_rows

# Naive timestamp formats tried in order; the first that parses every row wins. Day-first slash
# dates (DD/MM/YYYY) are deliberately absent: they are ambiguous with the US form for days <= 12.
_NAIVE_FORMATS = (
    "ISO8601",
    "%m/%d/%Y %H:%M:%S",
    "%m/%d/%Y %H:%M",
    "%m/%d/%Y %H:%M:%S.%f",
    "%m/%d/%Y %I:%M:%S %p",
    "%m/%d/%Y %I:%M %p",
    "%Y%m%d %H%M%S",
    "%Y%m%d %H%M",
    "%Y%m%d %H:%M:%S",
    "%Y%m%d %H:%M",
    "%Y/%m/%d %H:%M:%S",
    "%Y/%m/%d %H:%M",
    "%Y.%m.%d %H:%M:%S",
    "%Y.%m.%d %H:%M",
    "%d.%m.%Y %H:%M:%S.%f",
    "%d.%m.%Y %H:%M:%S",
    "%d.%m.%Y %H:%M",
    "%m/%d/%Y",
    "%Y-%m-%d %I-%p",  # CryptoDataDownload hourly files: 2019-10-17 09-AM
)
# Digit-only timestamps: compact calendar forms by length, anything else is a unix epoch.
_COMPACT_FORMATS = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
_AWARE_SUFFIX = re.compile(r"(?:Z|[+-]\d{2}:?\d{2})$", re.IGNORECASE)
_MISSING_FIX = "fill in or delete the row"
_TIMESTAMP_FIX = (
    "write timestamps as 'YYYY-MM-DD HH:MM:SS' (exchange time) or ISO 8601 with a UTC offset, "
    "or as unix epoch seconds"
)


class BarTimes(NamedTuple):
    """A file's bar times, in file order."""

    local_ns: np.ndarray  # [T] int64, naive exchange time
    order_ns: np.ndarray  # [T] int64, the UTC instant when known, else local_ns itself
    written: np.ndarray  # [T] str, as written in the file
    zone: str  # how the times were read, e.g. "UTC (data.timezone)"


def as_text(raw: pd.Series) -> pd.Series:
    """Each cell as stripped text, as messages quote it."""
    return raw.astype("string").str.strip().astype(object).astype(str)


def missing_mask(raw: pd.Series) -> np.ndarray:
    missing = raw.isna().to_numpy().copy()
    if not pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_datetime64_any_dtype(raw):
        missing |= raw.astype("string").str.strip().fillna("").eq("").to_numpy()
    return missing


def parse_bar_times(
    frame: pd.DataFrame,
    columns: ColumnMap,
    path: str | os.PathLike[str],
    timezone: str | None,
    exchange_timezone: str,
    timestamp_format: str | None = None,
) -> BarTimes:
    """The bars' times (:class:`BarTimes`), the arguments as :func:`~jdqn.data.load_bars`
    takes them: aware timestamps (UTC offsets, epochs, aware Parquet columns) are converted to
    ``exchange_timezone``; naive ones are in ``timezone``, in UTC where the header says so."""
    name = columns.timestamp_name
    if len(columns.timestamp) == 2:
        for part in columns.timestamp:
            reject_rows(missing_mask(frame[part]), path, "timestamp is missing", _MISSING_FIX, part)
        date, time = (frame[c] for c in columns.timestamp)
        raw = _as_date_text(date) + " " + _as_time_text(time)
    else:
        raw = frame[columns.timestamp[0]]
    reject_rows(missing_mask(raw), path, "timestamp is missing", _MISSING_FIX, name)
    written = raw.astype(str).to_numpy()
    if timestamp_format is None:
        parsed = _parse_timestamps(raw, path, name)  # tz-aware UTC or naive
    else:
        parsed = _parse_with_format(raw, timestamp_format, path, name)
    source = timezone or ("UTC" if columns.utc else None)
    if parsed.dt.tz is not None:
        zone = "UTC (the file's offsets or epochs)"
    elif timezone is not None:
        zone = f"{timezone} (data.timezone)"
    elif columns.utc:
        zone = f"UTC (the header '{name}' says so)"
    else:
        zone = f"{exchange_timezone} (naive times taken as the calendar's; else set data.timezone)"
    if parsed.dt.tz is None and source is not None and source != exchange_timezone:
        parsed = _localise(parsed, source, path, name)
    if parsed.dt.tz is None:
        local_ns = _ns(parsed)
        return BarTimes(local_ns, local_ns, written, zone)  # one array: the order is local
    naive = parsed.dt.tz_convert(exchange_timezone).dt.tz_localize(None)
    utc_ns = _ns(parsed.dt.tz_convert("UTC").dt.tz_localize(None))
    return BarTimes(_ns(naive), utc_ns, written, zone)


def _parse_with_format(
    raw: pd.Series, timestamp_format: str, path: str | os.PathLike[str], column: str
) -> pd.Series:
    """Timestamps in the user's strftime format (``%z`` in it: aware, converted to UTC)."""
    text = as_text(raw).reset_index(drop=True)
    aware = "%z" in timestamp_format or "%Z" in timestamp_format
    parsed = pd.to_datetime(text, format=timestamp_format, errors="coerce", utc=aware)
    reject_rows(
        parsed.isna().to_numpy(),
        path,
        "timestamp '{text}' does not match data.timestamp_format="
        + timestamp_format.replace("{", "{{").replace("}", "}}"),
        "correct data.timestamp_format (strftime codes, e.g. %Y-%m-%d %I-%p) or the timestamp",
        column,
        text=text,
    )
    return parsed


def _ns(times: pd.Series) -> np.ndarray:
    return times.astype("datetime64[ns]").to_numpy().view(np.int64)


def _localise(parsed: pd.Series, zone: str, path: str | os.PathLike[str], column: str) -> pd.Series:
    """Naive times read as wall-clock times of ``zone`` (the repeated DST hour by row order)."""
    try:
        return parsed.dt.tz_localize(zone, ambiguous="infer", nonexistent="raise")
    except Exception as error:  # pytz/zoneinfo raise several types for impossible local times
        raise BarFileError(
            path,
            f"timestamps are not valid wall-clock times in data.timezone={zone} "
            f"({error_detail(error)})",
            "check data.timezone, or write the timestamps in UTC or with a UTC offset",
            column=column,
        ) from None


def _as_date_text(raw: pd.Series) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(raw):
        return raw.dt.strftime("%Y-%m-%d")
    if pd.api.types.is_numeric_dtype(raw):
        return raw.astype(np.int64).astype(str)
    return raw.astype("string").str.strip().astype(object)


def _as_time_text(raw: pd.Series) -> pd.Series:
    """Time-of-day as text; digit-only times (HHMM, HHMMSS, leading zeros lost) get colons."""
    text = raw.astype(np.int64).astype(str) if pd.api.types.is_numeric_dtype(raw) else as_text(raw)
    digits = text.str.fullmatch(r"\d{1,6}")
    if digits.all():
        width = 6 if text.astype(np.int64).max() > 2359 else 4
        text = text.str.zfill(width)
        seconds = (":" + text.str.slice(4, 6)) if width == 6 else ""
        text = text.str.slice(0, 2) + ":" + text.str.slice(2, 4) + seconds
    return text


def _parse_timestamps(raw: pd.Series, path: str | os.PathLike[str], column: str) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(raw):
        return raw.reset_index(drop=True)
    if pd.api.types.is_bool_dtype(raw):
        raise BarFileError(path, "timestamps are true/false values", _TIMESTAMP_FIX, 1, column)
    if pd.api.types.is_numeric_dtype(raw):
        return _parse_digits(raw.to_numpy(), path, column)
    text = as_text(raw).reset_index(drop=True)
    if text.str.fullmatch(r"\d+").all():
        exact = bool(text.str.len().max() <= 18)  # int64 holds 18 digits
        numbers = text.astype(np.int64 if exact else np.float64).to_numpy()
        return _parse_digits(numbers, path, column)
    aware = text.str.contains(_AWARE_SUFFIX).to_numpy()
    if aware.any():
        reject_rows(
            aware != aware[0],
            path,
            "timestamp '{text}' mixes forms with and without a UTC offset",
            "give every timestamp a UTC offset, or none (exchange time)",
            column,
            text=text,
        )
    if aware.all():
        parsed = pd.to_datetime(text, format="ISO8601", utc=True, errors="coerce")
        return _require_parsed(parsed, text, path, column)
    best: pd.Series | None = None
    first = pd.Series(text.iloc[:1])
    for fmt in _NAIVE_FORMATS:
        if pd.to_datetime(first, format=fmt, errors="coerce").isna().iloc[0]:
            continue
        parsed = pd.to_datetime(text, format=fmt, errors="coerce")
        if not parsed.isna().any():
            return parsed
        if best is None or parsed.isna().sum() < best.isna().sum():
            best = parsed
    if best is not None:  # each row in its own form: a vendor that changed forms part-way
        for fmt in _NAIVE_FORMATS:  # (CryptoDataDownload: "2020-04-13 20:00:00", "... 09-AM")
            missing = best.isna()
            if not missing.any():
                break
            best[missing] = pd.to_datetime(text[missing], format=fmt, errors="coerce")
    return _require_parsed(best, text, path, column)


def _require_parsed(
    parsed: pd.Series | None, text: pd.Series, path: str | os.PathLike[str], column: str
) -> pd.Series:
    bad = np.ones(len(text), bool) if parsed is None else parsed.isna().to_numpy()
    reject_rows(bad, path, "cannot parse timestamp '{text}'", _TIMESTAMP_FIX, column, text=text)
    assert parsed is not None
    return parsed


def _parse_digits(values: np.ndarray, path: str | os.PathLike[str], column: str) -> pd.Series:
    """Digit-only timestamps: YYYYMMDD[HHMM[SS]] by length, else a unix epoch whose unit (s, ms,
    us or ns) follows from its magnitude: seconds up to 1e11 (year 5138), ms up to 1e14, us up to
    1e17, ns beyond. Integers stay int64 so that ns epochs keep their last digits."""
    if values.dtype.kind not in "iu":
        values = values.astype(np.float64)
    whole = values.dtype.kind in "iu" or bool(np.all(values == np.floor(values)))
    if whole:
        integers = values.astype(np.int64)
        digits = np.char.str_len(np.abs(integers).astype(str))
        fmt = _COMPACT_FORMATS.get(int(digits[0])) if np.all(digits == digits[0]) else None
        if fmt is not None:
            text = pd.Series(integers.astype(str))
            parsed = pd.to_datetime(text, format=fmt, errors="coerce")
            if not parsed.isna().any():
                return parsed
        values = integers
    magnitude = float(np.max(np.abs(values)))
    limits = (("s", 1e11), ("ms", 1e14), ("us", 1e17))
    unit = next((unit for unit, limit in limits if magnitude < limit), "ns")
    try:
        return pd.Series(pd.to_datetime(values, unit=unit, utc=True))
    except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime):
        raise BarFileError(
            path,
            f"numeric timestamps (e.g. {values[0]:.0f}) are not a date or unix epoch",
            _TIMESTAMP_FIX,
            1,
            column,
        ) from None
