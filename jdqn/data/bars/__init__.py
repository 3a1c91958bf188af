"""Bar files: load and validate 1-minute OHLCV bars of one instrument (docs/design.md §3).

:func:`load_bars` reads a CSV or Parquet file (:mod:`.reading`), maps vendor headers onto
``timestamp, open, high, low, close[, volume]`` (:mod:`.columns`), parses the timestamps into
naive exchange time (:mod:`.timestamps`), turns newest-first files round and rejects what a
backtest should not silently swallow (:mod:`.checks`), each time with a one-line
:class:`BarFileError`. Gaps in the clock are legal (minutes without a trade are absent in real
data); so is the hour that repeats in naive local time when daylight saving time ends.
"""

from jdqn.data.bars.core import BarFileError, Bars
from jdqn.data.bars.load import load_bars

__all__ = ["BarFileError", "Bars", "load_bars"]
