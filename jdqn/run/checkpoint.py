"""Epoch-end checkpoints that resume a killed run with bit-identical numbers (docs/design.md §7,
§18): each step is one ``<step>.npz`` (``rundir.write_arrays``; typed PRNG keys as their raw data,
the metadata as JSON) beside a SHA-256 manifest ``sha256/<step>.json``, verified on restore; each
process of a run of several saves its own share of the learners in its own folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.run import rundir

if TYPE_CHECKING:
    from jdqn.run.binding import Seal
    from jdqn.run.processes import Processes

_debug = logging.getLogger("jdqn.run").debug

META = "__meta__"  # the metadata's entry (JSON text) in a step's .npz
# The most of a run's time the checkpoints' host copies may take: after a copy of at least
# SLOW_COPY_S (a sweep wave's 11 GiB), a save is skipped until 1 / COPY_SHARE times as long has
# passed since it (SaveCadence). Quicker copies never skip one.
COPY_SHARE = 0.04
SLOW_COPY_S = 1.0


def _is_typed_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _to_storable(tree: Any) -> Any:
    """Typed PRNG keys become their raw uint32 data (an .npz holds plain arrays only)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_typed_key(x) else x, tree)


def _from_storable(stored: Any, like: Any) -> Any:
    """Raw key data back into typed keys where ``like`` has them (undoes :func:`_to_storable`)."""
    wrap = lambda s, ref: jax.random.wrap_key_data(s, impl=jax.random.key_impl(ref))
    return jax.tree.map(lambda s, ref: wrap(s, ref) if _is_typed_key(ref) else s, stored, like)


def all_finite(tree: Any) -> bool:
    """True when every floating leaf is finite (checked on the host before any save)."""
    leaves = jax.tree.leaves(_to_storable(tree))
    return all(np.isfinite(x).all() for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))


class CheckpointLayoutError(ValueError):
    """A checkpoint whose state tree does not match the state this jdqn builds."""


class CheckpointCorruptError(ValueError):
    """A checkpoint that cannot be read, has no manifest, or whose digests do not match it."""


class NoIntactCheckpointError(ValueError):
    """Every checkpoint of a run failed verification: there is nothing to resume from."""


