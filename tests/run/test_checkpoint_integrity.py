"""Checkpoint verification: a damaged checkpoint is refused in one line and resume falls back to
the newest intact one (corrupted files written by the test)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdqn.run import checkpoint, rundir
from jdqn.run.binding import Seal
from jdqn.run.checkpoint import (
    META,
    CheckpointCorruptError,
    Checkpointer,
    GroupCheckpoints,
    NoIntactCheckpointError,
    SaveCadence,
    meta_digest,
    state_digest,
)
from jdqn.run.processes import Processes


def _state(step: int) -> dict:
    return {"w": jnp.arange(20_000.0) * step, "step": jnp.int32(step)}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """Steps 1 and 2 of a run's group0, written and closed."""
    directory = tmp_path / "group0"
    checkpointer = Checkpointer(directory)
    for step in (1, 2):
        checkpointer.save(step, _state(step), {"epochs_done": step})
    checkpointer.close()
    return directory


def _flip_64_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))  # same size


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _rewritten(path: Path, **changes: np.ndarray) -> None:
    """The step's .npz written again, whole and readable, with ``changes`` (an array or the
    metadata replaced, an entry of another name added)."""
    rundir.write_arrays(path, {**rundir.read_arrays(path), **changes})


DAMAGE = {
    "flipped": _flip_64_bytes,
    "emptied": lambda path: path.write_bytes(b""),
    "truncated": _truncate,
    # What the orbax format's deleted data file became: an array that is not the one saved.
    "replaced": lambda path: _rewritten(path, w=np.zeros(20_000, np.float32)),
}


def test_the_digest_sees_every_byte_dtype_shape_and_leaf_name():
    base = {"a": np.arange(4, dtype=np.float32), "b": np.int32(1)}
    digest = state_digest(base)
    assert digest == state_digest({"a": np.arange(4, dtype=np.float32), "b": np.int32(1)})
    changed = [
        {"a": np.array([0, 1, 2, 3.0000002], np.float32), "b": np.int32(1)},  # one ulp
        {"a": np.arange(4, dtype=np.float64), "b": np.int32(1)},
        {"a": np.arange(4, dtype=np.float32).reshape(2, 2), "b": np.int32(1)},
        {"c": np.arange(4, dtype=np.float32), "b": np.int32(1)},
    ]
    assert all(state_digest(tree) != digest for tree in changed)
    assert meta_digest({"x": 1, "y": [2]}) == meta_digest({"y": [2], "x": 1})


def test_an_intact_checkpoint_restores_with_its_manifest(saved):
    manifest = json.loads((saved / "sha256" / "2.json").read_text())
    assert manifest["state_sha256"] == state_digest(
        {"step": np.int32(2), "w": np.arange(20_000.0, dtype=np.float32) * 2}
    )
    checkpointer = Checkpointer(saved)
    state, meta, step = checkpointer.restore_intact(_state(0), log=print)
    checkpointer.close()
    assert step == 2 and meta == {"epochs_done": 2} and int(state["step"]) == 2


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_latest_checkpoint_is_refused_and_the_previous_one_restored(saved, damage):
    DAMAGE[damage](saved / "2.npz")
    lines: list[str] = []
    checkpointer = Checkpointer(saved)
    with pytest.raises(CheckpointCorruptError) as caught:
        checkpointer.restore(_state(0), 2)
    assert "\n" not in str(caught.value) and str(saved / "2.npz") in str(caught.value)
    state, meta, step = checkpointer.restore_intact(_state(0), log=lines.append)
    checkpointer.close()
    assert step == 1 and meta == {"epochs_done": 1}
    np.testing.assert_array_equal(np.asarray(state["w"]), np.arange(20_000.0))
    assert len(lines) == 2 and lines[0].startswith(f"jdqn: refused checkpoint {saved / '2.npz'}")
    assert "previous intact checkpoint, step 1" in lines[1]
    assert sorted(p.name for p in saved.iterdir()) == ["1.npz", "sha256"]  # the refused step gone
    assert sorted(p.name for p in (saved / "sha256").iterdir()) == ["1.json"]
    # Training then writes step 2 again, and it verifies.
    checkpointer = Checkpointer(saved)
    checkpointer.save(2, _state(2), {"epochs_done": 2})
    _, _, step = checkpointer.restore_intact(_state(0), log=lines.append)
    checkpointer.close()
    assert step == 2


