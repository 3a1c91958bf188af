"""Bar files: load and validate 1-minute OHLCV bars of one futures contract.

:func:`load_bars` reads CSV (``.csv``, ``.txt``, optionally ``.gz``) or Parquet (``.parquet``,
``.pq``), maps vendor header names onto ``timestamp, open, high, low, close[, volume]``, parses the
usual vendor timestamp forms and rejects anything a backtest should not silently swallow. Every
rejection is a :class:`BarFileError` whose message is one line naming the file, the data row, the
column, the problem and the fix.

Timestamps come out as naive exchange-local time (America/Chicago). Gaps in the clock are legal
(minutes without a trade are simply absent in real data). One exception to strictly increasing
timestamps is tolerated in naive local time: the hour that repeats when daylight saving time ends
(01:00-02:00 on the autumn change), because a year of exchange-time bars cannot avoid it.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

EXCHANGE_TZ = "America/Chicago"

# Header aliases, compared after lower-casing and stripping spaces and <> (MetaStock style).
# The order of the timestamp aliases is the priority when several are present.
_TIMESTAMP_ALIASES = ("timestamp", "datetime", "date_time", "dt", "time", "date")
_COLUMN_ALIASES: dict[str, tuple[str, ...]] = {
    "open": ("open", "o"),
    "high": ("high", "h"),
    "low": ("low", "l"),
    "close": ("close", "c", "last"),
    "volume": ("volume", "vol", "v"),
}
_PRICE_COLUMNS = ("open", "high", "low", "close")

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
)
# Digit-only timestamps: compact calendar forms by length, anything else is a unix epoch.
_COMPACT_FORMATS = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
_AWARE_SUFFIX = re.compile(r"(?:Z|[+-]\d{2}:?\d{2})$", re.IGNORECASE)
_TIMESTAMP_FIX = (
    "write timestamps as 'YYYY-MM-DD HH:MM:SS' (exchange time) or ISO 8601 with a UTC offset, "
    "or as unix epoch seconds"
)


@dataclass(frozen=True, eq=False)  # eq=False: element-wise array equality has no single truth
class Bars:
    """A validated bar series, oldest first."""

    timestamp: np.ndarray  # [T] datetime64[ns], exchange local time (America/Chicago), naive
    open: np.ndarray  # [T] float64, index points
    high: np.ndarray  # [T] float64, index points
    low: np.ndarray  # [T] float64, index points
    close: np.ndarray  # [T] float64, index points
    volume: np.ndarray  # [T] float64, contracts (zeros when the source has no volume column)
    has_volume: bool = True

    def __post_init__(self) -> None:
        n = self.close.shape
        for name in ("timestamp", "open", "high", "low", "volume"):
            if getattr(self, name).shape != n or len(n) != 1:
                raise ValueError(f"Bars.{name}: shape {getattr(self, name).shape} != close {n}")

    def __len__(self) -> int:
        return int(self.close.shape[0])


class BarFileError(ValueError):
    """A bar file that cannot be used, with a one-line message saying where and how to fix it.

    Format: ``"<file>: row <r>, column '<c>': <problem>; fix: <what to do>"``, where ``r`` is the
    1-based data row (the header is not counted, so row r is line r + 1 of a CSV file) and the
    row and column parts are left out when the problem is not specific to them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        problem: str,
        fix: str,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        where = []
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column '{column}'")
        location = f"{', '.join(where)}: " if where else ""
        message = f"{os.fspath(path)}: {location}{problem}; fix: {fix}"
        super().__init__(" ".join(message.splitlines()))
        self.path = os.fspath(path)
        self.row = row
        self.column = column
        self.problem = problem
        self.fix = fix


