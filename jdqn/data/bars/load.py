"""``load_bars``: read, map, parse and validate a bar file."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

import numpy as np

from jdqn.data.bars.checks import check_order, check_values, newest_first, numeric
from jdqn.data.bars.columns import check_one_symbol, fixed_point_scale, map_columns
from jdqn.data.bars.core import EXCHANGE_TZ, PRICE_COLUMNS, BarFileError, Bars
from jdqn.data.bars.reading import read_frame
from jdqn.data.bars.timestamps import parse_bar_times

logger = logging.getLogger("jdqn.data")


def load_bars(
    path: str | os.PathLike[str],
    min_bars: int = 2,
    *,
    columns: Mapping[str, str] | None = None,
    timezone: str | None = None,
    exchange_timezone: str = EXCHANGE_TZ,
    timestamp_format: str | None = None,
) -> Bars:
    """Read, map, parse and validate a bar file; raise :class:`BarFileError` on any defect.

    ``columns``: role -> column name for headers no alias covers (``data.columns``).
    ``timezone``: the zone of naive timestamps in the file (``data.timezone``); None means they
    are exchange time already (or UTC where the header says so). ``exchange_timezone``: the
    clock the bars come out in (the instrument's trading calendar). ``timestamp_format``:
    strftime codes of the timestamps (``data.timestamp_format``; None: the known forms). A
    newest-first file is turned round, with a one-line notice on the ``jdqn.data`` logger.
    Messages name a CSV file's lines as an editor numbers them.
    """
    frame, layout = read_frame(path)
    if layout is not None and layout.header_line:
        logger.info("%s: skipped %d line(s) before the header", path, layout.header_line)
    first_line = None if layout is None else layout.first_bar_line
    try:
        check_one_symbol(frame, path)
        mapped = map_columns(frame, path, columns)
        times = parse_bar_times(frame, mapped, path, timezone, exchange_timezone, timestamp_format)
        scale = fixed_point_scale(frame, mapped)
        column = {role: numeric(frame[name], path, name) for role, name in mapped.prices.items()}
        prices = {name: column[name] * scale for name in PRICE_COLUMNS}
        has_volume = "volume" in mapped.prices
        volume = column["volume"] if has_volume else np.zeros(len(frame), np.float64)
        check_values(prices, volume, mapped.prices, path)
    except BarFileError as error:
        raise error.at_line(first_line) from None
    local_ns, order_ns, written = times.local_ns, times.order_ns, times.written
    rows = np.arange(1, len(frame) + 1) + (0 if first_line is None else first_line - 1)
    flipped = newest_first(order_ns)
    if flipped:
        logger.warning("%s: bars are newest first; sorted oldest first", path)
        flip = slice(None, None, -1)
        same = order_ns is local_ns
        local_ns, rows, volume, written = local_ns[flip], rows[flip], volume[flip], written[flip]
        order_ns = local_ns if same else order_ns[flip]
        prices = {name: values[flip] for name, values in prices.items()}
    unit = "row" if first_line is None else "line"
    name = mapped.timestamp_name
    check_order(local_ns, order_ns, written, rows, name, path, exchange_timezone, unit)
    if len(frame) < min_bars:
        raise BarFileError(
            path,
            f"the file has {len(frame)} bar(s) but at least {min_bars} are needed",
            "supply a longer bar file",
        )
    reading = {
        "columns": {"timestamp": name} | mapped.prices,
        "timezone": times.zone,
        "newest_first": flipped,
    }
    return Bars(
        timestamp=local_ns.astype("datetime64[ns]"),
        **{name: np.ascontiguousarray(prices[name]) for name in PRICE_COLUMNS},
        volume=np.ascontiguousarray(volume),
        has_volume=has_volume,
        reading=reading,
    )
