"""Bar files: load and validate 1-minute OHLCV bars of one instrument.

:func:`load_bars` reads CSV (``.csv``, ``.txt``, optionally ``.gz``) or Parquet (``.parquet``,
``.pq``), finds the header below any preamble, maps vendor header names onto
``timestamp, open, high, low, close[, volume]`` (:mod:`.columns`), parses the usual vendor
timestamp forms (:mod:`.timestamps`), turns newest-first files round and rejects anything a
backtest should not silently swallow (:mod:`.checks`). Every rejection is a
:class:`BarFileError` whose message is one line naming the file, the data row, the column, the
problem and the fix.

Timestamps come out as naive exchange time (America/Chicago unless the instrument's calendar
says otherwise). Gaps in the clock are legal (minutes without a trade are simply absent in real
data). One exception to strictly increasing timestamps is tolerated in naive local time: the
hour that repeats when daylight saving time ends, because a year of exchange-time bars cannot
avoid it.
"""

from jdqn.data.bars.columns import USER_ROLES
from jdqn.data.bars.core import EXCHANGE_TZ, BarFileError, Bars
from jdqn.data.bars.load import load_bars

__all__ = ["EXCHANGE_TZ", "USER_ROLES", "BarFileError", "Bars", "load_bars"]