def load_bars(path: str | os.PathLike[str], min_bars: int = 2) -> Bars:
    """Read, map, parse and validate a bar file; raise :class:`BarFileError` on any defect."""
    frame = _read_frame(path)
    columns = _map_columns(frame, path)
    local_ns, order_ns = _timestamps(frame, columns, path)
    prices = {name: _numeric(frame[columns[name]], path, columns[name]) for name in _PRICE_COLUMNS}
    has_volume = "volume" in columns
    volume = (
        _numeric(frame[columns["volume"]], path, columns["volume"])
        if has_volume
        else np.zeros(len(frame), np.float64)
    )
    _check_values(prices, volume, columns, path)
    _check_order(local_ns, order_ns, columns["timestamp"], path)
    if len(frame) < min_bars:
        raise BarFileError(
            path,
            f"the file has {len(frame)} bar(s) but at least {min_bars} are needed",
            "supply a longer bar file",
        )
    return Bars(
        timestamp=local_ns.astype("datetime64[ns]"),
        open=prices["open"],
        high=prices["high"],
        low=prices["low"],
        close=prices["close"],
        volume=volume,
        has_volume=has_volume,
    )


# ---------------------------------------------------------------------------------------------
# Reading


def _file_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith((".csv", ".txt", ".csv.gz", ".txt.gz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return None


def _read_frame(path: str | os.PathLike[str]) -> pd.DataFrame:
    p = Path(path)
    if not p.exists():
        raise BarFileError(
            path, "file does not exist", "check the path (or omit it for synthetic bars)"
        )
    if not p.is_file():
        raise BarFileError(path, "is not a regular file", "pass the path of a bar file")
    kind = _file_kind(p)
    if kind is None:
        raise BarFileError(
            path,
            f"unsupported file extension '{''.join(p.suffixes) or '(none)'}'",
            "use .csv, .txt, .csv.gz or .parquet/.pq",
        )
    try:
        frame = _read_csv(p) if kind == "csv" else _read_parquet(p)
    except BarFileError:
        raise
    except PermissionError:
        raise BarFileError(path, "permission denied", "make the file readable") from None
    except UnicodeDecodeError:
        raise BarFileError(
            path, "is not UTF-8 text", "save the file as UTF-8 CSV (or use Parquet)"
        ) from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        # gzip's own errors: cut short (a partial download or copy), damaged, or not gzip.
        detail = str(error).splitlines()[0].strip() if str(error) else type(error).__name__
        raise BarFileError(
            path,
            f"compressed file is truncated or corrupt ({detail})",
            "copy or download the file again (gzip -t checks it)",
        ) from None
    except pd.errors.EmptyDataError:
        raise BarFileError(path, "file is empty", "supply a file with a header and bars") from None
    except pd.errors.ParserError as error:
        detail = str(error).splitlines()[-1].strip()
        raise BarFileError(
            path,
            f"malformed CSV ({detail})",
            "give every line the same number of fields as the header",
        ) from None
    except (OSError, ValueError) as error:
        detail = str(error).splitlines()[0].strip() if str(error) else type(error).__name__
        raise BarFileError(path, f"cannot be read ({detail})", "check the file format") from None
    # Blank lines are kept as all-missing rows so row numbers match the file; trailing ones are
    # an editor's habit, not bars.
    filled = frame.notna().any(axis=1).to_numpy()
    last = int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0
    frame = frame.iloc[:last].reset_index(drop=True)
    if len(frame) == 0:
        raise BarFileError(path, "has a header but no bars", "supply a file with bars")
    return frame


def _read_csv(path: Path) -> pd.DataFrame:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig") as handle:
        header = handle.readline()
        sample = header + handle.readline()
    if not sample.strip():
        raise pd.errors.EmptyDataError
    # Vendors use ',' ';' tab or '|'; the header line tells which.
    separator = max((",", ";", "\t", "|"), key=header.count)
    if header.count(separator) == 0:
        separator = ","
    return pd.read_csv(
        path,
        sep=separator,
        skip_blank_lines=False,
        skipinitialspace=True,
        encoding="utf-8-sig",
        low_memory=False,
    )


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several unrelated types for a bad file
        detail = str(error).splitlines()[0].strip() if str(error) else type(error).__name__
        raise BarFileError(
            path, f"cannot be read as Parquet ({detail})", "write it with pandas or pyarrow"
        ) from None
    if not isinstance(frame.index, pd.RangeIndex):  # a timestamp index saved by pandas
        frame = frame.reset_index()
    return frame


# ---------------------------------------------------------------------------------------------
# Columns


def _header_key(name: object) -> str:
    key = str(name).strip().strip("<>").strip().lower()
    return re.sub(r"[\s\-]+", "_", key)


def _map_columns(frame: pd.DataFrame, path: str | os.PathLike[str]) -> dict[str, str]:
    """Role -> original column name. ``timestamp`` may be ``"Date+Time"`` (two columns)."""
    keys = {str(column): _header_key(column) for column in frame.columns}
    found = ", ".join(str(c) for c in frame.columns)
    no_header = not any(re.search("[a-z]", key) for key in keys.values())
    header_fix = "the file seems to have no header line; add 'timestamp,open,high,low,close,volume'"
    columns: dict[str, str] = {}
    for role, aliases in _COLUMN_ALIASES.items():
        matches = [column for column, key in keys.items() if key in aliases]
        if len(matches) > 1:
            raise BarFileError(
                path,
                f"columns {matches} all mean '{role}'",
                "keep one of them or rename the others",
                column=matches[1],
            )
        if matches:
            columns[role] = matches[0]
        elif role != "volume":
            raise BarFileError(
                path,
                f"missing required column (columns found: {found}; "
                f"accepted names, any case: {', '.join(aliases)})",
                header_fix if no_header else f"rename the {role} price column to '{role}'",
                column=role,
            )
    by_key = {key: column for column, key in reversed(keys.items())}
    for alias in ("timestamp", "datetime", "date_time", "dt"):
        if alias in by_key:
            columns["timestamp"] = by_key[alias]
            return columns
    if "date" in by_key and "time" in by_key:
        columns["timestamp"] = f"{by_key['date']}+{by_key['time']}"
        columns["_date"], columns["_time"] = by_key["date"], by_key["time"]
        return columns
    for alias in ("time", "date"):
        if alias in by_key:
            columns["timestamp"] = by_key[alias]
            return columns
    raise BarFileError(
        path,
        f"missing required column (columns found: {found}; accepted names, any case: "
        f"{', '.join(_TIMESTAMP_ALIASES)}, or a Date and a Time column)",
        header_fix if no_header else "name the bar time column 'timestamp'",
        column="timestamp",
    )


# ---------------------------------------------------------------------------------------------
# Timestamps


def _first(mask: np.ndarray) -> tuple[int, str]:
    """1-based row of the first True and a note on how many more there are."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) + 1, _more(len(hits) - 1)


def _more(count: int) -> str:
    return "" if count == 0 else f" (and {count} more row{'s' if count > 1 else ''})"


def _missing_mask(raw: pd.Series) -> np.ndarray:
    missing = raw.isna().to_numpy().copy()
    if not pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_datetime64_any_dtype(raw):
        missing |= raw.astype("string").str.strip().fillna("").eq("").to_numpy()
    return missing


def _timestamps(
    frame: pd.DataFrame, columns: dict[str, str], path: str | os.PathLike[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(local naive ns [T] int64, ordering key ns [T] int64: UTC instant when known)."""
    name = columns["timestamp"]
    if "_date" in columns:
        for part in (columns["_date"], columns["_time"]):
            missing = _missing_mask(frame[part])
            if missing.any():
                row, more = _first(missing)
                raise BarFileError(
                    path, f"timestamp is missing{more}", "fill in or delete the row", row, part
                )
        raw = _as_date_text(frame[columns["_date"]]) + " " + _as_time_text(frame[columns["_time"]])
    else:
        raw = frame[name]
    missing = _missing_mask(raw)
    if missing.any():
        row, more = _first(missing)
        raise BarFileError(
            path, f"timestamp is missing{more}", "fill in or delete the row", row, name
        )
    parsed = _parse_timestamps(raw, path, name)  # tz-aware UTC or naive local
    if parsed.dt.tz is not None:
        order_ns = parsed.dt.tz_convert("UTC").dt.tz_localize(None).astype("datetime64[ns]")
        local = parsed.dt.tz_convert(EXCHANGE_TZ).dt.tz_localize(None).astype("datetime64[ns]")
        return local.to_numpy().view(np.int64), order_ns.to_numpy().view(np.int64)
    local_ns = parsed.astype("datetime64[ns]").to_numpy().view(np.int64)
    return local_ns, local_ns


def _as_date_text(raw: pd.Series) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(raw):
        return raw.dt.strftime("%Y-%m-%d")
    if pd.api.types.is_numeric_dtype(raw):
        return raw.astype(np.int64).astype(str)
    return raw.astype("string").str.strip().astype(object)


def _as_time_text(raw: pd.Series) -> pd.Series:
    """Time-of-day as text; digit-only times (HHMM, HHMMSS, leading zeros lost) get colons."""
    text = (
        raw.astype(np.int64).astype(str)
        if pd.api.types.is_numeric_dtype(raw)
        else raw.astype("string").str.strip().astype(object).astype(str)
    )
    digits = text.str.fullmatch(r"\d{1,6}")
    if digits.all():
        width = 6 if text.astype(np.int64).max() > 2359 else 4
        text = text.str.zfill(width)
        text = (
            text.str.slice(0, 2)
            + ":"
            + text.str.slice(2, 4)
            + ((":" + text.str.slice(4, 6)) if width == 6 else "")
        )
    return text


def _parse_timestamps(raw: pd.Series, path: str | os.PathLike[str], column: str) -> pd.Series:
    if pd.api.types.is_datetime64_any_dtype(raw):
        return raw.reset_index(drop=True)
    if pd.api.types.is_bool_dtype(raw):
        raise BarFileError(path, "timestamps are true/false values", _TIMESTAMP_FIX, 1, column)
    if pd.api.types.is_numeric_dtype(raw):
        return _parse_digits(raw.to_numpy(np.float64), path, column)
    text = raw.astype("string").str.strip().astype(object).astype(str).reset_index(drop=True)
    if text.str.fullmatch(r"\d+").all():
        return _parse_digits(text.astype(np.float64).to_numpy(), path, column)
    aware = text.str.contains(_AWARE_SUFFIX).to_numpy()
    if aware.any() and not aware.all():
        row, more = _first(aware != aware[0])
        raise BarFileError(
            path,
            f"timestamp '{text.iloc[row - 1]}' mixes forms with and without a UTC offset{more}",
            "give every timestamp a UTC offset, or none (exchange time)",
            row,
            column,
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
    return _require_parsed(best, text, path, column)


def _require_parsed(
    parsed: pd.Series | None, text: pd.Series, path: str | os.PathLike[str], column: str
) -> pd.Series:
    bad = np.ones(len(text), bool) if parsed is None else parsed.isna().to_numpy()
    if bad.any():
        row, more = _first(bad)
        raise BarFileError(
            path,
            f"cannot parse timestamp '{text.iloc[row - 1]}'{more}",
            _TIMESTAMP_FIX,
            row,
            column,
        )
    assert parsed is not None
    return parsed


def _parse_digits(values: np.ndarray, path: str | os.PathLike[str], column: str) -> pd.Series:
    """Digit-only timestamps: YYYYMMDD[HHMM[SS]] by length, else unix epoch (s/ms/us/ns)."""
    whole = np.all(values == np.floor(values))
    if whole:
        digits = np.char.str_len(np.abs(values).astype(np.int64).astype(str))
        fmt = _COMPACT_FORMATS.get(int(digits[0])) if np.all(digits == digits[0]) else None
        if fmt is not None:
            text = pd.Series(values.astype(np.int64).astype(str))
            parsed = pd.to_datetime(text, format=fmt, errors="coerce")
            if not parsed.isna().any():
                return parsed
    magnitude = float(np.max(np.abs(values)))
    unit = (
        "s"
        if magnitude < 1e11
        else "ms"
        if magnitude < 1e14
        else "us"
        if magnitude < 1e17
        else "ns"
    )
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


# ---------------------------------------------------------------------------------------------
# Values


def _numeric(raw: pd.Series, path: str | os.PathLike[str], column: str) -> np.ndarray:
    """A column as float64 [T]; missing, NaN, non-numeric and infinite values are errors."""
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        values = raw.to_numpy(np.float64, na_value=np.nan)
    else:
        values = pd.to_numeric(raw, errors="coerce").to_numpy(np.float64, na_value=np.nan)
        non_numeric = np.isnan(values) & ~_missing_mask(raw)
        text = raw.astype("string").str.strip().astype(object).astype(str)
        non_numeric &= ~text.str.lower().isin(("nan", "-nan", "+nan")).to_numpy()
        if non_numeric.any():
            row, more = _first(non_numeric)
            raise BarFileError(
                path,
                f"'{text.iloc[row - 1]}' is not a number{more}",
                "write plain decimal numbers such as 1640.25 (no thousands separators or units)",
                row,
                column,
            )
    if np.isnan(values).any():
        row, more = _first(np.isnan(values))
        raise BarFileError(
            path, f"value is missing or NaN{more}", "fill in or delete the bar", row, column
        )
    if np.isinf(values).any():
        row, more = _first(np.isinf(values))
        raise BarFileError(
            path, f"value is infinite{more}", "replace it with the real value", row, column
        )
    return values.copy()  # pandas hands out read-only views


def _check_values(
    prices: dict[str, np.ndarray],
    volume: np.ndarray,
    columns: dict[str, str],
    path: str | os.PathLike[str],
) -> None:
    for name in _PRICE_COLUMNS:
        bad = prices[name] <= 0
        if bad.any():
            row, more = _first(bad)
            raise BarFileError(
                path,
                f"price {prices[name][row - 1]:g} is not positive{more}",
                "prices must be > 0 index points; correct or drop the bar",
                row,
                columns[name],
            )
    high, low = prices["high"], prices["low"]
    bad = high < low
    if bad.any():
        row, more = _first(bad)
        raise BarFileError(
            path,
            f"high {high[row - 1]:g} is below low {low[row - 1]:g}{more}",
            "check that the high and low columns are not swapped",
            row,
            columns["high"],
        )
    for name in ("open", "close"):
        value = prices[name]
        bad = (value < low) | (value > high)
        if bad.any():
            row, more = _first(bad)
            raise BarFileError(
                path,
                f"{name} {value[row - 1]:g} is outside the bar's range "
                f"[low {low[row - 1]:g}, high {high[row - 1]:g}]{more}",
                f"correct the bar so low <= {name} <= high",
                row,
                columns[name],
            )
    bad = volume < 0
    if bad.any():
        row, more = _first(bad)
        raise BarFileError(
            path,
            f"volume {volume[row - 1]:g} is negative{more}",
            "volume must be >= 0 contracts",
            row,
            columns["volume"],
        )


def _check_order(
    local_ns: np.ndarray, order_ns: np.ndarray, column: str, path: str | os.PathLike[str]
) -> None:
    """Timestamps strictly increase (naive exchange time may repeat the autumn DST hour)."""
    step = np.diff(order_ns)
    bad = np.flatnonzero(step <= 0) + 1  # 0-based index of the later bar
    if len(bad) and order_ns is local_ns:
        bad = bad[~_in_repeated_dst_hour(local_ns[bad - 1], local_ns[bad])]
    if len(bad) == 0:
        return
    i = int(bad[0])
    stamp, previous = str(pd.Timestamp(int(local_ns[i]))), str(pd.Timestamp(int(local_ns[i - 1])))
    more = _more(len(bad) - 1)
    if step[i - 1] == 0:
        raise BarFileError(
            path,
            f"duplicate timestamp {stamp} (same as row {i}){more}",
            "keep one bar per timestamp",
            i + 1,
            column,
        )
    raise BarFileError(
        path,
        f"timestamp {stamp} is earlier than row {i} ({previous}): timestamps decrease{more}",
        "sort the bars by time, oldest first",
        i + 1,
        column,
    )


def _in_repeated_dst_hour(earlier_ns: np.ndarray, later_ns: np.ndarray) -> np.ndarray:
    """True where both naive local times fall in the hour that repeats when DST ends."""

    def ambiguous(values_ns: np.ndarray) -> np.ndarray:
        index = pd.DatetimeIndex(values_ns.astype("datetime64[ns]"))
        n = len(index)
        summer = index.tz_localize(EXCHANGE_TZ, ambiguous=np.ones(n, bool), nonexistent="NaT")
        winter = index.tz_localize(EXCHANGE_TZ, ambiguous=np.zeros(n, bool), nonexistent="NaT")
        return (summer != winter) & ~summer.isna()

    return ambiguous(earlier_ns) & ambiguous(later_ns)
