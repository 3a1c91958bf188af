"""``python -m jdqn`` and the ``jdqn`` console script (:func:`run`).

Ctrl-C and SIGTERM are answered from jdqn's first line: until :func:`jdqn.cli.console` installs
the run's handlers, loading the command's modules (about a second, more on a busy machine) would
otherwise end by the signal's default action (SIGTERM: killed without a word) or with a
``KeyboardInterrupt`` traceback. Nothing is written by then, so the process ends at once with the
line and status the command gives later (``jdqn: terminated``, 143; ``jdqn: interrupted``, 130).
A signal the process started with ignored (a background job's SIGINT) stays ignored.
"""

import os
import signal
import sys
from types import FrameType

_ENDINGS = {
    signal.SIGINT: (b"jdqn: interrupted\n", 130),
    signal.SIGTERM: (b"jdqn: terminated\n", 143),
}


def _end_while_loading(signum: int, frame: FrameType | None) -> None:
    line, code = _ENDINGS[signal.Signals(signum)]
    os.write(2, line)
    os._exit(code)


def run() -> None:
    """The ``jdqn`` command: its modules loaded under :func:`_end_while_loading`, then
    :func:`jdqn.cli.console` with the handlers the process started with."""
    before = {
        signum: signal.signal(signum, _end_while_loading)
        for signum in _ENDINGS
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    from jdqn.cli import console
    from jdqn.run import termination  # noqa: F401  # console's own import: none left after this

    for signum, handler in before.items():
        signal.signal(signum, handler)
    sys.exit(console())


if __name__ == "__main__":
    run()
