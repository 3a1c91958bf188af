"""Malformed bar files and the message each must produce (shared by the data and CLI tests).

Each case is ``(case id, CSV text, expected message substring)`` and is self-contained: write the
text to a file named ``<case id>.csv`` (see :func:`write_case`) and load it. Lines in messages are
the file's 1-based lines (the header is line 1).
"""

from __future__ import annotations

from pathlib import Path

HEADER = "timestamp,open,high,low,close,volume\n"
ROW1 = "2013-09-01 17:00:00,1640.25,1641.00,1639.00,1639.75,3940\n"
ROW2 = "2013-09-01 17:01:00,1640.00,1640.50,1639.50,1640.00,1105\n"
ROW3 = "2013-09-01 17:02:00,1639.75,1640.75,1639.50,1640.50,467\n"

MALFORMED_CASES: list[tuple[str, str, str]] = [
    ("empty_file", "", "file is empty"),
    ("header_only", HEADER, "has a header but no bars"),
    (
        "missing_close_column",
        "timestamp,open,high,low,volume\n"
        "2013-09-01 17:00:00,1,2,1,5\n2013-09-01 17:01:00,1,2,1,5\n",
        "column 'close': missing required column (columns found: timestamp, open, high, low, "
        "volume; accepted names, any case: close, c, last)",
    ),
    (
        "missing_timestamp_column",
        "open,high,low,close\n1,2,1,1\n1,2,1,1\n",
        "column 'timestamp': missing required column",
    ),
    ("no_header_line", ROW1 + ROW2 + ROW3, "the file seems to have no header line"),
    (
        "ambiguous_close_columns",
        "timestamp,open,high,low,close,last\n2013-09-01 17:00:00,1,2,1,1,1\n",
        "columns ['close', 'last'] all mean 'close'",
    ),
    (
        "ragged_row",
        HEADER + ROW1 + ROW2.rstrip("\n") + ",99\n" + ROW3,
        "malformed CSV",
    ),
    (
        "unparseable_timestamp",
        HEADER + ROW1 + ROW2.replace("17:01:00", "25:01:00") + ROW3,
        "line 3, column 'timestamp': cannot parse timestamp '2013-09-01 25:01:00'",
    ),
    (
        "missing_timestamp",
        HEADER + ROW1 + ROW2.replace("2013-09-01 17:01:00", "") + ROW3,
        "line 3, column 'timestamp': timestamp is missing",
    ),
    (
        "mixed_utc_offsets",
        HEADER + ROW1.replace(":00,", ":00Z,", 1) + ROW2 + ROW3,
        "line 3, column 'timestamp': timestamp '2013-09-01 17:01:00' mixes forms with and without",
    ),
    (
        "duplicate_timestamp",
        HEADER + ROW1 + ROW2 + ROW3.replace("17:02:00", "17:01:00"),
        "line 4, column 'timestamp': duplicate timestamp '2013-09-01 17:01:00' (same as line 3)",
    ),
    (
        "decreasing_timestamp",
        HEADER + ROW1 + ROW3 + ROW2,
        "line 4, column 'timestamp': timestamp '2013-09-01 17:01:00' is earlier than line 3",
    ),
    (
        "nan_price",
        HEADER + ROW1 + ROW2.replace(",1640.00,1105", ",NaN,1105") + ROW3,
        "line 3, column 'close': value is missing or NaN",
    ),
    (
        "empty_price",
        HEADER + ROW1 + ROW2.replace(",1640.50,", ",,") + ROW3,
        "line 3, column 'high': value is missing or NaN",
    ),
    (
        "infinite_price",
        HEADER + ROW1 + ROW2 + ROW3.replace(",1639.75,", ",inf,"),
        "line 4, column 'open': value is infinite",
    ),
    (
        "non_numeric_price",
        HEADER + ROW1.replace(",1639.00,", ",1639.OO,") + ROW2 + ROW3,
        "line 2, column 'low': '1639.OO' is not a number",
    ),
    (
        "non_positive_price",
        HEADER + ROW1 + ROW2.replace(",1639.50,", ",0,") + ROW3,
        "line 3, column 'low': price 0 is not positive",
    ),
    (
        "high_below_low",
        HEADER + ROW1 + ROW2 + ROW3.replace("1640.75,1639.50", "1639.50,1640.75"),
        "line 4, column 'high': high 1639.5 is below low 1640.75",
    ),
    (
        "open_outside_range",
        HEADER + ROW1.replace("1640.25", "1641.25") + ROW2 + ROW3,
        "line 2, column 'open': open 1641.25 is outside the bar's range [low 1639, high 1641]",
    ),
    (
        "close_outside_range",
        HEADER + ROW1 + ROW2.replace(",1640.00,1105", ",1638.00,1105") + ROW3,
        "line 3, column 'close': close 1638 is outside the bar's range",
    ),
    (
        "negative_volume",
        HEADER + ROW1 + ROW2.replace(",1105", ",-5") + ROW3,
        "line 3, column 'volume': volume -5 is negative",
    ),
    (
        "missing_volume_value",
        HEADER + ROW1 + ROW2 + ROW3.replace(",467", ","),
        "line 4, column 'volume': value is missing or NaN",
    ),
    ("too_few_bars", HEADER + ROW1, "the file has 1 bar(s) but at least 2 are needed"),
]


def case(case_id: str) -> tuple[str, str, str]:
    """The case with this id."""
    for item in MALFORMED_CASES:
        if item[0] == case_id:
            return item
    raise KeyError(f"no malformed case {case_id!r}; ids: {[c[0] for c in MALFORMED_CASES]}")


def write_case(directory: str | Path, case_id: str) -> Path:
    """Write case ``case_id`` to ``directory/<case_id>.csv`` and return the path."""
    _, content, _ = case(case_id)
    path = Path(directory) / f"{case_id}.csv"
    path.write_text(content, encoding="utf-8")
    return path
