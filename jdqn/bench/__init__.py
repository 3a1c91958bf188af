"""``jdqn bench``: the jit-compiled benchmark (docs/design.md §14); never timed in tests."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
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


def run_processes(
    commands: dict[str, list[str]], jobs: int, log_dir: Path
) -> tuple[str, int] | None:
    """Runs each named command as its own process: with ``jobs`` 1 one at a time, its output on
    the console, stopping at the first that fails; else up to ``jobs`` at once, each one's output
    in ``log_dir/<name>.log``, every one run whatever another returns (on one GPU processes that
    share jdqn's caches give a lone process's numbers: README, "Reproducibility and caches").
    The first failed name (in ``commands``' order) and its exit status, or None."""
    if jobs == 1:
        for name, command in commands.items():
            if status := subprocess.run(command).returncode:
                return name, status
        return None

    def one(name: str) -> int:
        with (log_dir / f"{name}.log").open("w") as log:
            return subprocess.run(commands[name], stdout=log, stderr=subprocess.STDOUT).returncode

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        statuses = dict(zip(commands, pool.map(one, commands), strict=True))
    return next(((name, s) for name, s in statuses.items() if s != 0), None)


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
