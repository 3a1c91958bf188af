"""SIGTERM (what a cluster scheduler sends before it kills a job) ends a run the way Ctrl-C does,
but at a chunk boundary, with the state checkpointed there.

:func:`sigterm_raises` makes SIGTERM raise :class:`Terminated` (a ``KeyboardInterrupt``, so every
clean-up that runs for a Ctrl-C runs for it: a run directory without a checkpoint is removed, one
with a checkpoint is kept and its ``--resume`` command printed). Inside :class:`ChunkBoundaries`
(the training loop) the signal only sets a flag: the chunk on the device ends, the loop
checkpoints the state it returned and raises :class:`Terminated` itself. The CLI exits 143
(128 + SIGTERM), as a shell reports a process ended by the signal. Signals reach the main thread
only; elsewhere nothing is changed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise Terminated


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block (the handler before is restored)."""
    if not _on_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class ChunkBoundaries:
    """Within the block, a SIGTERM only sets :attr:`requested`; the loop checks it after each
    chunk. A request the loop did not act on is delivered again when the block ends. Does
    nothing unless SIGTERM raises :class:`Terminated` (:func:`sigterm_raises`)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None
        self._installed = False

    def _note(self, signum: int, frame: FrameType | None) -> None:
        del signum, frame
        self.requested = True

    def __enter__(self) -> ChunkBoundaries:
        if _on_main_thread() and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            self._previous = signal.signal(signal.SIGTERM, self._note)
            self._installed = True
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if not self._installed:
            return
        signal.signal(signal.SIGTERM, self._previous)  # type: ignore[arg-type]
        if self.requested and error is None:
            raise Terminated