def state_digest(arrays: dict[str, np.ndarray]) -> str:
    """SHA-256 over named arrays (:func:`jdqn.run.rundir.named_arrays`): each one's name, dtype,
    shape and bytes, in the order of the names."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array)  # its buffer, without a copy
    return digest.hexdigest()


def meta_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of the metadata as canonical JSON."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


class Checkpointer:
    """Saves ``(state, meta)`` as ``<step>.npz`` in ``directory``, with its manifest
    ``sha256/<step>.json``; keeps the latest two.

    A save copies the state to the host and returns; a thread writes the manifest, then the step
    atomically (temporary file and rename), then deletes the steps before the latest two, while
    the next epoch trains (hashlib releases the GIL). A run killed mid-write leaves no
    ``<step>.npz`` of that step and resumes from the one before; :meth:`close` waits for the
    write.
    """

    def __init__(self, directory: Path, accepted: frozenset[str] | None = None) -> None:
        self._directory = directory
        self._accepted = accepted  # the run's binding digests (jdqn.run.binding); None: any
        self._manifests = directory / "sha256"
        self._writing: threading.Thread | None = None  # the last save's writer
        self._writing_error: BaseException | None = None  # raised again on this thread

    def manifest_path(self, step: int) -> Path:
        return self._manifests / f"{step}.json"

    def _step_path(self, step: int) -> Path:
        return self._directory / f"{step}.npz"

    def all_steps(self) -> list[int]:
        return sorted(int(path.stem) for path in self._directory.glob("[0-9]*.npz"))

    def latest_step(self) -> int | None:
        self._wait()  # a save of this process may still be writing
        return max(self.all_steps(), default=None)

    def writing(self) -> bool:
        """Whether the last save is still being written."""
        return self._writing is not None and self._writing.is_alive()

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        # The host copy is taken now: the next training chunk donates the state's device buffers.
        host = jax.device_get(_to_storable(state))
        self._wait()
        self._writing = threading.Thread(
            target=self._write, args=(step, host, meta), name="jdqn-checkpoint-write"
        )
        self._writing.start()

    def _write(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        """The manifest, then the step (so that every step on disk has one), then the pruning."""
        try:
            if not all_finite(host):  # the guard keeps them out of the state: the last defence
                raise RuntimeError("refusing to checkpoint a state with non-finite values")
            arrays = rundir.named_arrays(host)
            digests = {"state_sha256": state_digest(arrays), "meta_sha256": meta_digest(meta)}
            rundir.write_json(self.manifest_path(step), {"step": step, **digests})
            arrays[META] = np.asarray(json.dumps(meta))
            rundir.write_arrays(self._step_path(step), arrays)
            for old in self.all_steps()[:-2]:
                self._delete(old)
            for manifest in self._manifests.glob("*.json"):  # of a step killed mid-write
                if not self._step_path(int(manifest.stem)).exists():
                    manifest.unlink(missing_ok=True)
        except BaseException as error:  # e.g. a full disk: reported by the thread that waits
            self._writing_error = error

    def _wait(self) -> None:
        if self._writing is not None:
            self._writing.join()
            self._writing = None
        if self._writing_error is not None:
            error, self._writing_error = self._writing_error, None
            raise error

    def _as_tree(self, step: int, stored: dict[str, np.ndarray], like: Any) -> Any:
        """The stored arrays in the structure of ``like``'s storable form, or
        :class:`CheckpointLayoutError` (one line) when they are another state's."""
        storable = _to_storable(like)
        expected = rundir.named_arrays(storable)
        mismatch = sorted(set(stored) ^ set(expected)) or [
            name
            for name, leaf in expected.items()
            if (leaf.shape, leaf.dtype) != (stored[name].shape, stored[name].dtype)
        ]
        if mismatch:
            raise CheckpointLayoutError(
                f"checkpoint {self._directory} (step {step}) holds a state of another layout "
                f"({mismatch[0]} differs: written by another jdqn version or config); "
                "fix: start the run again"
            )
        return jax.tree.unflatten(jax.tree.structure(storable), [stored[n] for n in expected])

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore into the structure of ``like`` (e.g. a freshly initialised state), verified
        against the step's manifest (:class:`CheckpointCorruptError` when it fails)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError("no checkpoint to resume from")
        where = f"checkpoint {self._step_path(step)}"
        try:
            manifest = json.loads(self.manifest_path(step).read_text())
        except (OSError, ValueError):
            raise CheckpointCorruptError(f"{where} has no readable checksum manifest") from None
        try:
            stored = rundir.read_arrays(self._step_path(step))
            meta = json.loads(str(stored.pop(META)))
        except Exception as error:  # whatever the zip, .npy or JSON reader fails on: damaged
            first_line = (str(error).strip().splitlines() or [""])[0][:160]
            reason = f"{type(error).__name__}: {first_line}"
            raise CheckpointCorruptError(f"{where} cannot be read ({reason})") from None
        if manifest.get("state_sha256") != state_digest(stored):
            raise CheckpointCorruptError(f"{where}: its arrays do not match their SHA-256")
        if manifest.get("meta_sha256") != meta_digest(meta):
            raise CheckpointCorruptError(f"{where}: its metadata does not match its SHA-256")
        # A checkpoint of another run (copied in) has its own config, learners or data.
        if self._accepted is not None and meta.get("binding", "") not in {"", *self._accepted}:
            raise CheckpointCorruptError(f"{where} belongs to another run (config, seeds or data)")
        return _from_storable(self._as_tree(step, stored, like), like), meta

    def restore_intact(
        self, like: Any, log: Callable[[str], None]
    ) -> tuple[Any, dict[str, Any], int]:
        """The newest checkpoint that verifies, as ``(state, meta, step)``; each newer one that
        does not is refused in one line and deleted (so that training writes its step again).
        :class:`NoIntactCheckpointError` when none verifies."""
        self._wait()
        refused: list[int] = []
        for step in reversed(self.all_steps()):
            try:
                state, meta = self.restore(like, step)
            except CheckpointCorruptError as error:
                log(f"jdqn: refused {error}")
                refused.append(step)
                continue
            for bad in refused:
                self._delete(bad)
            if refused:
                log(f"jdqn: resuming from the previous intact checkpoint, step {step}")
            return state, meta, step
        raise NoIntactCheckpointError(
            f"{self._directory}: no checkpoint passes verification (steps "
            f"{', '.join(map(str, refused)) or 'none'}); fix: start the run again"
        )

    def discard_after(self, step: int) -> None:
        """Delete the checkpoints newer than ``step`` and their manifests."""
        self._wait()
        for newer in self.all_steps():
            if newer > step:
                self._delete(newer)

    def _delete(self, step: int) -> None:
        self._step_path(step).unlink(missing_ok=True)
        self.manifest_path(step).unlink(missing_ok=True)

    def close(self) -> None:
        """Wait for the pending write (and raise its error)."""
        self._wait()


