"""I/O faults (a full disk, a quota, a read-only or failing file system) reported in one line.

An ``OSError`` can reach a run from many writers, some of which wrap it in an error of their own
that keeps only the errno in its message. :func:`io_problem` finds it in an exception's chain
and says what and where; :func:`raise_as_user_error` raises it as an :class:`IOFault` that also
says how to go on: resume the run (jdqn.run.checkpoint verifies its checkpoints) or start it again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

# errno values that mean "the storage failed", not "the program is wrong".
STORAGE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EIO: "input/output error",
    errno.EFBIG: "file too large",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
# How wrappers quote an errno in their messages.
_QUOTED = re.compile(r"(?:\[Errno (\d+)\]|errno[ =:]+(\d+))", re.IGNORECASE)
_STRERRORS = {os.strerror(number).lower(): number for number in STORAGE_ERRNOS}


class UserError(ValueError):
    """A problem with the user's input: reported as one line, exit status 2, no traceback (the
    ``jdqn`` command reports every ``ValueError`` so)."""


@contextlib.contextmanager
def as_user_error(*errors: type[Exception]) -> Iterator[None]:
    """``errors`` raised inside become a ``UserError`` with the same one-line message."""
    try:
        yield
    except errors as error:
        raise UserError(str(error)) from None


class IOFault(ValueError):
    """A run stopped by a storage failure; the message names the path, the problem and the fix."""


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _locate(error: BaseException) -> tuple[str | None, str, bool] | None:
    """(path or None, problem, whether the path was read from a wrapper's text) when ``error``
    or what caused it is a storage failure."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in STORAGE_ERRNOS:
            filename = None if link.filename is None else str(link.filename)
            return filename, STORAGE_ERRNOS[link.errno], False
        text = str(link)
        for match in _QUOTED.finditer(text):
            number = int(next(group for group in match.groups() if group))
            if number in STORAGE_ERRNOS:
                return _first_path(text), STORAGE_ERRNOS[number], True
        lowered = text.lower()
        for strerror, number in _STRERRORS.items():
            if strerror in lowered:
                return _first_path(text), STORAGE_ERRNOS[number], True
    return None


def io_problem(error: BaseException) -> str | None:
    """``"<path>: <problem>"`` (or just the problem) when ``error`` or what caused it is a storage
    failure, else ``None``."""
    found = _locate(error)
    if found is None:
        return None
    path, problem, _ = found
    return f"{path}: {problem}" if path is not None else problem


def _first_path(text: str) -> str | None:
    """The first absolute path quoted in a wrapper's message (not the tail of a relative name
    such as an array's ``"params.bias/0.0"``)."""
    match = re.search(r"(?:^|(?<=[\s'\"(]))(/[^\s'\"\],:]+)", text)
    return match.group(1) if match else None


def raise_as_user_error(
    error: BaseException,
    resume_dir: os.PathLike[str] | None,
    where: str | os.PathLike[str] | None = None,
    command: str = "jdqn walkforward",
) -> None:
    """Raise :class:`IOFault` for a storage failure (else return): one line with the fix,
    ``command --resume resume_dir`` when ``resume_dir`` holds something to resume from (a
    sweep's own command, also for a failure one of its walk-forward runs already said).
    ``where``: the directory the user named (the run's): a failure a library reports inside it
    is named by it and the part written (``checkpoints/group0/4``), not by the library's internal
    file."""
    found = _locate(error)
    if found is None:
        return
    path, problem, quoted = found
    named = f"{path}: {problem}" if path is not None else problem
    root = None if where is None else Path(where).absolute()  # library paths are absolute
    if root is not None and (path is None or quoted and Path(path).is_relative_to(root)):
        # A library's internal file: the run and the part written.
        inside = "/".join(Path(path).relative_to(root).parts[:3]) if path is not None else ""
        named = f"{where}: {problem}" + (f" (writing {inside})" if inside else "")
    then = "then run it again"
    if resume_dir is not None:
        then = f"then resume with: {command} --resume {resume_dir}"
    raise IOFault(f"{named}; fix: free space or fix the file system, {then}") from None
