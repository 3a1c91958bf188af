"""Storage failures (a full disk) and damaged compressed bar files: one line naming the path and
the problem, exit 2, and the run left resumable where it had got to."""

from __future__ import annotations

import errno
import gzip
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from es_sample import ES_SAMPLE
from smoke import SMOKE
from test_cli import _assert_one_line_error
from test_termination import SMALL

from jdqn.cli import EXIT_USER_ERROR, main
from jdqn.run import faults, rundir
from jdqn.run.checkpoint import Checkpointer
from jdqn.run.metrics_log import MetricsLog


def _real_enospc() -> OSError:
    """What writing to a full device raises (/dev/full is one)."""
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        os.write(fd, b"x")
    except OSError as error:
        return error
    finally:
        os.close(fd)
    raise AssertionError("/dev/full accepted a write")


def test_a_storage_failure_is_found_in_the_error_or_behind_it():
    full = _real_enospc()
    assert full.errno == errno.ENOSPC and faults.io_problem(full) == "no space left on the device"
    named = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/runs/r.incomplete/metrics.jsonl")
    assert (
        faults.io_problem(named) == "/runs/r.incomplete/metrics.jsonl: no space left on the device"
    )
    try:  # how a wrapper reports it: its own type, the errno in the text, the cause kept
        try:
            raise full
        except OSError as cause:
            raise RuntimeError("Error writing /runs/r.incomplete/checkpoints/group0/4") from cause
    except RuntimeError as wrapped:
        assert faults.io_problem(wrapped) == "no space left on the device"
    quoted = ValueError('Error writing "/x/d/ab12": [Errno 122] Disk quota exceeded')
    assert faults.io_problem(quoted) == "/x/d/ab12: disk quota exceeded"
    assert faults.io_problem(ValueError("shapes do not match")) is None
    assert faults.io_problem(OSError(errno.ENOENT, "No such file or directory")) is None
    with pytest.raises(faults.IOFault, match=r"then resume with: jdqn walkforward --resume /r"):
        faults.raise_as_user_error(named, Path("/r"))
    with pytest.raises(faults.IOFault, match=r"then resume with: jdqn sweep --resume /r$"):
        faults.raise_as_user_error(named, Path("/r"), command="jdqn sweep")
    faults.raise_as_user_error(KeyboardInterrupt(), Path("/r"))  # not a storage failure: returns


@pytest.mark.parametrize("number", [errno.EFBIG, errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_checkpoint_write_that_fails_names_the_step_file_and_leaves_no_part_of_it(
    tmp_path, monkeypatch, number
):
    """F2/F5: a file write's OSError names no file (EFBIG under ``ulimit -f``, a full disk, a
    file system gone read-only or refusing); the checkpoint's names its step, inside the run,
    and the write leaves nothing half-written."""
    run = tmp_path / "r.incomplete"

    def failing(handle, **arrays):
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(np, "savez", failing)
    checkpointer = Checkpointer(run / "checkpoints" / "group0")
    checkpointer.save(4, {"w": jnp.ones(3)}, {"epochs_done": 1})
    with pytest.raises(OSError) as failed:
        checkpointer.close()
    expected = (
        f"{run}/checkpoints/group0/4.npz: {faults.STORAGE_ERRNOS[number]}; fix: free space or "
        f"fix the file system, then resume with: jdqn walkforward --resume {run}"
    )
    with pytest.raises(faults.IOFault) as raised:
        faults.raise_as_user_error(failed.value, run, where=run)
    assert str(raised.value) == expected
    group = run / "checkpoints" / "group0"
    assert [p.name for p in group.iterdir()] == ["sha256"]  # no 4.npz, no temporary file


def _gzip_cases(tmp_path: Path) -> dict[str, Path]:
    data = gzip.compress(ES_SAMPLE.read_bytes())
    middle = len(data) // 2
    cases = {
        "truncated": data[:middle],
        "corrupt": data[:middle] + bytes(64) + data[middle + 64 :],
        "not gzip": ES_SAMPLE.read_bytes(),
    }
    paths = {}
    for name, content in cases.items():
        paths[name] = tmp_path / f"{name.replace(' ', '_')}.csv.gz"
        paths[name].write_bytes(content)
    return paths


def test_a_damaged_csv_gz_is_one_line_naming_it_and_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "runs"
    for path in _gzip_cases(tmp_path).values():
        code = main([*SMOKE, "--data", str(path), "--out", str(out), "--no-progress"])
        assert code == EXIT_USER_ERROR
        _assert_one_line_error(capsys.readouterr().err, f"{path}: compressed file is truncated")
        assert main(["data", "check", str(path)]) == EXIT_USER_ERROR
        _assert_one_line_error(capsys.readouterr().err, "fix: copy or download the file again")
    assert not out.exists()


def test_a_manifest_that_cannot_be_written_is_reported_and_its_step_not_trusted(
    tmp_path, monkeypatch
):
    checkpointer = Checkpointer(tmp_path / "group0")
    checkpointer.save(1, {"w": jnp.ones(3)}, {"epochs_done": 1})
    write = rundir.write_json

    def full_disk(path, payload):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(rundir, "write_json", full_disk)
    checkpointer.save(2, {"w": jnp.full(3, 2.0)}, {"epochs_done": 2})
    with pytest.raises(OSError, match="No space left"):
        checkpointer.close()
    monkeypatch.setattr(rundir, "write_json", write)
    reopened = Checkpointer(tmp_path / "group0")
    lines: list[str] = []
    _, meta, step = reopened.restore_intact({"w": jnp.zeros(3)}, log=lines.append)
    reopened.close()
    assert step == 1 and meta == {"epochs_done": 1} and lines == []
    assert not (tmp_path / "group0" / "2.npz").exists()  # the manifest first: no step without one


@pytest.mark.slow
def test_a_full_disk_mid_run_and_at_the_end_is_one_line_and_the_run_resumes(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "runs"
    args = [*SMOKE, "--no-progress", "--out", str(out), "--name", "r"]
    for item in SMALL:
        args += ["--set", item]
    stopped = out / "r.incomplete"
    add = MetricsLog.add

    def disk_full_in_epoch_2(self, epoch, chunk, *rest):
        if epoch == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(stopped / "metrics.jsonl"))
        return add(self, epoch, chunk, *rest)

    monkeypatch.setattr(MetricsLog, "add", disk_full_in_epoch_2)
    assert main(args) == EXIT_USER_ERROR
    captured = capsys.readouterr()
    _assert_one_line_error(
        captured.err,
        f"{stopped / 'metrics.jsonl'}: no space left on the device; fix: free space or fix the "
        f"file system, then resume with: jdqn walkforward --resume {stopped}",
    )
    assert "run interrupted" not in captured.out
    assert (stopped / "checkpoints" / "group0" / "4.npz").is_file()  # epoch 1 is kept
    monkeypatch.undo()

    write = rundir.write_json

    def results_disk_full(path, payload):
        if path.name == "results.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, payload)

    monkeypatch.setattr(rundir, "write_json", results_disk_full)
    assert main(["walkforward", "--resume", str(stopped), "--no-progress"]) == EXIT_USER_ERROR
    _assert_one_line_error(capsys.readouterr().err, f"{stopped / 'results.json'}: no space left")
    monkeypatch.undo()

    assert main(["walkforward", "--resume", str(stopped), "--no-progress"]) == 0
    assert "resumed group 0 after epoch 2" in capsys.readouterr().out
    assert (out / "r" / "results.json").exists() and not stopped.exists()