def host(tree: Any, learners: int) -> Any:
    """The first ``learners`` runs of every leaf, on the host: without the device padding."""
    return jax.tree.map(lambda x: np.asarray(x)[:learners], jax.device_get(tree))


class SaveCadence:
    """When a run's next checkpoint may be taken, across its groups: after a host copy of
    SLOW_COPY_S or more, not before 1 / COPY_SHARE times as long has passed since it (a sweep's
    waves each copy 7.5 GiB; a wave after the first takes none of its own sooner)."""

    def __init__(self) -> None:
        self._last_save = time.perf_counter()  # when the last save's host copy ended
        self._last_copy_s = 0.0  # how long it took

    def due(self) -> bool:
        since = time.perf_counter() - self._last_save
        return self._last_copy_s < SLOW_COPY_S or since * COPY_SHARE >= self._last_copy_s

    def copied(self, seconds: float) -> None:
        self._last_copy_s, self._last_save = seconds, time.perf_counter()


class GroupCheckpoints:
    """A group's checkpoints (:class:`Checkpointer`) in ``checkpoints/group<g>/``, or each
    process's own share in ``process-<i>/`` below it (docs/design.md §11)."""

    def __init__(
        self,
        directory: Path,
        *,
        enabled: bool,
        processes: Processes,
        seal: Seal,
        place: Any,
        runs: int,
        chunks_per_epoch: int,
        param_layout: list[list[Any]],
        cadence: SaveCadence | None = None,
    ) -> None:
        """``directory``: the group's; ``place``: how the wave's state is placed
        (``placement.Placement``); ``runs``: the wave's runs; ``param_layout``: saved with each
        checkpoint (``ParamLayout.record``); ``cadence``: the run's (default: the group's own)."""
        self.enabled = enabled
        self._directory = directory
        if processes.count > 1:
            self._directory /= f"process-{processes.index}"
        self._store = Checkpointer(self._directory, seal.accepted) if enabled else None
        self._binding = seal.sha256
        self._place, self._processes = place, processes
        self._indices = processes.share(list(range(runs)))  # its runs in the wave
        self._chunks_per_epoch = chunks_per_epoch
        self._param_layout = param_layout
        self._cadence = cadence or SaveCadence()

    def resume(self, state: Any, log: Callable[[str], None]) -> tuple[Any, dict[str, Any]] | None:
        """The newest intact checkpoint's share of the state, placed as ``state`` is, and its
        metadata (``halted_epoch`` by this process's run index); None without one."""
        if self._store is None:
            return None
        if any(path.is_dir() for path in self._directory.glob("[0-9]*")):  # orbax's step folders
            raise CheckpointLayoutError(
                f"checkpoint {self._directory} was written by an older jdqn (orbax); "
                "fix: start the run again"
            )
        missing = self._store.latest_step() is None
        if self._processes.any_of(missing):  # every process starts afresh, or none does
            if self._processes.count > 1:
                self._store.discard_after(-1)  # so that no older run's step outlives the new
            return None
        share = self._share(state)
        try:
            share, meta, step = self._store.restore_intact(share, log)
        except NoIntactCheckpointError:
            if self._processes.count == 1:
                raise
            step = -1  # told to the others first, so that they do not wait for this one
        agreed = self._processes.smallest([step])[0]
        if agreed < 0:
            raise NoIntactCheckpointError(
                f"{self._directory.parent}: a process has no checkpoint that passes "
                "verification; fix: start the run again"
            )
        if agreed != step:  # another process holds no intact checkpoint this new
            share, meta = self._store.restore(share, agreed)
            self._store.discard_after(agreed)  # training writes them again
            log(f"jdqn: resuming from step {agreed}, the newest every process holds intact")
        check_param_layout(meta, self._param_layout, self._directory)
        halted = meta["halted_epoch"]
        meta["halted_epoch"] = {
            r: halted[str(g)] for r, g in enumerate(self._indices) if str(g) in halted
        }
        return self._place.learner_arrays(share), meta

    def save(
        self,
        epochs_done: int,
        chunks_done: int,
        state: Any,
        halted_epoch: dict[int, int],
        required: bool,
    ) -> None:
        """Checkpoint after ``epochs_done`` epochs and ``chunks_done`` chunks of the next one
        (numbered by chunks done, so a mid-epoch checkpoint sorts between epoch ends); every
        process calls it. Unless ``required`` (the run stops after it), it is skipped while any
        process still writes the one before: training never waits on the disk (a sweep's
        1,536 default learners are 22 GiB a save), and a resume from any epoch gives the same
        numbers. Nor is one taken before 25 times as long as the run's last host copy has passed
        since it, where that copy took seconds (:class:`SaveCadence`)."""
        if self._store is None:
            return
        skip = self._store.writing() or not self._cadence.due()
        if not required and self._processes.any_of(skip):
            return
        # halted_epoch by the wave's run index g, as one process would record it.
        halted = {str(self._indices[r]): int(e) for r, e in sorted(halted_epoch.items())}
        meta: dict[str, Any] = dict(
            epochs_done=epochs_done, halted_epoch=halted, param_layout=self._param_layout
        )
        meta["binding"] = self._binding
        if chunks_done:
            meta["chunks_done"] = chunks_done
        step = epochs_done * self._chunks_per_epoch + chunks_done
        started = time.perf_counter()
        share = self._share(state)  # the copy to the host, which training waits for
        copy_s = time.perf_counter() - started
        _debug("jdqn: checkpoint step %d: host copy %.2f s", step, copy_s)
        self._store.save(step, share, meta)
        self._cadence.copied(copy_s)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()

    def _share(self, state: Any) -> Any:
        """This process's share of the wave's state on the host, without the device padding:
        with one process, the whole wave."""
        return host(self._place.real(state), len(self._indices))


def check_param_layout(meta: dict[str, Any], expected: list[list[Any]], directory: Path) -> None:
    """Refuse a checkpoint whose flat parameter vectors are laid out otherwise than this jdqn's
    (``ParamLayout.record``; a checkpoint without the record predates it): same sizes, so the
    state restores, but the values would land in the wrong places."""
    if meta.get("param_layout") != expected:
        raise CheckpointLayoutError(
            f"checkpoint {directory} holds parameters in another order or shape (written by "
            "another jdqn version); fix: start the run again"
        )
