"""I/O faults (a full disk, a quota, a read-only or failing file system) reported in one line.

An ``OSError`` can reach a run from many writers, some of which (orbax's threads, tensorstore) wrap
it and keep only the errno in their message. :func:`io_problem` finds it in an exception's chain
and says what and where; :func:`raise_as_user_error` raises it as an :class:`IOFault` that also
says how to go on: resume the run (jdqn.run.checkpoint verifies its checkpoints) or start it again.
"""

from __future__ import annotations

import errno
import os
import re

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
# How wrappers (tensorstore, orbax) quote an errno in their messages.
_QUOTED = re.compile(r"(?:\[Errno (\d+)\]|OS error (\d+)|errno[ =:]+(\d+))", re.IGNORECASE)
_STRERRORS = {os.strerror(number).lower(): number for number in STORAGE_ERRNOS}


class IOFault(ValueError):
    """A run stopped by a storage failure; the message names the path, the problem and the fix."""


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def io_problem(error: BaseException) -> str | None:
    """``"<path>: <problem>"`` (or just the problem) when ``error`` or what caused it is a storage
    failure, else ``None``."""
    for link in _chain(error):
        if isinstance(link, OSError) and link.errno in STORAGE_ERRNOS:
            problem = STORAGE_ERRNOS[link.errno]
            return f"{link.filename}: {problem}" if link.filename is not None else problem
        text = str(link)
        for match in _QUOTED.finditer(text):
            number = int(next(group for group in match.groups() if group))
            if number in STORAGE_ERRNOS:
                return _with_path(text, STORAGE_ERRNOS[number])
        lowered = text.lower()
        for strerror, number in _STRERRORS.items():
            if strerror in lowered:
                return _with_path(text, STORAGE_ERRNOS[number])
    return None


def _with_path(text: str, problem: str) -> str:
    """The first absolute path quoted in a wrapper's message, with ``problem``."""
    match = re.search(r"(/[^\s'\"\],:]+)", text)
    return f"{match.group(1)}: {problem}" if match else problem


def raise_as_user_error(error: BaseException, resume_dir: os.PathLike[str] | None) -> None:
    """Raise :class:`IOFault` for a storage failure (else return): one line with the fix, the
    ``--resume`` command when ``resume_dir`` holds checkpoints to resume from."""
    problem = io_problem(error)
    if problem is None:
        return
    then = "then run it again"
    if resume_dir is not None:
        then = f"then resume with: jdqn walkforward --resume {resume_dir}"
    raise IOFault(f"{problem}; fix: free space or fix the file system, {then}") from None
