"""Vendor bar files: preambles, newest-first rows, epochs, vendor headers, decimal commas, gzip,
``data.columns`` / ``data.timezone``, and one-line messages for duplicates and overlaps."""

from __future__ import annotations

import contextlib
import gzip
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from jdqn.config import SMOKETEST, DataConfig, apply_overrides
from jdqn.data import BarFileError, load_bars, load_source

# 2013-09-01 22:00 UTC = 17:00 CDT (America/Chicago, UTC-5), the Sunday Globex open.
EPOCH_S = 1_378_072_800
CHICAGO = np.array(["2013-09-01T17:00", "2013-09-01T17:01", "2013-09-01T17:02"], "datetime64[ns]")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _assert_bars(bars, close=(1.5, 1.25, 1.75), stamps=CHICAGO):
    np.testing.assert_array_equal(bars.timestamp, stamps[: len(close)])
    np.testing.assert_array_equal(bars.close, close)


def _message(path: Path, **kwargs) -> str:
    with pytest.raises(BarFileError) as info:
        load_bars(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and "; fix: " in message
    return message


@contextlib.contextmanager
def _notices() -> Iterator[list[str]]:
    """Messages of the loader's logger at INFO and above (the CLI's ``jdqn`` logger may not
    propagate to pytest's root handler, so they are collected where they are logged)."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, handler = logging.getLogger("jdqn.data"), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_cryptodatadownload_preamble_newest_first_unix_ms(tmp_path):
    ms = [(EPOCH_S + 60 * i) * 1000 for i in range(3)]
    text = (
        "https://www.CryptoDataDownload.com\n"
        "unix,date,symbol,open,high,low,close,Volume BTC,Volume USDT,tradecount\n"
        f"{ms[2]},2013-09-01 22:02:00,BTC/USDT,1,2,1,1.75,7,70,3\n"
        f"{ms[1]},2013-09-01 22:01:00,BTC/USDT,1,2,1,1.25,6,60,2\n"
        f"{ms[0]},2013-09-01 22:00:00,BTC/USDT,1,2,1,1.5,5,50,1\n"
    )
    with _notices() as messages:
        bars = load_bars(_write(tmp_path, "Binance_BTCUSDT_minute.csv", text))
    _assert_bars(bars)
    np.testing.assert_array_equal(bars.volume, [5, 6, 7])  # "Volume BTC", the base asset
    notices = [message for message in messages if "newest first" in message]
    assert len(notices) == 1 and "sorted oldest first" in notices[0]
    assert any("skipped 1 line(s) before the header" in message for message in messages)


def test_comment_preamble_and_gzip(tmp_path):
    text = (
        "# exported by some terminal\n# symbol ES, 1 minute\n\n"
        "timestamp,open,high,low,close\n"
        "2013-09-01 17:00,1,2,1,1.5\n2013-09-01 17:01,1,2,1,1.25\n2013-09-01 17:02,1,2,1,1.75\n"
    )
    path = tmp_path / "bars.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(text)
    _assert_bars(load_bars(path))


def test_binance_klines_headerless_ms_and_us(tmp_path):
    for unit, factor in (("ms", 1_000), ("us", 1_000_000)):
        rows = [
            f"{(EPOCH_S + 60 * i) * factor},1,2,1,{c},10,{(EPOCH_S + 60 * i + 59) * factor},"
            "100,5,4,40,0\n"
            for i, c in enumerate((1.5, 1.25, 1.75))
        ]
        bars = load_bars(_write(tmp_path, f"BTCUSDT-1m-{unit}.csv", "".join(rows)))
        _assert_bars(bars)
        np.testing.assert_array_equal(bars.volume, [10, 10, 10])


def test_binance_klines_with_header(tmp_path):
    text = "open_time,open,high,low,close,volume,close_time,quote_volume,count\n" + "".join(
        f"{(EPOCH_S + 60 * i) * 1000},1,2,1,{c},3,{(EPOCH_S + 60 * i) * 1000 + 59_999},9,1\n"
        for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "klines.csv", text)))


def test_epoch_units_by_magnitude(tmp_path):
    for unit, factor in (("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9)):
        text = "timestamp,open,high,low,close\n" + "".join(
            f"{(EPOCH_S + 60 * i) * factor},1,2,1,{c}\n" for i, c in enumerate((1.5, 1.25, 1.75))
        )
        _assert_bars(load_bars(_write(tmp_path, f"epoch_{unit}.csv", text)))


def test_polygon_aggregates_and_flat_files(tmp_path):
    aggregates = "v,vw,o,c,h,l,t,n\n" + "".join(
        f"10,1.4,1,{c},2,1,{(EPOCH_S + 60 * i) * 1000},4\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "polygon.csv", aggregates)))
    flat = "ticker,volume,open,close,high,low,window_start,transactions\n" + "".join(
        f"X:BTCUSD,10,1,{c},2,1,{(EPOCH_S + 60 * i) * 10**9},4\n"
        for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "polygon_flat.csv", flat)))


def test_databento_ts_event_fixed_point_and_pretty(tmp_path):
    header = "ts_event,rtype,publisher_id,instrument_id,open,high,low,close,volume,symbol\n"
    fixed = header + "".join(
        f"{(EPOCH_S + 60 * i) * 10**9},33,1,5002,1640250000000,1641000000000,1639000000000,"
        f"{c},12,ESZ3\n"
        for i, c in enumerate((1639750000000, 1640000000000, 1640500000000))
    )
    bars = load_bars(_write(tmp_path, "glbx-mdp3.ohlcv-1m.csv", fixed))
    _assert_bars(bars, close=(1639.75, 1640.0, 1640.5))
    assert bars.high[0] == 1641.0
    pretty = header + "".join(
        f"2013-09-01T22:0{i}:00.000000000Z,33,1,5002,1,2,1,{c},12,ESZ3\n"
        for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "pretty.csv", pretty)))


def test_several_symbols_are_refused(tmp_path):
    text = (
        "ts_event,open,high,low,close,symbol\n"
        f"{EPOCH_S}000000000,1,2,1,1.5,ESU3\n{EPOCH_S}000000000,1,2,1,1.5,ESZ3\n"
    )
    message = _message(_write(tmp_path, "all_months.csv", text))
    assert "column 'symbol': the file holds 2 symbols (ESU3, ESZ3)" in message


def test_dukascopy_gmt_time_is_utc(tmp_path):
    text = "Gmt time,Open,High,Low,Close,Volume\n" + "".join(
        f"01.09.2013 22:0{i}:00.000,1,2,1,{c},1.5\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "EURUSD_Candlestick_1_M_BID.csv", text)))


def test_metatrader_export_and_headerless_mt4(tmp_path):
    text = "<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>\n" + "".join(
        f"2013.09.01\t17:0{i}:00\t1\t2\t1\t{c}\t33\t0\t2\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    bars = load_bars(_write(tmp_path, "ES_M1.txt", text))
    _assert_bars(bars)
    np.testing.assert_array_equal(bars.volume, [0, 0, 0])  # <VOL> is the real volume column
    headerless = "".join(
        f"2013.09.01,17:0{i},1,2,1,{c},33\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    bars = load_bars(_write(tmp_path, "ES1.csv", headerless))
    _assert_bars(bars)
    np.testing.assert_array_equal(bars.volume, [33, 33, 33])


def test_yfinance_classic_and_multi_line_header(tmp_path):
    classic = "Datetime,Open,High,Low,Close,Adj Close,Volume\n" + "".join(
        f"2013-09-01 17:0{i}:00-05:00,1,2,1,{c},9.9,0\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    _assert_bars(load_bars(_write(tmp_path, "yf.csv", classic)))
    multi = (
        "Price,Adj Close,Close,High,Low,Open,Volume\n"
        "Ticker,ES=F,ES=F,ES=F,ES=F,ES=F,ES=F\n"
        "Datetime,,,,,,\n"
        + "".join(
            f"2013-09-01 22:0{i}:00+00:00,9.9,{c},2,1,1,0\n"
            for i, c in enumerate((1.5, 1.25, 1.75))
        )
    )
    _assert_bars(load_bars(_write(tmp_path, "yf_multi.csv", multi)))


def test_decimal_commas_with_semicolons_and_split_date_time(tmp_path):
    text = "Date;Time;Open;High;Low;Close;Volume\n" + "".join(
        f"2013-09-01;17:0{i};1,5;2,25;1;{c};3\n" for i, c in enumerate(("1,5", "1,25", "1,75"))
    )
    bars = load_bars(_write(tmp_path, "de.csv", text))
    _assert_bars(bars)
    np.testing.assert_array_equal(bars.high, [2.25, 2.25, 2.25])


def test_user_column_map_and_timezone(tmp_path):
    text = "ts,first,max,min,last_trade,qty\n" + "".join(
        f"2013-09-01 22:0{i},1,2,1,{c},4\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    path = _write(tmp_path, "odd.csv", text)
    assert "column 'open': missing required column" in _message(path)
    mapping = {
        "time": "ts",
        "open": "first",
        "high": "max",
        "low": "min",
        "close": "last_trade",
        "volume": "qty",
    }
    _assert_bars(load_bars(path, columns=mapping, timezone="UTC"))
    # The same wall-clock times read as London time (BST, UTC+1) are one hour earlier in UTC.
    london = load_bars(path, columns=mapping, timezone="Europe/London")
    _assert_bars(london, stamps=CHICAGO - np.timedelta64(1, "h"))
    assert "data.columns maps close to 'Close'" in _message(
        path, columns={**mapping, "close": "Close"}
    )
    # Through the config, as --set data.columns=... --set data.timezone=UTC gives it.
    cfg = apply_overrides(
        SMOKETEST,
        [
            f"data.path={path}",
            "data.columns=time:ts,open:first,high:max,low:min,close:last_trade,volume:qty",
            "data.timezone=UTC",
        ],
    )
    _assert_bars(load_source(cfg.data))


def test_split_date_and_time_through_the_column_map(tmp_path):
    text = "d,clock,o,h,l,c\n" + "".join(
        f"20130901,170{i},1,2,1,{c}\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    bars = load_bars(_write(tmp_path, "split.csv", text), columns={"date": "d", "time": "clock"})
    _assert_bars(bars)


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (["data.columns=price:x"], "data.columns: 'price:x' is not role:column"),
        (["data.columns=close:a,close:b"], "data.columns: a role repeats"),
        (["data.columns=time:a,timestamp:b"], "timestamp or as time, not both"),
        (["data.timezone=Mars/Olympus"], "data.timezone: unknown time zone 'Mars/Olympus'"),
    ],
)
def test_column_map_and_timezone_are_validated(item, expected):
    with pytest.raises(ValueError, match=expected):
        apply_overrides(SMOKETEST, item)
    assert DataConfig(columns=("close:Last ",)).column_map == {"close": "Last"}


ROW = "2013-09-01 17:{m:02d},1,2,1,1.5\n"


def test_duplicates_are_listed_with_their_rows(tmp_path):
    minutes = [0, 1, 1, 2, 3, 3, 4]
    text = "timestamp,o,h,l,c\n" + "".join(ROW.format(m=m) for m in minutes)
    message = _message(_write(tmp_path, "dup.csv", text))
    assert (
        "line 4, column 'timestamp': duplicate timestamp '2013-09-01 17:01' (same as line 3); "
        "more duplicates at lines 7; fix: keep one bar per timestamp"
    ) in message


def test_overlapping_stretch_is_named(tmp_path):
    minutes = [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]  # a second download starting at 17:02 appended
    text = "timestamp,o,h,l,c\n" + "".join(ROW.format(m=m) for m in minutes)
    message = _message(_write(tmp_path, "joined.csv", text))
    assert (
        "line 7, column 'timestamp': timestamp '2013-09-01 17:02' is earlier than line 6 "
        "('2013-09-01 17:04'): timestamps decrease; the stretch lines 7-9 overlaps lines 4-6"
    ) in message


def test_newest_first_duplicates_name_file_rows(tmp_path):
    minutes = [4, 3, 2, 2, 1, 0]
    text = "timestamp,o,h,l,c\n" + "".join(ROW.format(m=m) for m in minutes)
    message = _message(_write(tmp_path, "desc_dup.csv", text))
    assert (
        "line 4, column 'timestamp': duplicate timestamp '2013-09-01 17:02' (same as line 5)"
        in (message)
    )


def test_config_roles_are_the_loaders_roles():
    from jdqn.config.sections import COLUMN_ROLES
    from jdqn.data.bars.columns import COLUMN_ALIASES

    assert set(COLUMN_ROLES) == {"timestamp", "time", "date", *COLUMN_ALIASES}


def test_cryptodatadownload_hourly_dates(tmp_path):
    # CryptoDataDownload's hourly files write "2019-10-17 09-AM" beside the unix column; without
    # it the date column alone is parsed (UTC, read as such through data.timezone).
    text = "date,symbol,open,high,low,close\n" + "".join(
        f"2013-09-01 {h:02d}-{p},BTC/USD,1,2,1,{c}\n"
        for h, p, c in ((12, "AM", 1.5), (1, "AM", 1.25), (2, "AM", 1.75))  # 12-AM: midnight
    )
    bars = load_bars(_write(tmp_path, "Bitstamp_BTCUSD_1h.csv", text), timezone="UTC")
    hours = np.array(["2013-08-31T19", "2013-08-31T20", "2013-08-31T21"], "datetime64[ns]")
    _assert_bars(bars, stamps=hours)
    # Their newer rows switched to "2013-09-01 02:00:00": each row is read in its own form.
    mixed = text.replace("2013-09-01 02-AM", "2013-09-01 02:00:00")
    bars = load_bars(_write(tmp_path, "mixed.csv", mixed), timezone="UTC")
    _assert_bars(bars, stamps=hours)


def test_timestamp_format_escape_hatch(tmp_path):
    text = "when,open,high,low,close\n" + "".join(
        f"01|09|13 17h0{i},1,2,1,{c}\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    path = _write(tmp_path, "odd.csv", text)
    assert "cannot parse timestamp '01|09|13 17h00'" in _message(
        path, columns={"timestamp": "when"}
    )
    settings = {"columns": {"timestamp": "when"}, "timestamp_format": "%d|%m|%y %Hh%M"}
    _assert_bars(load_bars(path, **settings))
    bad = text.replace("17h02", "17:02")
    message = _message(_write(tmp_path, "bad.csv", bad), **settings)
    assert "line 4, column 'when': timestamp '01|09|13 17:02' does not match" in message


def test_parquet_with_an_unnamed_datetime_index(tmp_path):
    frame = pd.DataFrame(
        {"open": [1.0] * 3, "high": [2.0] * 3, "low": [1.0] * 3, "close": [1.5, 1.25, 1.75]},
        index=pd.DatetimeIndex(CHICAGO),
    )
    frame.to_parquet(tmp_path / "bars.parquet")  # pandas' default: the index is kept, unnamed
    _assert_bars(load_bars(tmp_path / "bars.parquet"))


def test_a_named_utc_column_keeps_its_vendors_zone(tmp_path):
    text = "Gmt time,Open,High,Low,Close\n" + "".join(
        f"01.09.2013 22:0{i}:00.000,1,2,1,{c}\n" for i, c in enumerate((1.5, 1.25, 1.75))
    )
    path = _write(tmp_path, "EURUSD.csv", text)
    _assert_bars(load_bars(path, columns={"timestamp": "Gmt time"}))
    assert load_bars(path).reading["timezone"].startswith("UTC (the header 'Gmt time'")


def test_lines_count_the_preamble_and_times_are_shown_as_written(tmp_path):
    # 2013-09-01 22:01Z is 17:01 in Chicago: the message quotes the file, not exchange time.
    text = "# exported by a vendor\n# another comment\ntimestamp,o,h,l,c\n" + "".join(
        f"2013-09-01T22:0{m}:00Z,1,2,1,1.5\n" for m in (0, 1, 1, 2)
    )
    message = _message(_write(tmp_path, "pre.csv", text))
    assert "line 6, column 'timestamp': duplicate timestamp '2013-09-01T22:01:00Z' (same as " in (
        message
    )
    assert "line 5)" in message


def test_repeated_rows_deep_in_a_newest_first_file_are_named_where_they_are(tmp_path):
    # Newest first, 200 hourly bars, with three rows repeated (shifted) in the middle: the
    # message names that stretch, not the whole file.
    hours = list(range(200, 100, -1)) + [103, 102, 101] + list(range(100, 0, -1))
    stamps = pd.Timestamp("2020-01-01") + pd.to_timedelta(hours, "h")
    text = "timestamp,o,h,l,c\n" + "".join(f"{t},1,2,1,1.5\n" for t in stamps)
    message = _message(_write(tmp_path, "hourly.csv", text))
    # Hour 200 is line 2, so hour h of the first pass is line 202 - h (103-101: lines 99-101);
    # their repeat is lines 102-104.
    assert (
        "line 101, column 'timestamp': timestamp '2020-01-05 05:00:00' is earlier than line 102 "
        "('2020-01-05 07:00:00'): timestamps decrease; the stretch lines 99-101 overlaps lines "
        "102-104; fix"
    ) in message


def test_lines_are_the_files_for_headerless_and_multi_line_headers(tmp_path):
    # The third bar's close is missing: file line 3 of a header-less Binance file, line 6 of a
    # yfinance file with its three header lines.
    rows = [
        f"{(EPOCH_S + 60 * i) * 1000},1,2,1,{c},10,0,100,5,4,40,0\n" for i, c in enumerate("12")
    ]
    binance = "".join(rows) + f"{(EPOCH_S + 120) * 1000},1,2,1,,10,0,100,5,4,40,0\n"
    message = _message(_write(tmp_path, "BTCUSDT-1m.csv", binance))
    assert "line 3, column 'close': value is missing or NaN" in message
    multi = (
        "Price,Adj Close,Close,High,Low,Open,Volume\nTicker,ES=F,ES=F,ES=F,ES=F,ES=F,ES=F\n"
        "Datetime,,,,,,\n"
        + "".join(f"2013-09-01 22:0{i}:00+00:00,9.9,{c},2,1,1,0\n" for i, c in enumerate("12"))
        + "2013-09-01 22:02:00+00:00,9.9,,2,1,1,0\n"
    )
    assert "line 6, column 'Close'" in _message(_write(tmp_path, "yf_multi.csv", multi))
