"""Console output of the ``jdqn`` command through :mod:`logging` (logger ``jdqn``).

Records below WARNING go to stdout and the rest to stderr, each as its bare message; ``-q``
keeps warnings and errors only, ``-v`` adds DEBUG records and the libraries' own error logs.
Streams are looked up when a record is written, so a replaced ``sys.stdout`` (pytest's capture, a
redirect) receives it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any

LOGGER_NAME = "jdqn"


class _ConsoleHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
        # A closed or vanished reader, as in `jdqn ... | head`, is not the command's failure.
        with contextlib.suppress(OSError, ValueError):
            print(self.format(record), file=stream)


def configure(verbose: int = 0, quiet: bool = False) -> logging.Logger:
    """The ``jdqn`` logger at INFO (DEBUG with ``verbose``, WARNING with ``quiet``), with one
    console handler however often it is called."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        handler = _ConsoleHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    # Not also through the root logger, which libraries (absl, via JAX) give a handler of their
    # own: every line would print twice.
    logger.propagate = False
    # orbax (absl's logger) and tensorstore's tasks (asyncio's) log each storage failure or
    # damaged checkpoint with tracebacks on their threads; jdqn reports it in one line, so theirs
    # are shown with -v only.
    for library in ("absl", "asyncio"):
        logging.getLogger(library).setLevel(logging.NOTSET if verbose else logging.CRITICAL + 1)
    if not verbose and not isinstance(sys.unraisablehook, _WithoutClosedLoops):
        sys.unraisablehook = _WithoutClosedLoops(sys.unraisablehook)
    return logger


class _WithoutClosedLoops:
    """``sys.unraisablehook`` without the "Event loop is closed" errors that tensorstore's threads
    report when reads or writes finish after orbax closed its event loop (a damaged checkpoint,
    a full disk: one traceback per array; jdqn's own line says what happened)."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook

    def __call__(self, unraisable: Any) -> None:
        value = unraisable.exc_value
        if not (type(value) is RuntimeError and str(value) == "Event loop is closed"):
            self.hook(unraisable)
