"""SIGTERM (what a cluster scheduler sends before it kills a job) ends a run the way Ctrl-C does,
but at a chunk boundary, with the state checkpointed there.

:func:`sigterm_raises` makes SIGTERM raise :class:`Terminated`, a ``KeyboardInterrupt``, so every
Ctrl-C clean-up runs for it. Inside :class:`ChunkBoundaries` (the training loop) the signal only
sets a flag: the loop checkpoints the chunk's state and raises :class:`Terminated` itself. The CLI
exits 143 (128 + SIGTERM), as a shell would. Only the main thread's signals are changed.

Python cannot propagate an exception raised inside a garbage-collector callback (JAX registers
one) or a finaliser: it hands it to ``sys.unraisablehook`` and goes on. A SIGTERM or Ctrl-C
handled there would be lost and the run would finish as if never asked to stop, so inside
:func:`sigterm_raises` such a :class:`Terminated` or ``KeyboardInterrupt`` sends its signal
again, from another thread: the main thread handles it in the code it runs next.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise Terminated


def _send_again(previous: Callable[[Any], None], unraisable: Any) -> None:
    """``sys.unraisablehook``: a dropped :class:`Terminated` or ``KeyboardInterrupt`` is
    signalled again (not printed)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        terminated = isinstance(unraisable.exc_value, Terminated)
        signum = signal.SIGTERM if terminated else signal.SIGINT
        threading.Thread(target=_signal_soon, args=(signum,), daemon=True).start()
    else:
        previous(unraisable)


def _signal_soon(signum: int) -> None:
    # After a pause, so that the main thread has left this hook: the handler raising inside the
    # hook itself would be dropped for good (a drop in another callback comes back here).
    time.sleep(0.01)
    os.kill(os.getpid(), signum)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (the handler before is restored)."""
    if not _on_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: _send_again(previous_hook, unraisable)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)


class ChunkBoundaries:
    """Within the block, a SIGTERM only sets :attr:`requested`; the loop checks it after each
    chunk. A request the loop did not act on is delivered again when the block ends. Does
    nothing unless SIGTERM raises :class:`Terminated` (:func:`sigterm_raises`)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None  # sigterm_raises's handler, while this one replaces it

    def _note(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.requested = True

    def __enter__(self) -> ChunkBoundaries:
        if _on_main_thread() and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            self._previous = signal.signal(signal.SIGTERM, self._note)
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        if self._previous is None:
            return
        signal.signal(signal.SIGTERM, self._previous)
        if self.requested and error is None:
            raise Terminated
