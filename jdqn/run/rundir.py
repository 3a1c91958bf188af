"""Run directories that are whole or visibly not: written as ``NAME.incomplete``, renamed last.

A run writes into ``<out>/<name>.incomplete/`` and renames it to ``<out>/<name>/`` after its last
file, so a directory without the suffix always holds a whole run; a killed run leaves its
``.incomplete`` directory (with its checkpoints) for ``--resume``. Directories are created with an
exclusive ``mkdir`` (two processes that pick one name get two directories) and locked
(``fcntl.flock`` on ``.lock``) while a process writes them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import jax
import numpy as np

from jdqn.run.faults import UserError, raise_as_user_error

INCOMPLETE_SUFFIX = ".incomplete"
COMPLETE_MARKER = "results.json"
LOCK_FILE = ".lock"


class FinalNameTaken(ValueError):
    """The finished run cannot be renamed: its final name was taken while it ran."""


class RunLock:
    """An exclusive ``flock`` on a run directory itself (a descriptor of the directory, which a
    rename keeps and no file deletion can drop), held until :meth:`release` (or the process's
    end: the kernel drops it with the descriptor, so a killed run leaves no stale lock). The
    ``.lock`` file inside only names the owner's pid, for the message that refuses a second
    process."""

    def __init__(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            (directory / LOCK_FILE).write_text(f"{os.getpid()}\n")
        except BlockingIOError:
            os.close(fd)
            raise ValueError(
                f"{directory}: in use by another jdqn process (pid {_owner(directory)}); fix: "
                "wait for it to end, or stop it first"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def holds(self, directory: Path) -> bool:
        """Whether ``directory`` is still the locked one (not renamed away meanwhile)."""
        try:
            here, locked = os.stat(directory), os.fstat(self._fd) if self._fd is not None else None
        except OSError:
            return False
        return locked is not None and (here.st_dev, here.st_ino) == (locked.st_dev, locked.st_ino)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _owner(directory: Path) -> str:
    try:
        return (directory / LOCK_FILE).read_text().strip() or "?"
    except OSError:  # deleted, or not yet written
        return "?"


@dataclass(frozen=True)
class RunDir:
    """Paths of one run: ``path`` is where files are written now (``.incomplete`` until done),
    ``lock`` this process's lock on it (released by :func:`finalize`, :func:`discard`)."""

    path: Path
    final_path: Path
    lock: RunLock | None = field(default=None, compare=False, repr=False)

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
    def tensorboard_dir(self) -> Path:
        return self.path / "tensorboard"


@dataclass(frozen=True)
class RunOutcome:
    """A finished walk-forward run, sweep or evaluation: its directory, its results.json, and
    whether a run it reports halted."""

    run_dir: Path
    results: dict[str, Any]
    halted: bool = False


def check_name(name: str) -> None:
    """A run name is one path component of its own: no separator, no control character, at most
    200 bytes, no leading dot (nor ``.`` or ``..``), no ``.incomplete`` suffix (which marks an
    unfinished run)."""
    problem = None
    if not name or name.strip() != name:
        problem = "is empty or has surrounding spaces"
    elif "/" in name or (os.altsep and os.altsep in name) or "\0" in name:
        problem = "is not a single path component"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):  # a newline splits the log's lines
        problem = "holds a control character (a newline or tab?)"
    elif len(name.encode()) > 200:  # room for the suffixes within the usual 255-byte limit
        problem = "is longer than 200 bytes"
    elif name.startswith("."):
        problem = "starts with a dot"
    elif name.endswith(INCOMPLETE_SUFFIX):
        problem = f"ends with {INCOMPLETE_SUFFIX}, which marks unfinished runs"
    if problem is not None:
        raise ValueError(
            f"--name {name!r}: {problem}; fix: a plain name such as es-2024 (--out says where)"
        )


