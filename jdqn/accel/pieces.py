"""The test and benchmark override of which implementation each piece runs: the environment
variable :data:`KERNELS_ENV` (``JDQN_KERNELS``), e.g. ``tail=interpret,dense=autodiff``.

Not a user setting (users have ``accel.kernels``); it lets a test check one piece's forms
against each other and a benchmark time each against its plain form. It imports nothing of
jdqn, so every module holding a piece reads it without a cycle. It is read at trace time, so it
is part of the stored executables' key (``jdqn.accel.executables``); as JAX caches traces by
function,
trace a new function under another value (a learner's step uses :func:`traced_under`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import jax

KERNELS_ENV = "JDQN_KERNELS"

# Each piece's implementations, "auto" the default (jdqn.accel resolves the projection's and
# the tail's against the backend and the number of learners).
CHOICES: dict[str, tuple[str, ...]] = {
    "projection": ("auto", "pallas", "interpret", "reference", "xla_hat", "xla_scatter"),
    "tail": ("auto", "pallas", "interpret", "xla"),
    # jdqn.agent.dense_stack: the hand-written backward with its vmap rule, or JAX's autodiff.
    "dense": ("auto", "custom", "autodiff"),
    # jdqn.agent.losses.c51_head and causal_kl: closed-form custom_vjp gradients, or JAX's autodiff.
    "vjp": ("auto", "closed", "autodiff"),
    # The layout/fusion-steering lax.optimization_barrier calls (:func:`barrier`), or identity.
    "barriers": ("auto", "on", "off"),
    # jdqn.accel.executables: compiled programs stored on disk (on a GPU), or none (JAX's own
    # cache).
    "executables": ("auto", "on", "off"),
}

# What "auto" is for the pieces whose choice needs no backend.
_AUTO = {"dense": "custom", "vjp": "closed", "barriers": "on", "executables": "on"}


def parse(spec: str) -> dict[str, str]:
    """``"PIECE=IMPL,..."`` as ``{piece: impl}``; a ValueError naming the choices if malformed."""
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


def spec_now() -> str:
    """:data:`KERNELS_ENV`'s value now ("" when unset)."""
    return os.environ.get(KERNELS_ENV, "")


def piece(name: str) -> str:
    """``name``'s implementation under :data:`KERNELS_ENV` now: "auto" resolved for the pieces
    that need no backend (``dense``, ``vjp``, ``barriers``, ``executables``); "auto" itself
    for the others."""
    choice = parse(spec_now()).get(name, "auto")
    return _AUTO.get(name, choice) if choice == "auto" else choice


def barrier[T](x: T) -> T:
    """``jax.lax.optimization_barrier(x)``, or ``x`` itself under ``barriers=off``. Call it in
    the traced code itself: a function handed to a cached trace (a cond's branch, a custom rule)
    keeps its first trace's choice unless it is new per trace or the choice is its argument."""
    return jax.lax.optimization_barrier(x) if piece("barriers") == "on" else x


@contextlib.contextmanager
def forced(spec: str) -> Iterator[None]:
    """For tests and benchmarks: what is traced inside runs the pieces ``spec`` names (e.g.
    ``"tail=interpret"``); :data:`KERNELS_ENV`'s previous value is restored on exit."""
    parse(spec)  # a bad spec raises here, not at the next make_learner
    before = os.environ.get(KERNELS_ENV)
    os.environ[KERNELS_ENV] = spec
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(KERNELS_ENV, None)
        else:
            os.environ[KERNELS_ENV] = before


def traced_under[**P, R](spec: str, fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` run under ``forced(spec)``: whenever it is traced, the pieces read inside are
    those of ``spec`` (a learner's step traces under the override its ``make_learner`` saw)."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with forced(spec):
            return fn(*args, **kwargs)

    return run
