"""Reading a bar file into a raw frame: CSV layouts vendors write, gzip, Parquet.

A CSV's layout is sniffed from its first lines (:func:`sniff_layout`): the separator (``,`` ``;``
tab or ``|``), a preamble before the header (a vendor's URL or disclaimer, ``#`` comments: any
lines narrower than the table), decimal commas (``1640,25`` in a ``;`` or tab separated file),
yfinance's three-line header (``Price`` / ``Ticker`` / ``Datetime``) and the header-less files of
Binance (12 kline fields) and MetaTrader 4 (``2013.09.01,17:00,o,h,l,c[,v]``), which get their
vendor's column names.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from jdqn.data.bars.core import BarFileError, error_detail

_SEPARATORS = (",", ";", "\t", "|")
_SAMPLE_LINES = 64
# Binance kline files (data.binance.vision) have no header; these are the documented fields.
BINANCE_KLINE_COLUMNS = (
    "open_time",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "close_time",
    "quote_volume",
    "count",
    "taker_buy_volume",
    "taker_buy_quote_volume",
    "ignore",
)
_METATRADER_COLUMNS = ("date", "time", "open", "high", "low", "close", "volume")
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")
_MT_DATE, _MT_TIME = re.compile(r"\d{4}\.\d{2}\.\d{2}"), re.compile(r"\d{1,2}:\d{2}(:\d{2})?")


@dataclass(frozen=True)
class CsvLayout:
    """How a CSV file is laid out, as sniffed from its first lines."""

    separator: str
    header_line: int  # 0-based line of the header; the lines before it are a preamble
    decimal: str  # "." or ","
    names: tuple[str, ...] | None = None  # column names of a header-less vendor file
    extra_header_lines: int = 0  # lines after the header that are not bars (yfinance)
    first_column: str | None = None  # name for the first column (yfinance: "Datetime")

    @property
    def first_bar_line(self) -> int:
        """The 1-based file line of the first bar (data row 1)."""
        if self.names is not None:  # header-less: the "header" line is the first bar
            return self.header_line + 1
        return self.header_line + 2 + self.extra_header_lines


def file_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith((".csv", ".txt", ".csv.gz", ".txt.gz")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    return None


def read_frame(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, CsvLayout | None]:
    """The file as a frame of raw columns (and the CSV layout; None for Parquet)."""
    p = Path(path)
    if not p.exists():
        raise BarFileError(
            path, "file does not exist", "check the path (or omit it for synthetic bars)"
        )
    if not p.is_file():
        raise BarFileError(path, "is not a regular file", "pass the path of a bar file")
    kind = file_kind(p)
    if kind is None:
        raise BarFileError(
            path,
            f"unsupported file extension '{''.join(p.suffixes) or '(none)'}'",
            "use .csv, .txt, .csv.gz or .parquet/.pq",
        )
    layout: CsvLayout | None = None
    try:
        if kind == "csv":
            layout = sniff_layout(_sample_lines(p))
            frame = _read_csv(p, layout)
        else:
            frame = _read_parquet(p)
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
        raise BarFileError(
            path,
            f"compressed file is truncated or corrupt ({error_detail(error)})",
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
        raise BarFileError(
            path, f"cannot be read ({error_detail(error)})", "check the file format"
        ) from None
    # Blank lines are kept as all-missing rows so row numbers match the file; trailing ones are
    # an editor's habit, not bars.
    filled = frame.notna().any(axis=1).to_numpy()
    last = int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0
    frame = frame.iloc[:last].reset_index(drop=True)
    if len(frame) == 0:
        raise BarFileError(path, "has a header but no bars", "supply a file with bars")
    return frame, layout


def _sample_lines(path: Path) -> list[str]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig", newline="") as handle:
        return [line.rstrip("\r\n") for line in itertools.islice(handle, _SAMPLE_LINES)]


def sniff_layout(lines: list[str]) -> CsvLayout:
    """Separator, header line, decimal mark and vendor shape from the first lines of a CSV."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if not filled:
        raise pd.errors.EmptyDataError
    candidates = []
    for order, separator in enumerate(_SEPARATORS):
        widths = {i: lines[i].count(separator) + 1 for i in filled}
        counts = Counter(widths[i] for i in filled[1:] or filled)
        width = max(counts, key=lambda w: (counts[w], w))  # the commonest body width, wider first
        header = next(i for i in filled if widths[i] == width) if width > 1 else filled[0]
        candidates.append((-width, header, order, separator))
    _, header, _, separator = min(candidates)

    def split(line: str) -> list[str]:
        return [field.strip().strip('"') for field in line.split(separator)]

    fields = split(lines[header])
    body = [split(lines[i]) for i in filled if i > header]
    comma = any(_DECIMAL_COMMA.fullmatch(field) for row in body for field in row)
    decimal = "," if separator != "," and comma else "."
    if not any(re.search("[A-Za-z]", field) for field in fields):
        if len(fields) == len(BINANCE_KLINE_COLUMNS) and fields[0].isdigit():
            return CsvLayout(separator, header, decimal, BINANCE_KLINE_COLUMNS)
        if (
            len(fields) in (6, 7)
            and _MT_DATE.fullmatch(fields[0])
            and _MT_TIME.fullmatch(fields[1])
        ):
            names = _METATRADER_COLUMNS[: len(fields)]
            return CsvLayout(separator, header, decimal, names)
    if fields[0].lower() == "price" and body and body[0][0].lower() == "ticker":
        # yfinance >= 0.2.51: "Price,Close,...", "Ticker,ES=F,...", "Datetime,,,..." then bars.
        named = len(body) > 1 and not any(body[1][1:])
        extra, first = (2, body[1][0]) if named else (1, "Datetime")
        return CsvLayout(separator, header, decimal, extra_header_lines=extra, first_column=first)
    return CsvLayout(separator, header, decimal)


