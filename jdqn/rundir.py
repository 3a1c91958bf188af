"""Run directories that are whole or visibly not: written as ``NAME.incomplete``, renamed last.

A run writes everything into ``<out>/<name>.incomplete/``. Only after the last file is written is
the directory renamed to ``<out>/<name>/``, so a directory without the suffix always holds a whole
run. A killed run leaves its ``.incomplete`` directory (with its checkpoints) for ``--resume``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

INCOMPLETE_SUFFIX = ".incomplete"
COMPLETE_MARKER = "results.json"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run. ``path`` is where files are written now (``.incomplete`` until done)."""

    path: Path
    final_path: Path

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def results_path(self) -> Path:
        return self.path / COMPLETE_MARKER

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def plots_dir(self) -> Path:
        return self.path / "plots"

    @property
    def curves_dir(self) -> Path:
        return self.path / "curves"

    @property
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"


def new_run_dir(out_dir: str | os.PathLike[str], name: str | None = None) -> RunDir:
    """Create ``<out_dir>/<name>.incomplete`` (name defaults to a UTC timestamp)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory; fix: choose another --out")
    stamp = name or datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")
    final = out / stamp
    suffix = 1
    while final.exists() or final.with_name(final.name + INCOMPLETE_SUFFIX).exists():
        final = out / f"{stamp}-{suffix}"
        suffix += 1
    path = final.with_name(final.name + INCOMPLETE_SUFFIX)
    path.mkdir(parents=True)
    return RunDir(path=path, final_path=final)


def open_incomplete_run_dir(path: str | os.PathLike[str]) -> RunDir:
    """Reopen a killed run's ``.incomplete`` directory for ``--resume``."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"--resume {p}: no such directory; fix: pass the run's .incomplete dir")
    if p.name.endswith(INCOMPLETE_SUFFIX):
        return RunDir(path=p, final_path=p.with_name(p.name[: -len(INCOMPLETE_SUFFIX)]))
    if (p / COMPLETE_MARKER).exists():
        raise ValueError(f"--resume {p}: this run is already complete; nothing to resume")
    raise ValueError(f"--resume {p}: not a run directory; fix: pass the run's .incomplete dir")


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) for the block and deliver it once the block is done.

    Creating a run directory and removing one are short, but a Ctrl-C that lands between the
    ``mkdir`` and the code that would clean up after it, or half-way through that clean-up,
    leaves a ``.incomplete`` directory that nothing will remove (seen in CI: a second Ctrl-C
    interrupted the removal of the first one's directory). Only the main thread receives
    signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is None  # a handler not set from Python: leave it be
    ):
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            signal.raise_signal(signal.SIGINT)  # to the handler that was there before


def finalize(run: RunDir) -> Path:
    """Rename the finished run into place; the last step of every successful run."""
    if run.path == run.final_path:
        return run.final_path
    os.replace(run.path, run.final_path)
    return run.final_path


def discard(run: RunDir) -> None:
    """Remove a run directory that holds nothing worth resuming."""
    shutil.rmtree(run.path, ignore_errors=True)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` atomically (temp file + rename): a reader never sees half a file, and a
    failed write leaves no temp file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically (``write_atomic``)."""
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, text.encode())
