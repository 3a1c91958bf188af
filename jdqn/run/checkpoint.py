"""Epoch-end checkpoints (orbax) that resume a killed run with bit-identical numbers.

Beside each checkpoint a manifest (``sha256/<group>/<step>.json``) holds the SHA-256 of the state's
arrays (path, dtype, shape and bytes of every leaf) and of its metadata, taken from the host copy
that is saved. A restore recomputes both and refuses a checkpoint that cannot be read, has no
manifest or whose digests differ (orbax reads flipped bytes without complaint), or that carries
another run's binding (jdqn.run.binding);
:meth:`Checkpointer.restore_intact` falls back to the newest one that verifies. In a run of several
processes each writes its own share (:class:`ShareCheckpointer`: one ``.npz`` per step).

orbax (with tensorstore, 0.2-0.3 s of GIL-bound start-up on the H200) is imported at first use;
the walk-forward's writer thread imports it while the first chunk trains
(``jdqn.run.report.BackgroundWrites.prefetch``).
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import io
import json
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from jdqn.run import rundir

if TYPE_CHECKING:
    from jdqn.run.binding import Seal
    from jdqn.run.processes import Processes

ORBAX = "orbax.checkpoint"  # the module, for callers that import it ahead of use


def _ocp() -> ModuleType:
    # While another thread imports orbax, Python's module lock makes this wait for it.
    return importlib.import_module(ORBAX)


def _is_typed_key(leaf: Any) -> bool:
    return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _to_storable(tree: Any) -> Any:
    """Typed PRNG keys become their raw uint32 data (orbax stores plain arrays only)."""
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


def state_digest(host: Any) -> str:
    """SHA-256 over every leaf of a storable host tree: its tree path, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(host)[0]:
        array = np.ascontiguousarray(np.asarray(leaf))
        header = f"{jax.tree_util.keystr(path)}|{array.dtype.str}|{array.shape}\n"
        digest.update(header.encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def meta_digest(meta: dict[str, Any]) -> str:
    """SHA-256 of the metadata as canonical JSON (what orbax's JsonSave writes, re-read)."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()


class Checkpointer:
    """Saves ``(state, meta)`` at epoch ends; keeps the latest two.

    A save copies the state to the host and returns; orbax writes that copy, and deletes the one it
    replaces, on its own threads while the next epoch trains (written in place, a save cost
    ~100-120 ms on the H200's host, more than a small epoch). orbax commits a step by renaming its
    temporary directory, so a run killed mid-write resumes from the step before; :meth:`close`
    waits for the writes.
    """

    def __init__(self, directory: Path, accepted: frozenset[str] | None = None) -> None:
        self._directory = directory
        self._accepted = accepted  # the run's binding digests (jdqn.run.binding); None: any
        self._manager_: Any = None  # orbax's CheckpointManager, made at first use
        self._manifests = directory.parent / "sha256" / directory.name
        self._hashing: threading.Thread | None = None  # the last save's manifest writer
        self._hashing_error: BaseException | None = None  # raised again on this thread

    def manifest_path(self, step: int) -> Path:
        return self._manifests / f"{step}.json"

    def _write_manifest(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        try:
            self._write_in_background(step, host, meta)
        except BaseException as error:  # e.g. a full disk: reported by the thread that waits
            self._hashing_error = error

    def _write_in_background(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        """The manifest (orbax writes the state on its own threads)."""
        digests = {"state_sha256": state_digest(host), "meta_sha256": meta_digest(meta)}
        rundir.write_json(self.manifest_path(step), {"step": step, **digests})

    def _step_path(self, step: int) -> Path:
        return self._directory / str(step)  # orbax's directory of the step

    def _prune_manifests(self) -> None:
        """Drop the manifests of deleted steps (orbax keeps the latest two)."""
        for manifest in self._manifests.glob("*.json"):
            if not self._step_path(int(manifest.stem)).exists():
                manifest.unlink(missing_ok=True)

    def _wait_for_manifest(self) -> None:
        if self._hashing is not None:
            self._hashing.join()
            self._hashing = None
        if self._hashing_error is not None:
            error, self._hashing_error = self._hashing_error, None
            raise error

    @property
    def _manager(self) -> Any:
        if self._manager_ is None:
            ocp = _ocp()
            # This process alone, without orbax's barriers with others (its default: every
            # process saves together); runs of several processes use ShareCheckpointer.
            this = jax.process_index()
            alone = ocp.options.MultiprocessingOptions(
                primary_host=this, active_processes={this}, barrier_sync_key_prefix=f"p{this}"
            )
            self._directory.mkdir(parents=True, exist_ok=True)  # orbax's create=True refuses
            self._manager_ = ocp.CheckpointManager(
                self._directory.absolute(),
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=2,
                    enable_async_checkpointing=True,
                    enable_background_delete=True,
                    multiprocessing_options=alone,
                    create=False,
                ),
            )
        return self._manager_

    def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        # The host copy is taken now: the next training chunk donates the state's device buffers.
        host = jax.device_get(_to_storable(state))
        if not all_finite(host):  # the guard keeps them out of the state; this is the last defence
            raise RuntimeError("refusing to checkpoint a state with non-finite values")
        # Digests on a thread (hashlib releases the GIL) while the next epoch trains, like orbax's
        # write; a run killed before the manifest exists resumes from the checkpoint before.
        self._wait_for_manifest()
        self._hashing = threading.Thread(
            target=self._write_manifest, args=(step, host, meta), name="jdqn-checkpoint-digest"
        )
        self._hashing.start()
        self._write(step, host, meta)

    def _write(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        args = _ocp().args
        self._manager.save(
            step, args=args.Composite(state=args.StandardSave(host), meta=args.JsonSave(meta))
        )

    def _read(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """The step's storable state (in the structure of ``like``) and metadata."""
        ocp = _ocp()
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _to_storable(like))
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        )
        restored = self._manager.restore(step, args=args)
        return restored.state, dict(restored.meta)

    def latest_step(self) -> int | None:
        # orbax names a committed step's directory by its number, and a step being written by
        # its number and a temporary suffix: with neither there is nothing to ask orbax about.
        if self._manager_ is None and not any(self._directory.glob("[0-9]*")):
            return None
        return self._manager.latest_step()

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restore into the structure of ``like`` (e.g. a freshly initialised state), verified
        against the step's manifest (:class:`CheckpointCorruptError` when it fails)."""
        self._manager.wait_until_finished()  # a save of this process may still be writing
        self._wait_for_manifest()
        step = self._manager.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError("no checkpoint to resume from")
        where = f"checkpoint {self._step_path(step)}"
        try:
            manifest = json.loads(self.manifest_path(step).read_text())
        except (OSError, ValueError):
            raise CheckpointCorruptError(f"{where} has no readable checksum manifest") from None
        try:
            stored, meta = self._read(step, like)
        except Exception as error:  # whatever orbax fails on, the checkpoint is damaged
            mismatch = ("tree structures do not match", "Structure mismatch")  # jax, numpy targets
            if isinstance(error, ValueError) and any(m in str(error) for m in mismatch):
                # orbax's own message lists every mismatching leaf over many lines.
                raise CheckpointLayoutError(
                    f"checkpoint {self._directory} (step {step}) holds a state of another layout "
                    "(written by another jdqn version or config); fix: start the run again"
                ) from None
            first_line = (str(error).strip().splitlines() or [""])[0][:160]
            reason = f"{type(error).__name__}: {first_line}"
            del error
            # orbax leaves the failed read's tensorstore handles for the collector, which warns
            # about each one (ResourceWarning) wherever it next runs: collect them here, quietly.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                gc.collect()
            raise CheckpointCorruptError(f"{where} cannot be read ({reason})") from None
        host_state = jax.device_get(stored)
        if manifest.get("state_sha256") != state_digest(host_state):
            raise CheckpointCorruptError(f"{where}: its arrays do not match their SHA-256")
        if manifest.get("meta_sha256") != meta_digest(meta):
            raise CheckpointCorruptError(f"{where}: its metadata does not match its SHA-256")
        # A checkpoint of another run (copied in) has its own config, learners or data.
        if self._accepted is not None and meta.get("binding", "") not in {"", *self._accepted}:
            raise CheckpointCorruptError(f"{where} belongs to another run (config, seeds or data)")
        return _from_storable(stored, like), meta

    def restore_intact(
        self, like: Any, log: Callable[[str], None]
    ) -> tuple[Any, dict[str, Any], int]:
        """The newest checkpoint that verifies, as ``(state, meta, step)``; each newer one that
        does not is refused in one line and deleted (so that training writes its step again).
        :class:`NoIntactCheckpointError` when none verifies."""
        self._manager.wait_until_finished()
        self._wait_for_manifest()
        refused: list[int] = []
        for step in sorted(self._manager.all_steps(), reverse=True):
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
        self._manager.wait_until_finished()
        self._wait_for_manifest()
        for newer in self._manager.all_steps():
            if newer > step:
                self._delete(newer)

    def _delete(self, step: int) -> None:
        self._manager.delete(step)
        self.manifest_path(step).unlink(missing_ok=True)

    def close(self) -> None:
        """Wait for the pending write and deletion, then release orbax's threads."""
        try:
            self._wait_for_manifest()
        finally:  # orbax's threads are ended even when the manifest could not be written
            if self._manager_ is not None:  # else nothing was read or written
                self._manager_.wait_until_finished()
                self._manager_.close()
                self._prune_manifests()