def test_a_deleted_latest_checkpoint_is_passed_over_in_silence(saved):
    """No ``<step>.npz``: no step (what a run killed while writing it leaves)."""
    (saved / "2.npz").unlink()
    lines: list[str] = []
    checkpointer = Checkpointer(saved)
    _, meta, step = checkpointer.restore_intact(_state(0), log=lines.append)
    assert step == 1 and meta == {"epochs_done": 1} and lines == []
    checkpointer.save(3, _state(3), {"epochs_done": 3})
    checkpointer.close()  # the orphaned manifest of step 2 is dropped with the next save
    assert sorted(p.name for p in (saved / "sha256").iterdir()) == ["1.json", "3.json"]


def test_tampered_metadata_and_a_missing_manifest_are_refused(saved):
    _rewritten(saved / "2.npz", **{META: np.asarray(json.dumps({"epochs_done": 7}))})
    (saved / "sha256" / "1.json").unlink()
    checkpointer = Checkpointer(saved)
    lines: list[str] = []
    with pytest.raises(NoIntactCheckpointError, match="fix: start the run again") as caught:
        checkpointer.restore_intact(_state(0), log=lines.append)
    checkpointer.close()
    assert "\n" not in str(caught.value)
    assert "metadata does not match" in lines[0] and "no readable checksum manifest" in lines[1]


def test_the_manifests_of_the_kept_steps_remain_and_only_those(tmp_path):
    """Steps need not be consecutive (a SIGTERM's checkpoint sits between epoch ends)."""
    checkpointer = Checkpointer(tmp_path / "group0")
    for step in (4, 6, 8, 9):
        checkpointer.save(step, _state(step), {"epochs_done": step})
    checkpointer.close()
    assert sorted(p.name for p in (tmp_path / "group0").iterdir()) == ["8.npz", "9.npz", "sha256"]
    assert sorted(p.name for p in (tmp_path / "group0" / "sha256").iterdir()) == [
        "8.json",
        "9.json",
    ]
    reopened = Checkpointer(tmp_path / "group0")
    _, _, step = reopened.restore_intact(_state(0), log=print)
    assert step == 9
    reopened.restore(_state(0), 8)
    reopened.close()


def test_a_step_is_one_npz_of_named_leaves_and_another_layout_is_refused(tmp_path):
    """A run of one process and each process of several (its share in its own folder) save
    alike: leaves by tree path and the metadata in one file; a state of other leaves is refused
    in one line (not restored into the wrong places)."""
    directory = tmp_path / "group0" / "process-1"
    checkpointer = Checkpointer(directory)
    checkpointer.save(9, _state(9), {"epochs_done": 9})
    checkpointer.close()
    with np.load(directory / "9.npz") as stored:
        assert sorted(stored.files) == [META, "step", "w"]
        np.testing.assert_array_equal(stored["w"], np.arange(20_000.0, dtype=np.float32) * 9)
        assert json.loads(str(stored[META])) == {"epochs_done": 9}
    for other in ({"w": jnp.zeros(3), "step": jnp.int32(0)}, {"w": jnp.zeros(20_000)}):
        with pytest.raises(ValueError, match="another layout") as caught:
            checkpointer.restore(other, 9)
        assert "\n" not in str(caught.value) and "fix: start the run again" in str(caught.value)
    checkpointer.discard_after(-1)
    assert checkpointer.latest_step() is None and not list((directory / "sha256").iterdir())


def test_typed_prng_keys_are_stored_as_their_raw_data_and_restored_typed(tmp_path):
    key = jax.random.key(7)
    checkpointer = Checkpointer(tmp_path / "group0")
    checkpointer.save(1, {"key": key}, {})
    restored, _ = checkpointer.restore({"key": jax.random.key(0)})
    checkpointer.close()
    with np.load(tmp_path / "group0" / "1.npz") as stored:
        assert stored["key"].dtype == np.uint32
    assert jax.dtypes.issubdtype(restored["key"].dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(key))


def test_a_checkpoint_of_another_run_is_refused_and_the_run_s_own_restored(tmp_path):
    """C9 at the checkpointer: step 2 carries another run's binding digest (jdqn.run.binding)."""
    directory = tmp_path / "group0"
    writer = Checkpointer(directory)
    writer.save(1, _state(1), {"epochs_done": 1, "binding": "ours"})
    writer.save(2, _state(2), {"epochs_done": 2, "binding": "theirs"})
    writer.close()
    lines: list[str] = []
    reader = Checkpointer(directory, accepted=frozenset({"ours"}))
    _, meta, step = reader.restore_intact(_state(0), log=lines.append)
    reader.close()
    assert step == 1 and meta["binding"] == "ours"
    assert lines[0].endswith("group0/2.npz belongs to another run (config, seeds or data)")
    anyone = Checkpointer(directory)  # a run from before bindings: not checked
    assert anyone.restore_intact(_state(0), log=lines.append)[2] == 1  # step 2 was deleted
    anyone.close()