def _read_csv(path: Path, layout: CsvLayout) -> pd.DataFrame:
    skip = list(range(layout.header_line))
    if layout.names is None:  # else header-less: the "header" line is the first bar
        skip += range(layout.header_line + 1, layout.header_line + 1 + layout.extra_header_lines)
    frame = pd.read_csv(
        path,
        sep=layout.separator,
        skiprows=skip,
        header=None if layout.names is not None else 0,
        names=list(layout.names) if layout.names is not None else None,
        decimal=layout.decimal,
        skip_blank_lines=False,
        skipinitialspace=True,
        encoding="utf-8-sig",
        low_memory=False,
        dtype=str if layout.decimal == "," else None,
    )
    if layout.first_column is not None:
        frame = frame.rename(columns={frame.columns[0]: layout.first_column})
    if layout.decimal == ",":  # numbers with a decimal comma; timestamps stay text
        frame = frame.apply(_decimal_comma_column)
    return frame


def _decimal_comma_column(column: pd.Series) -> pd.Series:
    text = column.astype("string").str.strip()
    filled = text.dropna()
    if filled.str.contains(",").any() and filled.str.fullmatch(r"[+-]?\d+(,\d+)?").all():
        return text.str.replace(",", ".", regex=False).astype("Float64").astype(float)
    return column


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_parquet(path)
    except Exception as error:  # pyarrow raises several unrelated types for a bad file
        raise BarFileError(
            path,
            f"cannot be read as Parquet ({error_detail(error)})",
            "write it with pandas or pyarrow",
        ) from None
    if isinstance(frame.index, pd.DatetimeIndex) and frame.index.name is None:
        frame = frame.rename_axis("timestamp")  # pandas' default to_parquet of a time index
    if not isinstance(frame.index, pd.RangeIndex):  # a timestamp index saved by pandas
        frame = frame.reset_index()
    return frame
