"""SIGTERM (what a cluster scheduler sends before it kills a job) and Ctrl-C (SIGINT) end a run
at a chunk boundary, with the state checkpointed there (docs/design.md §18). Only the main
thread's signals are changed.

Python cannot propagate an exception raised inside a garbage-collector callback (JAX registers
one) or a finaliser: it hands it to ``sys.unraisablehook`` and goes on. A SIGTERM or Ctrl-C
handled there would be lost and the run would finish as if never asked to stop, so inside
:func:`sigterm_raises` such a :class:`Terminated` or ``KeyboardInterrupt`` is raised again by a
profile function (``sys.setprofile``, this thread only) at the first event outside the hook: in
the code the main thread runs next, with no thread and no timing involved. A signal handled
while the hook itself runs is raised the same way.

Nor is one raised inside importlib's own code (a lazy import on the main thread): raised right
after importlib takes its global import lock, before the ``try`` that gives it back, it leaves the
lock held for good. The next import on another thread (the writer thread's) then waits for ever,
while the main thread waits for that thread. It is raised the same way, at the first event
outside importlib: in the imported module's code, or back in its importer's.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


class Terminated(KeyboardInterrupt):
    """The process received SIGTERM."""


def _raise(kind: type[KeyboardInterrupt], signum: int, frame: FrameType | None) -> None:
    del signum
    if _in_hook(frame) or _in_importlib(frame):  # dropped for good, or a lock left held
        _raise_after_hook(kind)
        return
    raise kind


_raise_terminated = functools.partial(_raise, Terminated)
_raise_interrupt = functools.partial(_raise, KeyboardInterrupt)


def _in_hook(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code is _send_again.__code__:
            return True
        frame = frame.f_back
    return False


# importlib's own modules (frozen or not), by their frames' ``__name__``.
_IMPORTLIB = frozenset({"importlib._bootstrap", "importlib._bootstrap_external"})


def _in_importlib(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs importlib's own code (not a module's that it imports)."""
    return frame is not None and frame.f_globals.get("__name__") in _IMPORTLIB


def _raise_after_hook(kind: type[KeyboardInterrupt]) -> None:
    """Raise ``kind`` on this thread at its first profiling event (a call or a return) outside
    the unraisable hook and importlib's own code; a profile function this replaces is put back
    first."""
    previous = sys.getprofile()
    if isinstance(previous, functools.partial) and previous.func is _profile_raise:
        return  # already on its way
    sys.setprofile(functools.partial(_profile_raise, kind, previous))


def _profile_raise(
    kind: type[KeyboardInterrupt], previous: Any, frame: FrameType, event: str, arg: Any
) -> None:
    del event, arg
    # The first events come from the signal handler's own frames as they return (into the frame
    # it interrupted): raised there, the stop would leave them into importlib after all.
    if frame.f_code not in _HANDLER_CODE and not _in_hook(frame) and not _in_importlib(frame):
        sys.setprofile(previous)
        raise kind


_HANDLER_CODE = frozenset({_raise.__code__, _raise_after_hook.__code__})


def _send_again(previous: Callable[[Any], None], unraisable: Any) -> None:
    """``sys.unraisablehook``: a dropped :class:`Terminated` or ``KeyboardInterrupt`` is raised
    again after the hook (not printed)."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _raise_after_hook(type(unraisable.exc_value))
    else:
        previous(unraisable)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` inside the block, and Ctrl-C ``KeyboardInterrupt`` where
    Python's default handler had it (the handlers before are restored)."""
    if not _on_main_thread():
        yield
        return
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _raise_terminated)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (SIG_IGN)
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _raise_interrupt)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_send_again, previous_hook)
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class ChunkBoundaries:
    """Within the block, a SIGTERM or Ctrl-C only sets :attr:`requested`; the loop checks it
    after each chunk and raises :meth:`interruption`. A request the loop did not act on is
    delivered when the block ends. Does nothing for a signal :func:`sigterm_raises` does not
    handle."""

    def __init__(self) -> None:
        self.requested = False
        self._received: list[int] = []
        self._previous: dict[int, Any] = {}  # sigterm_raises's handlers, while _note replaces them

    def _note(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self._received.append(signum)
        self.requested = True

    def interruption(self) -> KeyboardInterrupt:
        """What the loop raises: ``KeyboardInterrupt`` when Ctrl-C came first, else
        :class:`Terminated` (also for a stop asked by another process of the run)."""
        return KeyboardInterrupt() if self._received[:1] == [signal.SIGINT] else Terminated()

    def __enter__(self) -> ChunkBoundaries:
        if _on_main_thread():
            ours = {signal.SIGTERM: _raise_terminated, signal.SIGINT: _raise_interrupt}
            for signum, handler in ours.items():
                if signal.getsignal(signum) is handler:
                    self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self.requested and error is None:
            raise self.interruption()