META = "__meta__"  # the metadata's entry (JSON text) in a share's .npz


def leaf_name(path: Any) -> str:
    """A leaf's tree path as dotted names (``learner.params.0``), an entry of a share's .npz."""
    keys = (getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return ".".join(map(str, keys))


def _named(tree: Any) -> dict[str, Any]:
    """The leaves of ``tree`` by :func:`leaf_name`, in its flattening order."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    named = {leaf_name(path): x for path, x in leaves}
    if len(named) != len(leaves):
        raise ValueError("two leaves of the state have one dotted name")
    return named


class ShareCheckpointer(Checkpointer):
    """One process's share of the learners in a run of several processes: each step is one
    ``<step>.npz`` in this process's own folder (leaves and metadata, written atomically on the
    digest thread before its manifest ``sha256/<step>.json``); the latest two are kept.

    Not orbax: its NumpyHandler writes numpy arrays from process 0 only, and it refuses a
    ``jax.Array`` held by one process when there are several.
    """

    def __init__(self, directory: Path, accepted: frozenset[str] | None = None) -> None:
        super().__init__(directory, accepted)
        self._manifests = directory / "sha256"
        self._manager_ = _ShareFiles(directory)

    def _step_path(self, step: int) -> Path:
        return self._directory / f"{step}.npz"

    def _write(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        pass  # written with its manifest, on the digest thread (_write_in_background)

    def _write_in_background(self, step: int, host: Any, meta: dict[str, Any]) -> None:
        buffer = io.BytesIO()
        entries: dict[str, Any] = {name: np.asarray(x) for name, x in _named(host).items()}
        entries[META] = np.asarray(json.dumps(meta))
        np.savez(buffer, **entries)
        rundir.write_atomic(self._step_path(step), buffer.getvalue())
        super()._write_in_background(step, host, meta)
        for old in self._manager.all_steps()[:-2]:
            self._manager.delete(old)
        self._prune_manifests()

    def _read(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        storable = _to_storable(like)
        expected = _named(storable)
        with np.load(self._step_path(step)) as stored:
            meta = json.loads(str(stored[META]))
            if set(stored.files) != {*expected, META}:  # the wording Checkpointer.restore reads
                raise ValueError("Structure mismatch: other leaves")
            leaves = [stored[name] for name in expected]
        for name, leaf in zip(expected, leaves, strict=True):
            if leaf.shape != np.shape(expected[name]) or leaf.dtype != expected[name].dtype:
                raise ValueError(f"Structure mismatch: {name} is {leaf.dtype}{leaf.shape}")
        return jax.tree.unflatten(jax.tree.structure(storable), leaves), meta


class _ShareFiles:
    """The calls :class:`Checkpointer` makes of orbax's CheckpointManager, on ``<step>.npz``."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory

    def all_steps(self) -> list[int]:
        return sorted(int(path.stem) for path in self._directory.glob("[0-9]*.npz"))

    def latest_step(self) -> int | None:
        return max(self.all_steps(), default=None)

    def delete(self, step: int) -> None:
        (self._directory / f"{step}.npz").unlink(missing_ok=True)

    def wait_until_finished(self) -> None:
        pass  # the digest thread writes; Checkpointer waits for it

    def close(self) -> None:
        pass


