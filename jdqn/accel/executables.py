"""Compiled programs kept on disk, so a warm start skips tracing and lowering too.

JAX's persistent compilation cache (``jdqn.run.walkforward.enable_compilation_cache``) is keyed on
the lowered program, so every process still traces and lowers before the lookup, a large share of a
warm walk-forward. Here the executable itself is stored (``jax.experimental.serialize_executable``)
under a key computed without tracing from all that can change the program (:func:`cache_key`):
jdqn's and its kernels' source, library versions and JAX's settings, the backend, ``XLA_FLAGS``, the
caller's description of what the function closes over (each speed piece's implementation,
``jdqn.accel.Pieces``, among it), and the arguments' abstract signature. So a compiled function must
close over no arrays (pass data as arguments).

An unreadable file (a partial write, another jaxlib) is compiled again and replaced. Loading runs
what a file holds (a pickle, then machine code), so the cache is used only where no one else can
have written it (:func:`untrusted`): a directory or file of another user, or one that group or
others may write, is neither loaded from nor written to (one warning; programs are compiled).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import logging
import os
import pickle
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

from jdqn.run import rundir

SUFFIX = ".jaxexe"
_debug = logging.getLogger("jdqn.accel").debug  # -v: compile times
# The libraries whose code runs while jdqn's functions are traced.
_TRACED_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "numpy")
# JAX settings that only say where caches and logs go; every other setting is in the key.
_IGNORED_CONFIG = ("cache", "_dir", "log", "explain")


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 of every Python file of the ``jdqn`` and ``pallas_kernels`` packages."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for package in ("jdqn", "pallas_kernels"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    # The modules' own __version__ (all are imported by jdqn already), not importlib.metadata,
    # which parses every installed distribution's metadata: slow, and paid per key.
    return ",".join(
        f"{name}={getattr(importlib.import_module(name), '__version__', '?')}"
        for name in _TRACED_LIBRARIES
    )


def _jax_settings() -> str:
    settings = jax.config.values.items()
    kept = [(k, repr(v)) for k, v in settings if not any(part in k for part in _IGNORED_CONFIG)]
    return repr(sorted(kept))


def _backend() -> str:
    first, count = jax.devices()[0], len(jax.devices())
    return f"{first.platform}:{first.device_kind}:{count}:{first.client.platform_version}"


def signature(args: tuple[Any, ...]) -> str:
    """The abstract signature of ``args``: tree structure and each leaf's type (shape, dtype,
    weak type), which is what a jitted function specialises on."""
    leaves, tree = jax.tree.flatten(args)
    return f"{tree}|" + ";".join(str(jax.typeof(leaf)) for leaf in leaves)


def cache_key(name: str, context: str, args: tuple[Any, ...]) -> str:
    """The file key of program ``name`` built from ``context`` and called on ``args``."""
    parts = [name, context, signature(args), source_fingerprint(), _versions(), _jax_settings()]
    parts += [_backend(), os.environ.get("XLA_FLAGS", "")]
    return hashlib.sha256("".join(part + "\0" for part in parts).encode()).hexdigest()[:32]


def untrusted(path: Path) -> str | None:
    """Why files under ``path`` may have been written by another user, or None: ``path`` (a
    directory or file) owned by another user or writable by group or others (a missing path is
    made by this user when first written)."""
    try:
        info = path.stat()
    except OSError:  # missing or unreachable: nothing is read from it
        return None
    if info.st_uid != os.getuid():
        return f"{path} belongs to uid {info.st_uid}, not to this user"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def refuse_untrusted(directory: Path, what: str) -> bool:
    """True, with one warning naming the fix, when :func:`untrusted` refuses ``directory``."""
    problem = untrusted(directory)
    if problem is not None:
        logging.getLogger("jdqn").warning(
            f"jdqn: not using the {what} in {directory}: {problem}, so its files could run "
            f"another user's code; fix: chmod go-w {directory}, or set JDQN_CACHE_DIR to a "
            "directory of your own"
        )
    return problem is not None


class ExecutableCache:
    """Compiles jitted functions through a directory of serialized executables (``None``: off,
    :meth:`compile` only compiles). ``hits`` and ``misses`` count loads and compiles."""

    def __init__(self, directory: Path | None) -> None:
        if directory is not None:  # made private here: a group-writable one would be refused
            with contextlib.suppress(OSError):  # else stores fail quietly, as a full disk does
                directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if refuse_untrusted(directory, "stored programs"):
                directory = None
        self.directory = directory
        self.hits = 0
        self.misses = 0
        self._count = threading.Lock()  # programs may be compiled on several threads at once

    def load(self, name: str, *args: Any, context: str) -> Any | None:
        """The stored program ``name`` for ``args`` (a ``jax.stages.Compiled``, whose ``out_info``
        gives the output types without tracing), or None when there is none or the cache is off."""
        if self.directory is None:
            return None
        path = self._path(name, context, args)
        if untrusted(path) is not None:  # compiled again and replaced by this user's own file
            return None
        try:
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            loaded = serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        except Exception:  # none, or a partial or foreign file: compiled again and replaced
            return None
        with self._count:
            self.hits += 1
        return loaded

    def compile(self, name: str, jitted: Any, *args: Any, context: str) -> Callable[..., Any]:
        """``jitted`` (a ``jax.jit`` function that closes over no arrays) compiled for ``args``,
        loaded when stored under the same key, else compiled and stored; called like ``jitted``
        on arguments of the same signature (donation included)."""
        started = time.perf_counter()
        loaded = self.load(name, *args, context=context)
        if loaded is not None:
            _debug("jdqn: %s: stored program loaded in %.2f s", name, time.perf_counter() - started)
            return loaded
        compiled = jitted.lower(*args).compile()
        _debug("jdqn: %s: traced and compiled in %.2f s", name, time.perf_counter() - started)
        if self.directory is not None:
            with self._count:
                self.misses += 1
            _store(self._path(name, context, args), compiled)
        return compiled

    def _path(self, name: str, context: str, args: tuple[Any, ...]) -> Path:
        assert self.directory is not None
        return self.directory / f"{name}-{cache_key(name, context, args)}{SUFFIX}"


def _store(path: Path, compiled: Any) -> None:
    """Writes ``compiled`` to ``path`` whole or not at all; a program that cannot be serialised
    or a directory that cannot be written only costs the next process a compile."""
    try:
        rundir.write_atomic(path, pickle.dumps(serialize_executable.serialize(compiled)))
    except (ValueError, NotImplementedError, pickle.PicklingError, TypeError, OSError):
        return
