"""A bar series' interval, gaps and the settings that follow from them: how bars were read
(what ``jdqn data check`` and a run's first lines say, and what results.json records), and the
walk-forward purge given in time or following the data's interval.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jdqn.config import Config, DataConfig
from jdqn.config.sections import duration_seconds
from jdqn.data.bars import Bars
from jdqn.data.calendars import CALENDARS, trading_day

# The purge by default: one Globex trading day (23 h), 1,380 bars of 1-minute data.
DEFAULT_PURGE_MINUTES = 1_380
_DAILY_SECONDS = 20 * 3600  # a median step this long or longer: daily (or coarser) bars
_REGULAR_SHARE = 0.5  # fewer steps within a trading day than this at the interval: irregular


def interval_seconds(timestamp: np.ndarray) -> float | None:
    """The bar interval: the median step between bars [T], in seconds (None: one bar)."""
    steps = np.diff(timestamp.astype("datetime64[ns]").astype(np.int64))
    return float(np.median(steps)) / 1e9 if steps.size else None


def describe_reading(bars: Bars, cfg: DataConfig, instrument: str) -> dict[str, Any]:
    """How ``bars`` were read and what they look like, for results.json and the console:
    columns, the zone naive times were taken in, the calendar, the interval, gaps within
    trading days (longer steps than the interval; nights and weekends are not gaps) and a
    notice for daily or irregular bars."""
    calendar = CALENDARS[cfg.calendar]
    interval = interval_seconds(bars.timestamp)
    reading: dict[str, Any] = {
        **bars.reading,
        "timestamp_format": cfg.timestamp_format,
        "calendar": f"{calendar.name} ({calendar.timezone})",
        "instrument": instrument,
        "interval_seconds": interval,
    }
    if interval is None:
        return reading
    steps_ns = np.diff(bars.timestamp.astype("datetime64[ns]").astype(np.int64))  # [T-1]
    interval_ns = round(interval * 1e9)
    days = trading_day(bars.timestamp, calendar)
    same_day = days[1:] == days[:-1]  # [T-1] the step stays within a trading day
    longer = np.flatnonzero((steps_ns > interval_ns) & same_day)
    reading["gaps"] = {"count": len(longer)}
    if len(longer):
        at = int(longer[np.argmax(steps_ns[longer])])
        reading["gaps"] |= {
            "longest_seconds": float(steps_ns[at]) / 1e9,
            "after": str(np.datetime_as_string(bars.timestamp[at], "s")),
        }
    within = steps_ns[same_day]
    share = float(np.mean(within == interval_ns)) if within.size else 1.0
    if interval >= _DAILY_SECONDS:
        reading["notice"] = (
            "daily (or coarser) bars: features, windows and the purge count bars, i.e. days, "
            "and the time-of-day features are constant; the trainer is built for intraday bars"
        )
    elif share < _REGULAR_SHARE:
        reading["notice"] = (
            f"irregular bars: {share:.0%} of the steps within a trading day are the median "
            f"{_duration_text(interval)}; features count bars, not time"
        )
    return reading


def reading_lines(reading: dict[str, Any]) -> list[str]:
    """:func:`describe_reading` as console lines."""
    columns = ", ".join(f"{role}={name}" for role, name in reading.get("columns", {}).items())
    lines = [f"bars read with columns {columns}"] if columns else []
    if "timezone" in reading:
        fmt = reading.get("timestamp_format")
        lines.append(f"timestamps: {reading['timezone']}" + (f", format {fmt}" if fmt else ""))
    interval = reading.get("interval_seconds")
    lines.append(
        f"calendar {reading['calendar']}, instrument {reading['instrument']}, bar interval "
        + (_duration_text(interval) if interval is not None else "unknown (one bar)")
    )
    if "purge_bars" in reading:
        lines.append(f"walk-forward purge: {reading['purge_bars']:,} bars")
    gaps = reading.get("gaps")
    if gaps is not None:
        longest = (
            f" (longest {_duration_text(gaps['longest_seconds'])} after {gaps['after']})"
            if gaps["count"]
            else ""
        )
        lines.append(f"gaps within trading days: {gaps['count']:,}{longest}")
    if "notice" in reading:
        lines.append(f"notice: {reading['notice']}")
    return lines


def resolve_purge(cfg: Config, bars: Bars) -> Config:
    """The config with ``walkforward.purge_bars`` from the data: ``walkforward.purge_time``
    when given, else, where ``purge_bars`` is the default 1,380 (one Globex day of 1-minute
    bars), that time at the data's interval; never below the feature lookback."""
    walkforward = cfg.walkforward
    interval = interval_seconds(bars.timestamp)
    if interval is None or interval <= 0:
        return cfg
    if walkforward.purge_time is not None:
        seconds = duration_seconds(walkforward.purge_time, "walkforward.purge_time")
    elif walkforward.purge_bars == DEFAULT_PURGE_MINUTES:
        seconds = DEFAULT_PURGE_MINUTES * 60.0
    else:
        return cfg
    purge = max(math.ceil(seconds / interval - 1e-9), cfg.data.lookback_bars)
    return dataclasses.replace(cfg, walkforward=dataclasses.replace(walkforward, purge_bars=purge))


def _duration_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"
