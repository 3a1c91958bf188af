"""The validated bar series and the one-line error every rejected bar file raises."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
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
    # How the file was read: {"columns": role -> column, "timezone": zone assumed, ...}; empty
    # for bars not read from a file.
    reading: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.close.shape
        for name in ("timestamp", "open", "high", "low", "volume"):
            if getattr(self, name).shape != n or len(n) != 1:
                raise ValueError(f"Bars.{name}: shape {getattr(self, name).shape} != close {n}")

    def __len__(self) -> int:
        return int(self.close.shape[0])


class BarFileError(ValueError):
    """A bar file that cannot be used, with a one-line message saying where and how to fix it.

    Format: ``"<file>: line <n>, column '<c>': <problem>; fix: <what to do>"``, where ``n`` is
    the 1-based line of a CSV file as an editor shows it (``row <r>``, the 1-based data row, for
    Parquet and DataFrames) and the line and column parts are left out when the problem is not
    specific to them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        problem: str,
        fix: str,
        row: int | None = None,
        column: str | None = None,
        unit: str = "row",
    ) -> None:
        where = []
        if row is not None:
            where.append(f"{unit} {row}")
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
        self.unit = unit

    def at_line(self, first_line: int | None) -> BarFileError:
        """This error with its data row given as the file line ``first_line`` + row - 1 (None:
        the file has no lines, as Parquet; the row stays)."""
        if first_line is None or self.row is None:
            return self
        line = first_line + self.row - 1
        return BarFileError(self.path, self.problem, self.fix, line, self.column, "line")


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
