"""The validated bar series and the one-line error every rejected bar file raises."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

EXCHANGE_TZ = "America/Chicago"
PRICE_COLUMNS = ("open", "high", "low", "close")


@dataclass(frozen=True, eq=False)  # eq=False: element-wise array equality has no single truth
class Bars:
    """A validated bar series, oldest first."""

    timestamp: np.ndarray  # [T] datetime64[ns], naive exchange time (the calendar's zone)
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
    1-based data row in file order (the header is not counted, so row r is line r + 1 of a CSV
    file, plus any preamble lines above the header) and the row and column parts are left out
    when the problem is not specific to them.
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


def error_detail(error: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has none."""
    return str(error).splitlines()[0].strip() if str(error) else type(error).__name__


def reject_rows(
    bad: np.ndarray,
    path: str | os.PathLike[str],
    problem: str,
    fix: str,
    column: str | None,
    **values: Any,
) -> None:
    """Raises :class:`BarFileError` at the first row where ``bad`` [T] holds (none: returns),
    noting how many more there are. ``problem`` is formatted with each of ``values`` ([T] arrays
    or Series, by position) at that row."""
    hits = np.flatnonzero(bad)
    if len(hits):
        at = {name: np.asarray(array)[hits[0]] for name, array in values.items()}
        message = problem.format(**at) + more_rows(len(hits) - 1)
        raise BarFileError(path, message, fix, int(hits[0]) + 1, column)


def more_rows(count: int) -> str:
    return "" if count == 0 else f" (and {count} more row{'s' if count > 1 else ''})"
