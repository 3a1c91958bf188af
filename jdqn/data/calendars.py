"""Trading calendars: the clock bars are kept in, when a trading day starts, and which calendar
features an instrument has.

Times are wall-clock times of the calendar's ``timezone``, the zone bars are loaded into. The
trading day starts at ``day_open``: a bar at or after it belongs to the next calendar day's
session, as on CME Globex, where Sunday 17:00 CT opens Monday's. Features
(:func:`calendar_features`): ``tod_sin``, ``tod_cos`` (time of day on a 24 h circle);
``session_progress`` (minutes since ``day_open`` / ``session_minutes``; not in a 24/7 market,
whose "day" is only a date); ``rth_progress`` and ``is_rth`` (position in, and membership of, the
main trading hours ``[rth_open, rth_close)``, where a market has them); ``day_of_week`` (of the
trading day, Monday 0 .. last trading weekday 1).

Hours: CME Group product pages (Globex Sunday-Friday 17:00-16:00 CT; the "regular" hours are the
former pit / day-session hours CME still publishes for settlement); spot FX trades Sunday 17:00
to Friday 17:00 New York, busiest in the London/New York overlap; crypto trades around the clock
and dates days in UTC.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_MINUTES_PER_DAY = 1440


def _minute(clock: str) -> int:
    hours, minutes = clock.split(":")
    return int(hours) * 60 + int(minutes)


@dataclass(frozen=True)
class TradingCalendar:
    """One market's clock; times are minutes after local midnight."""

    name: str
    timezone: str  # IANA zone of the bars' naive timestamps
    rth_open: int | None = None  # main trading hours, or None when the market has none
    rth_close: int | None = None
    day_open: int = 17 * 60  # the trading day starts here (the evening before, if after the rth)
    session_minutes: int = 1440  # length of the daily session (1440 = no daily break)
    trading_days_per_week: int = 5  # 5 (Monday-Friday sessions) or 7
    trading_days_per_year: int = 252  # annualises Sharpe: 252 or 365

    @property
    def has_session(self) -> bool:
        return self.trading_days_per_week < 7


def _cme(name: str, rth_open: str, rth_close: str) -> TradingCalendar:
    """A CME Globex market: 17:00-16:00 CT, one hour's maintenance break."""
    rth = _minute(rth_open), _minute(rth_close)
    return TradingCalendar(name, "America/Chicago", *rth, session_minutes=1380)


CALENDARS: dict[str, TradingCalendar] = {
    calendar.name: calendar
    for calendar in (
        _cme("cme_equity", "08:30", "15:00"),  # ES, NQ: NYSE hours 09:30-16:00 ET
        _cme("cme_energy", "08:00", "13:30"),  # CL: NYMEX day session
        _cme("cme_metals", "07:20", "12:30"),  # GC: COMEX day session
        _cme("cme_rates_fx", "07:20", "14:00"),  # ZN (CBOT) and 6E (CME FX) day sessions
        # The FX value date rolls at 17:00 New York; main hours: the London/New York overlap.
        TradingCalendar("fx_24x5", "America/New_York", _minute("08:00"), _minute("12:00")),
        TradingCalendar(
            "crypto_24x7", "UTC", day_open=0, trading_days_per_week=7, trading_days_per_year=365
        ),
    )
}


def trading_day(timestamp: np.ndarray, calendar: TradingCalendar) -> np.ndarray:
    """[T] int64 day number (days since 1970-01-01) of each bar's trading day."""
    minutes = timestamp.astype("datetime64[m]").astype(np.int64)
    return (minutes + (_MINUTES_PER_DAY - calendar.day_open) % _MINUTES_PER_DAY) // _MINUTES_PER_DAY


def calendar_features(timestamp: np.ndarray, calendar: TradingCalendar) -> dict[str, np.ndarray]:
    """The calendar's features of naive local ``timestamp`` [T] (module docstring), each [T]."""
    minutes = timestamp.astype("datetime64[m]").astype(np.int64)
    minute_of_day = minutes % _MINUTES_PER_DAY
    angle = 2.0 * np.pi * minute_of_day / _MINUTES_PER_DAY
    features = {"tod_sin": np.sin(angle), "tod_cos": np.cos(angle)}
    if calendar.has_session:
        since_open = (minute_of_day - calendar.day_open) % _MINUTES_PER_DAY
        features["session_progress"] = since_open / calendar.session_minutes
    if calendar.rth_open is not None and calendar.rth_close is not None:
        rth = (minute_of_day >= calendar.rth_open) & (minute_of_day < calendar.rth_close)
        length = calendar.rth_close - calendar.rth_open
        features["rth_progress"] = np.where(rth, (minute_of_day - calendar.rth_open) / length, 0.0)
    weekday = (trading_day(timestamp, calendar) + 3) % 7  # 1970-01-01 was a Thursday; Monday 0
    features["day_of_week"] = weekday / (calendar.trading_days_per_week - 1)
    if calendar.rth_open is not None and calendar.rth_close is not None:
        features["is_rth"] = rth.astype(np.float64)
    return features