class _Unpadded:
    """A placement whose state has no device padding."""

    @staticmethod
    def real(state):
        return state


def _one_learner_group(directory: Path, cadence: SaveCadence | None = None) -> GroupCheckpoints:
    """One process's checkpoints of a one-learner group, one chunk an epoch."""
    return GroupCheckpoints(
        directory,
        enabled=True,
        processes=Processes(),
        seal=Seal("digest", frozenset({"digest"}), ()),
        place=_Unpadded(),
        runs=1,
        chunks_per_epoch=1,
        param_layout=[],
        cadence=cadence,
    )


def test_a_save_is_skipped_while_the_one_before_is_written_unless_required(tmp_path, monkeypatch):
    """Training never waits on the disk: an epoch's save while the last one is still being
    written is skipped; a save the run stops after is written once the one before is done."""
    release = threading.Event()
    write = rundir.write_arrays

    def slow(path, arrays):
        assert release.wait(30)
        write(path, arrays)

    monkeypatch.setattr(rundir, "write_arrays", slow)
    group = _one_learner_group(tmp_path / "group0")
    state = {"w": np.ones((1, 3), np.float32)}
    group.save(1, 0, state, {}, required=False)  # written (slowly)
    group.save(2, 0, state, {}, required=False)  # skipped: step 1 is still being written
    threading.Timer(0.2, release.set).start()
    group.save(3, 0, state, {}, required=True)  # waits for step 1, then is written
    group.close()
    assert sorted(p.name for p in (tmp_path / "group0").glob("*.npz")) == ["1.npz", "3.npz"]
    group.save(4, 0, state, {}, required=False)  # nothing is being written: saved
    group.close()
    assert sorted(p.name for p in (tmp_path / "group0").glob("*.npz")) == ["3.npz", "4.npz"]


def test_a_save_is_skipped_until_training_took_25_times_its_host_copy(tmp_path, monkeypatch):
    """A large state's host copy holds training up (a sweep wave's 11 GiB take seconds): the
    next save waits until training has gone on 1 / COPY_SHARE times as long; a save the run
    stops after is taken regardless, and copies quicker than SLOW_COPY_S never skip one. The
    cadence is the run's: a group after a slow copy in the group before waits as well."""
    clock = [0.0]
    monkeypatch.setattr(checkpoint.time, "perf_counter", lambda: clock[0])

    def saved_steps(
        directory: Path, copy_s: float, epoch_s: float, cadence: SaveCadence | None = None
    ) -> list[int]:
        group = _one_learner_group(directory, cadence)
        share = group._share

        def slow_copy(state):
            clock[0] += copy_s
            return share(state)

        monkeypatch.setattr(group, "_share", slow_copy)
        state = {"w": np.ones((1, 3), np.float32)}
        saved = []
        for step in range(1, 8):
            clock[0] += epoch_s  # an epoch of training
            before = set(directory.glob("*.npz"))
            group.save(step, 0, state, {}, required=step == 7)
            group.close()  # the write is done: only the copy's time decides
            saved += [step] if set(directory.glob("*.npz")) != before else []
        return saved

    assert (checkpoint.COPY_SHARE, checkpoint.SLOW_COPY_S) == (0.04, 1.0)
    # Copies of 2 s: the next save once 50 s of training have passed (steps 1 and 5), and step 7,
    # where the run stops.
    assert saved_steps(tmp_path / "slow", copy_s=2.0, epoch_s=15.0) == [1, 5, 7]
    assert saved_steps(tmp_path / "quick", copy_s=0.9, epoch_s=1.0) == [1, 2, 3, 4, 5, 6, 7]
    # Two groups of one run: the first saves as above, the last time where it stops; the
    # second's first three epochs (45 s) follow that copy too closely, its fourth (60 s) does
    # not. On a cadence of its own it would save after its first epoch.
    run = SaveCadence()
    assert saved_steps(tmp_path / "group0", copy_s=2.0, epoch_s=15.0, cadence=run) == [1, 5, 7]
    assert saved_steps(tmp_path / "group1", copy_s=2.0, epoch_s=15.0, cadence=run) == [4, 7]
