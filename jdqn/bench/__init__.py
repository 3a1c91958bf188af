"""``jdqn bench``: the jit-compiled benchmark (docs/design.md §14); never timed in tests."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header row, its rule, then one line per row of cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # An empty cell is "| |", not "|  |".
    lines += [
        "|" + "|".join(f" {cell} " if cell != "" else " " for cell in row) + "|" for row in rows
    ]
    return "\n".join(lines)


def json_problem(json_path: str | Path) -> str | None:
    """Why a benchmark's ``--json`` file cannot be written, found before minutes of measuring
    (the result would be lost after them); None when it can (:func:`write_json` makes its
    directory)."""
    target = Path(json_path)
    if target.is_dir():
        return f"--json {target}: a directory; fix: name a file"
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"--json {target}: {existing} is not a directory you can write in; fix: another path"
    return None


def write_json(json_path: str | Path, output: Any) -> None:
    """Writes a benchmark's result as JSON to ``json_path``, its directory made if need be."""
    from jdqn.run import rundir  # here: this package's tables need no JAX

    text = json.dumps(output, indent=2, default=float) + "\n"
    rundir.write_atomic(Path(json_path), text.encode())  # makes the directory
