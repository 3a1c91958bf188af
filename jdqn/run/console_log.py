"""Console output of the ``jdqn`` command through :mod:`logging` (logger ``jdqn``).

Records below WARNING go to stdout and the rest to stderr, each as its bare message; ``-q``
keeps warnings and errors only, ``-v`` adds DEBUG records. Streams are looked up when a record
is written, so a replaced ``sys.stdout`` (pytest's capture, a redirect) receives it.
"""

from __future__ import annotations

import contextlib
import logging
import sys

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
    return logger
