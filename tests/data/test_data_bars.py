"""Bar-file loading: every malformed case fails with its one-line message; vendor forms parse."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from malformed_bars import HEADER, MALFORMED_CASES, ROW1, ROW2, ROW3, write_case

from jdqn.data import BarFileError, Bars, load_bars

ES_SAMPLE = Path(__file__).resolve().parents[1] / "data" / "es_2013-09_1min.csv"


def _ts(*values: str) -> np.ndarray:
    return np.array(values, dtype="datetime64[ns]")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _message(path: Path) -> str:
    with pytest.raises(BarFileError) as info:
        load_bars(path)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(f"{path}: "), message
    assert "; fix: " in message, message
    return message


# ---------------------------------------------------------------------------------------------
# Malformed files


def test_malformed_cases_cover_the_required_kinds():
    ids = {case_id for case_id, _, _ in MALFORMED_CASES}
    assert len(ids) == len(MALFORMED_CASES) >= 14


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [(c[0], c[2]) for c in MALFORMED_CASES],
    ids=[c[0] for c in MALFORMED_CASES],
)
def test_malformed_case_raises_one_line_message(tmp_path, case_id, expected):
    path = write_case(tmp_path, case_id)
    message = _message(path)
    assert expected in message, message


def test_bar_file_error_format_without_row_and_column(tmp_path):
    error = BarFileError(tmp_path / "x.csv", "problem", "do this")
    assert str(error) == f"{tmp_path / 'x.csv'}: problem; fix: do this"
    error = BarFileError("f.csv", "bad\nthing", "fix it", row=3, column="close")
    assert str(error) == "f.csv: row 3, column 'close': bad thing; fix: fix it"
    assert isinstance(error, ValueError) and error.row == 3 and error.column == "close"


def test_missing_file(tmp_path):
    assert "file does not exist" in _message(tmp_path / "nope.csv")


def test_directory_is_not_a_file(tmp_path):
    (tmp_path / "bars.csv").mkdir()
    assert "is not a regular file" in _message(tmp_path / "bars.csv")


def test_unsupported_extension(tmp_path):
    path = _write(tmp_path, "bars.xlsx", HEADER + ROW1 + ROW2)
    assert "unsupported file extension '.xlsx'" in _message(path)


def test_not_utf8_text(tmp_path):
    path = tmp_path / "bars.csv"
    path.write_bytes(b"\xff\xfe\x00\x81garbage\x00\x9d\n\x00")
    assert "is not UTF-8 text" in _message(path)


def test_corrupt_gzip_and_parquet(tmp_path):
    assert "compressed file is truncated or corrupt" in _message(
        _write(tmp_path, "bars.csv.gz", "not gzip")
    )
    assert "cannot be read as Parquet" in _message(_write(tmp_path, "bars.parquet", "not parquet"))


def test_parquet_with_nan_price(tmp_path):
    frame = pd.DataFrame(
        {
            "timestamp": _ts("2013-09-01T17:00", "2013-09-01T17:01", "2013-09-01T17:02"),
            "open": [1.0, 1.0, 1.0],
            "high": [2.0, 2.0, 2.0],
            "low": [1.0, 1.0, 1.0],
            "close": [1.5, np.nan, 1.5],
        }
    )
    path = tmp_path / "bars.parquet"
    frame.to_parquet(path, index=False)
    assert "row 2, column 'close': value is missing or NaN" in _message(path)


def test_blank_line_inside_is_reported_at_its_row(tmp_path):
    path = _write(tmp_path, "bars.csv", HEADER + ROW1 + "\n" + ROW2 + ROW3)
    assert "line 3, column 'timestamp': timestamp is missing" in _message(path)


def test_error_count_of_further_rows(tmp_path):
    text = HEADER + ROW1.replace(",3940", ",-1") + ROW2.replace(",1105", ",-2") + ROW3
    assert "volume -1 is negative (and 1 more row)" in _message(_write(tmp_path, "b.csv", text))


# ---------------------------------------------------------------------------------------------
# Accepted forms


GOOD_FILES = [
    (
        "plain.csv",
        HEADER + ROW1 + ROW2 + ROW3 + "\n\n",  # trailing blank lines are ignored
        ("2013-09-01T17:00", "2013-09-01T17:01", "2013-09-01T17:02"),
    ),
    (
        "date_time_columns.csv",
        "Date,Time,Open,High,Low,Close,Vol\n"
        "09/01/2013,17:00,1,2,1,1.5,10\n09/03/2013,08:30,1,2,1,1.5,20\n",
        ("2013-09-01T17:00", "2013-09-03T08:30"),
    ),
    (
        "metastock.txt",
        "<DATE>;<TIME>;<OPEN>;<HIGH>;<LOW>;<CLOSE>;<VOL>\n"
        "20130901;170000;1;2;1;1.5;10\n20130903;093000;1;2;1;1.5;20\n",
        ("2013-09-01T17:00", "2013-09-03T09:30"),
    ),
    (
        "integer_hhmm.csv",
        "date,time,o,h,l,c\n20130903,830,1,2,1,1.5\n20130903,1001,1,2,1,1.5\n",
        ("2013-09-03T08:30", "2013-09-03T10:01"),
    ),
    (
        "vendor_compact.csv",
        "Date Time,o,h,l,last,v\n20130901 170000,1,2,1,1.5,4\n20130901 170100,1,2,1,1.5,5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "iso_t_no_seconds.csv",
        " DateTime , OPEN , HIGH , LOW , CLOSE \n"
        "2013-09-01T17:00,1,2,1,1.5\n2013-09-01T17:01,1,2,1,1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "us_slashes.csv",
        "timestamp,open,high,low,close\n"
        "09/01/2013 17:00:00,1,2,1,1.5\n9/1/2013 17:01:00,1,2,1,1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "dukascopy.csv",
        "Time,Open,High,Low,Close,Volume\n"
        "01.09.2013 17:00:00.000,1,2,1,1.5,1\n01.09.2013 17:01:00.000,1,2,1,1.5,1\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "tab_separated.txt",
        "date_time\topen\thigh\tlow\tclose\n"
        "2013-09-01 17:00\t1\t2\t1\t1.5\n2013-09-01 17:01\t1\t2\t1\t1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "utc_z_summer.csv",  # CDT = UTC-5
        "dt,o,h,l,c\n2013-09-01T22:00:00Z,1,2,1,1.5\n2013-09-01T22:01:00Z,1,2,1,1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "utc_offset_winter.csv",  # CST = UTC-6
        "timestamp,o,h,l,c\n"
        "2013-12-02 15:00:00+00:00,1,2,1,1.5\n2013-12-02 10:01:00-05:00,1,2,1,1.5\n",
        ("2013-12-02T09:00", "2013-12-02T09:01"),
    ),
    (
        "epoch_seconds.csv",
        "timestamp,o,h,l,c\n1378072800,1,2,1,1.5\n1378072860,1,2,1,1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
    (
        "epoch_milliseconds.csv",
        "timestamp,o,h,l,c\n1378072800000,1,2,1,1.5\n1378072860000,1,2,1,1.5\n",
        ("2013-09-01T17:00", "2013-09-01T17:01"),
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), GOOD_FILES, ids=[g[0] for g in GOOD_FILES])
def test_accepted_headers_and_timestamp_forms(tmp_path, name, text, expected):
    bars = load_bars(_write(tmp_path, name, text))
    np.testing.assert_array_equal(bars.timestamp, _ts(*expected))
    assert bars.timestamp.dtype == np.dtype("datetime64[ns]")
    assert len(bars) == len(expected)
    for column in (bars.open, bars.high, bars.low, bars.close, bars.volume):
        assert column.dtype == np.float64 and column.shape == (len(expected),)


def test_values_and_optional_volume(tmp_path):
    bars = load_bars(_write(tmp_path, "b.csv", HEADER + ROW1 + ROW2 + ROW3))
    np.testing.assert_array_equal(bars.open, [1640.25, 1640.00, 1639.75])
    np.testing.assert_array_equal(bars.high, [1641.00, 1640.50, 1640.75])
    np.testing.assert_array_equal(bars.low, [1639.00, 1639.50, 1639.50])
    np.testing.assert_array_equal(bars.close, [1639.75, 1640.00, 1640.50])
    np.testing.assert_array_equal(bars.volume, [3940, 1105, 467])
    assert bars.has_volume
    text = "time,o,h,l,c\n2013-09-01 17:00,1,2,1,1.5\n2013-09-01 17:01,1,2,1,1.5\n"
    no_volume = load_bars(_write(tmp_path, "nv.csv", text))
    assert not no_volume.has_volume
    np.testing.assert_array_equal(no_volume.volume, [0.0, 0.0])


def test_gzip_csv(tmp_path):
    path = tmp_path / "bars.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write(HEADER + ROW1 + ROW2)
    np.testing.assert_array_equal(load_bars(path).close, [1639.75, 1640.00])


def test_parquet_naive_aware_and_index(tmp_path):
    stamps = _ts("2013-09-01T17:00", "2013-09-01T17:01")
    frame = pd.DataFrame(
        {"Open": [1.0, 1.0], "High": [2.0, 2.0], "Low": [1.0, 1.0], "Close": [1.5, 1.25]}
    )
    naive = frame.assign(timestamp=stamps)
    naive.to_parquet(tmp_path / "naive.parquet", index=False)
    np.testing.assert_array_equal(load_bars(tmp_path / "naive.parquet").timestamp, stamps)
    aware = frame.assign(
        time=pd.to_datetime(stamps).tz_localize("America/Chicago").tz_convert("UTC")
    )
    aware.to_parquet(tmp_path / "aware.pq", index=False)
    np.testing.assert_array_equal(load_bars(tmp_path / "aware.pq").timestamp, stamps)
    indexed = frame.set_index(pd.DatetimeIndex(stamps, name="datetime"))
    indexed.to_parquet(tmp_path / "indexed.parquet")
    bars = load_bars(tmp_path / "indexed.parquet")
    np.testing.assert_array_equal(bars.timestamp, stamps)
    np.testing.assert_array_equal(bars.close, [1.5, 1.25])


def test_repeated_dst_hour_is_accepted_only_on_the_autumn_change(tmp_path):
    # 2013-11-03 01:00-02:00 CT happened twice (CDT then CST).
    text = "timestamp,o,h,l,c\n2013-11-03 01:59,1,2,1,1\n2013-11-03 01:00,1,2,1,1\n"
    bars = load_bars(_write(tmp_path, "dst.csv", text))
    np.testing.assert_array_equal(bars.timestamp, _ts("2013-11-03T01:59", "2013-11-03T01:00"))
    other_day = _write(tmp_path, "bad.csv", text.replace("11-03", "11-04"))
    assert "timestamps decrease" in _message(other_day)
    # The same instants given in UTC are ordered and convert to the repeated local hour.
    utc = "timestamp,o,h,l,c\n2013-11-03T06:59:00Z,1,2,1,1\n2013-11-03T07:00:00Z,1,2,1,1\n"
    bars = load_bars(_write(tmp_path, "utc.csv", utc))
    np.testing.assert_array_equal(bars.timestamp, _ts("2013-11-03T01:59", "2013-11-03T01:00"))


def test_min_bars_argument(tmp_path):
    path = _write(tmp_path, "b.csv", HEADER + ROW1 + ROW2 + ROW3)
    assert len(load_bars(path, min_bars=3)) == 3
    with pytest.raises(BarFileError, match="has 3 bar"):
        load_bars(path, min_bars=4)


def test_bars_rejects_mismatched_shapes():
    t = _ts("2013-09-01T17:00", "2013-09-01T17:01")
    ones = np.ones(2)
    with pytest.raises(ValueError, match="Bars.volume"):
        Bars(t, ones, ones, ones, ones, np.ones(3))


# ---------------------------------------------------------------------------------------------
# The real ES sample


def test_real_es_sample_loads_with_pinned_values():
    bars = load_bars(ES_SAMPLE)
    assert len(bars) == 2264
    assert bars.has_volume
    assert bars.timestamp[0] == np.datetime64("2013-09-01T17:00")
    assert bars.timestamp[-1] == np.datetime64("2013-09-03T13:51")
    first = (bars.open[0], bars.high[0], bars.low[0], bars.close[0], bars.volume[0])
    last = (bars.open[-1], bars.high[-1], bars.low[-1], bars.close[-1], bars.volume[-1])
    assert first == (1640.25, 1641.00, 1639.00, 1639.75, 3940)
    assert last == (1632.25, 1632.50, 1630.75, 1631.25, 6412)
    assert bars.close[2] == 1640.50 and bars.volume[3] == 301
    prices = np.stack([bars.open, bars.high, bars.low, bars.close])
    np.testing.assert_array_equal(prices * 4, np.round(prices * 4))  # 0.25 tick grid
    assert np.all(np.diff(bars.timestamp) > np.timedelta64(0, "m"))
    assert np.any(np.diff(bars.timestamp) > np.timedelta64(1, "m"))  # real gaps in the clock
