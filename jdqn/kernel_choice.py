"""Which implementation of each GPU-specialised piece the learner step runs (docs/design.md §12).

Users choose with the ``accel`` config section:

- ``accel.kernels=auto`` (default): each Pallas kernel where it pays off. The C51 projection runs
  as a kernel on any GPU; the step's flat tail (surgery reductions, Adam, target sync, guard
  select) runs as kernels on a GPU for programs that step 16 or more vmapped learners together,
  outside debug mode (``jdqn.accel``); XLA runs the rest.
- ``accel.kernels=off``: no kernel anywhere (the projection's pure-jnp form, XLA's fusions for the
  tail): the plain path, to compare against or to rule the kernels out.

Tests and benchmarks need more: one piece at a time, and Pallas's interpret mode, which runs a
kernel on the CPU (slowly) so that CI checks the kernels without a GPU. That is not a user
setting; it is reached only through the environment variable :data:`KERNELS_ENV`, e.g.
``JDQN_KERNELS=tail=interpret,projection=reference`` (see :func:`forced`). The variable is part
of the stored executables' key (``jdqn.executables``), so programs built under it are never
mixed up with others.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import NamedTuple

from jdqn.config import AccelConfig

KERNELS_ENV = "JDQN_KERNELS"

# Each piece's implementations (the projection's are pallas_kernels.c51_projection's ``impl``).
CHOICES: dict[str, tuple[str, ...]] = {
    "projection": ("auto", "pallas", "interpret", "reference", "xla_hat", "xla_scatter"),
    "tail": ("auto", "pallas", "interpret", "xla"),
}


class Kernels(NamedTuple):
    """The implementation of each piece, before ``auto`` meets the backend and learner count."""

    projection: str  # one of CHOICES["projection"]
    tail: str  # one of CHOICES["tail"]


def kernels_for(accel: AccelConfig) -> Kernels:
    """``accel`` as implementations, with the test override of :data:`KERNELS_ENV` applied."""
    chosen = Kernels("auto", "auto")
    if accel.kernels == "off":
        chosen = Kernels("reference", "xla")
    return chosen._replace(**_parse(os.environ.get(KERNELS_ENV, "")))


def _parse(spec: str) -> dict[str, str]:
    pieces: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        piece, _, impl = item.partition("=")
        if impl not in CHOICES.get(piece, ()):
            raise ValueError(
                f"{KERNELS_ENV}={spec!r}: {item!r} is not PIECE=IMPL; fix: give comma-separated "
                f"choices from {CHOICES}, or unset {KERNELS_ENV}"
            )
        pieces[piece] = impl
    return pieces


@contextlib.contextmanager
def forced(spec: str) -> Iterator[None]:
    """For tests and benchmarks: learners built inside run the pieces ``spec`` names (e.g.
    ``"tail=interpret"``); :data:`KERNELS_ENV`'s previous value is restored on exit."""
    _parse(spec)  # a bad spec raises here, not at the next make_learner
    before = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = spec
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = before