def host(tree: Any, learners: int) -> Any:
    """The first ``learners`` runs of every leaf, on the host: without the device padding."""
    return jax.tree.map(lambda x: np.asarray(x)[:learners], jax.device_get(tree))


class GroupCheckpoints:
    """A group's checkpoints: orbax in ``checkpoints/group<g>/``, or each process's own share in
    ``process-<i>/`` below it (:class:`ShareCheckpointer`; docs/design.md §11)."""

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
    ) -> None:
        """``directory``: the group's; ``place``: how the wave's state is placed
        (``placement.Placement``); ``runs``: the wave's runs; ``param_layout``: saved with each
        checkpoint (``ParamLayout.record``)."""
        self.enabled = enabled
        self._directory = directory
        if processes.count > 1:
            self._directory /= f"process-{processes.index}"
        store = ShareCheckpointer if processes.count > 1 else Checkpointer
        self._store = store(self._directory, seal.accepted) if enabled else None
        self._binding = seal.sha256
        self._place, self._processes = place, processes
        self._indices = processes.share(list(range(runs)))  # its runs in the wave
        self._chunks_per_epoch = chunks_per_epoch
        self._param_layout = param_layout

    def resume(self, state: Any, log: Callable[[str], None]) -> tuple[Any, dict[str, Any]] | None:
        """The newest intact checkpoint's share of the state, placed as ``state`` is, and its
        metadata (``halted_epoch`` by this process's run index); None without one."""
        if self._store is None:
            return None
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
        self, epochs_done: int, chunks_done: int, state: Any, halted_epoch: dict[int, int]
    ) -> None:
        """Checkpoint after ``epochs_done`` epochs and ``chunks_done`` chunks of the next one
        (numbered by chunks done, so a mid-epoch checkpoint sorts between epoch ends); every
        process calls it."""
        if self._store is None:
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
        self._store.save(step, self._share(state), meta)

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
