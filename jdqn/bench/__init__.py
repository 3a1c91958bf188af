"""``jdqn bench``: the jit-compiled benchmark (docs/design.md §14); never timed in tests."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header row, its rule, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # An empty cell is "| |", not "|  |".
    lines += [
        "|" + "|".join(f" {cell} " if cell != "" else " " for cell in row) + "|" for row in rows
    ]
    return "\n".join(lines)