def new_run_dir(out_dir: str | os.PathLike[str], name: str | None = None) -> RunDir:
    """Create and lock ``<out_dir>/<name>.incomplete`` (name defaults to a UTC timestamp); a name
    taken (complete or not) gets the first free ``-N`` suffix."""
    out = Path(out_dir).absolute()  # printed and recorded: a resume may start elsewhere
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory; fix: choose another --out")
    if name is not None:
        check_name(name)
    stamp = name or datetime.now(UTC).strftime("run-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    for suffix in range(100_000):
        final = out / (stamp if suffix == 0 else f"{stamp}-{suffix}")
        path = final.with_name(final.name + INCOMPLETE_SUFFIX)
        if final.exists():
            continue
        try:
            path.mkdir()  # exclusive: of two processes, one gets the name
        except FileExistsError:
            continue
        # A run of this name renames its .incomplete directory to the final one, so a final
        # directory made before our mkdir is seen now: give the name back.
        if final.exists():
            path.rmdir()
            continue
        try:
            return RunDir(path=path, final_path=final, lock=RunLock(path))
        except BaseException:  # a full disk at the pid file: leave no directory behind
            shutil.rmtree(path, ignore_errors=True)
            raise
    raise ValueError(f"--out {out}: no free run name from {stamp}; fix: choose another --name")


def create(
    out_dir: str,
    name: str | None,
    config_json: str,
    fill: Callable[[RunDir], None],
    made: list[RunDir],
) -> RunDir:
    """A new run directory (:func:`new_run_dir`) with ``config.json`` and what ``fill`` writes;
    removed again, and a one-line ``UserError`` raised, when they cannot be written. A Ctrl-C
    is held back until they are and the directory is in ``made``, the caller's record for its
    clean-up: a stop raised on any later line (a Ctrl-C re-raised after a garbage-collector
    callback lands on an arbitrary call) finds it there before ``create`` has returned it."""
    run = None
    try:
        with interrupts_deferred():
            run = new_run_dir(out_dir, name)
            run.config_path.write_text(config_json + "\n")
            fill(run)
            made.append(run)
    except BaseException as error:
        if run is not None:
            with interrupts_deferred():
                discard(run)
        raise_as_user_error(error, None, where=out_dir)  # a full disk: one line
        if isinstance(error, OSError | ValueError):
            raise UserError(str(error)) from None
        raise
    return run


def open_incomplete_run_dir(path: str | os.PathLike[str], lock: bool = True) -> RunDir:
    """Reopen and lock a killed run's ``.incomplete`` directory for ``--resume`` (``lock``
    False: unlocked, for the processes of a run whose process 0 holds the lock)."""
    p = Path(path).absolute()
    if not p.is_dir():
        raise ValueError(f"--resume {p}: no such directory; fix: pass the run's .incomplete dir")
    if p.name.endswith(INCOMPLETE_SUFFIX):
        final = p.with_name(p.name[: -len(INCOMPLETE_SUFFIX)])
        if final.exists():
            raise ValueError(
                f"--resume {p}: {final} already exists, so the resumed run could not be renamed "
                f"to it; fix: move {final} away first"
            )
        if not lock:
            return RunDir(path=p, final_path=final)
        try:
            run_lock = RunLock(p)
        except FileNotFoundError:  # renamed since the check above
            run_lock = None
        if run_lock is None or not run_lock.holds(p):  # completed by the lock's holder just now
            if run_lock is not None:
                run_lock.release()
            raise ValueError(f"--resume {p}: the run was just completed; nothing to resume")
        _remove_staging(p)
        return RunDir(path=p, final_path=final, lock=run_lock)
    if (p / COMPLETE_MARKER).exists():
        raise ValueError(f"--resume {p}: this run is already complete; nothing to resume")
    raise ValueError(f"--resume {p}: not a run directory; fix: pass the run's .incomplete dir")


def _remove_staging(directory: Path) -> None:
    """Remove what a killed writer was staging (``*.tmp``: :func:`write_atomic`'s files, policy
    bundles' directories); only under the run's lock, where no other writer can be at work."""
    for staged in sorted(directory.rglob("*.tmp"), reverse=True):
        if staged.is_dir() and not staged.is_symlink():
            shutil.rmtree(staged, ignore_errors=True)
        else:
            staged.unlink(missing_ok=True)


def unlock(run: RunDir) -> None:
    """Release this process's lock on ``run`` (if it holds one)."""
    if run.lock is not None:
        run.lock.release()


@contextlib.contextmanager
def interrupts_held() -> Iterator[list[int]]:
    """Hold back Ctrl-C (SIGINT), and SIGTERM where Python handles it (``jdqn.run.termination``),
    for the block; yields the list of the signals received meanwhile, for the caller to deliver
    or report. Only the main thread receives signals; elsewhere this holds nothing."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    # A handler not set from Python (None), or the default or ignore action: leave it be.
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if callable(signal.getsignal(s))]
    previous = {s: signal.signal(s, lambda n, _frame: received.append(n)) for s in held}
    try:
        yield received
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM for the block (:func:`interrupts_held`) and deliver them
    after it: a Ctrl-C between a ``mkdir`` and the clean-up after it, or half-way through that
    clean-up, would leave a ``.incomplete`` directory nothing removes."""
    received: list[int] = []
    try:
        with interrupts_held() as received:
            yield
    finally:
        for number in dict.fromkeys(received):
            signal.raise_signal(number)  # to the handler that was there before


def finalize(run: RunDir, command: str | None = "jdqn walkforward") -> Path:
    """Rename the finished run into place; the last step of every successful run. ``command``:
    the one that resumes it, named when the final name is taken (None: it is run again)."""
    if run.path == run.final_path:
        return run.final_path
    try:
        os.rename(run.path, run.final_path)  # refuses a final directory that holds files
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        raise FinalNameTaken(
            f"{run.final_path}: made by something else while the run ran, so the finished run "
            "cannot take its name; fix: move it away, then"
            + (f": {command} --resume {run.path}" if command else " run it again")
        ) from None
    (run.final_path / LOCK_FILE).unlink(missing_ok=True)
    unlock(run)
    return run.final_path


def left_to_resume(run: RunDir, resumes_from: tuple[str, ...]) -> bool:
    """After a run stopped early: whether it holds a path matching one of ``resumes_from`` (glob
    patterns) to resume from; when it does not, its directory is removed, leaving nothing."""
    with interrupts_deferred():  # a second Ctrl-C must not stop the clean-up half-way
        resumable = any(next(run.path.glob(pattern), None) for pattern in resumes_from)
        if not resumable:
            discard(run)
    return resumable


def discard(run: RunDir) -> None:
    """Remove a run directory that holds nothing worth resuming."""
    shutil.rmtree(run.path, ignore_errors=True)
    unlock(run)


def write_atomic(path: Path, data: bytes | Callable[[IO[bytes]], object]) -> None:
    """Write ``data`` (or what ``data(handle)`` writes) atomically (temp file + rename): a reader
    never sees half a file, a failed write leaves no temp file behind and its ``OSError`` names
    ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would keep the file from others
        with os.fdopen(fd, "wb") as handle:
            data(handle) if callable(data) else handle.write(data)
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno and error.filename is None:  # a write's
            error.filename = str(path)  # (EFBIG, ENOSPC) names no file
        raise


def umask() -> int:
    """The process's umask, read without setting it (``os.umask`` sets it for every thread)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # no /proc: the only other way to read it
    os.umask(mask)
    return mask


def make_staging_dir(final: Path) -> Path:
    """An empty directory beside ``final`` to fill and rename to it, with the mode ``mkdir`` gives
    (``mkdtemp``'s 0700 would keep it from others); its ``.tmp`` name marks it as debris if the
    process is killed (removed at ``--resume``)."""
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
    os.chmod(staging, 0o777 & ~umask())
    return staging


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically (``write_atomic``)."""
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"
    write_atomic(path, text.encode())


def named_arrays(tree: Any) -> dict[str, np.ndarray]:
    """The leaves of ``tree`` as numpy arrays named by their tree paths (``params/head/kernel``):
    the entries of a :func:`write_arrays` file."""
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    named = {jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(x) for p, x in leaves}
    if len(named) != len(leaves):
        raise ValueError("two leaves of the tree have one name")
    return named


def write_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write named arrays atomically as one uncompressed ``.npz`` (``write_atomic``); checkpoints
    and policy bundles save parameters this way, :func:`read_arrays` reads them."""
    write_atomic(path, lambda handle: np.savez(handle, **arrays))  # type: ignore[arg-type]


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a :func:`write_arrays` file, by name (zip's CRC checks each as it is read)."""
    with np.load(path) as stored:
        return {name: stored[name] for name in stored.files}
