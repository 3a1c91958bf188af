"""Storage failures and damaged checkpoints through the ``jdqn`` command (issue 49 item 5): one
line naming the run directory the user's --out leads to and the fix, no library tracebacks (orbax
and tensorstore log their own, shown with -v only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from es_sample import ES_SAMPLE
from test_checkpoint_integrity import _largest_data_file
from test_cli import _assert_one_line_error
from test_resume_binding import _stopped

REPO = Path(__file__).resolve().parents[2]
SMALL_FLAGS = ["--profile", "smoketest", "--no-progress", "--folds", "1", "--epochs", "2"]
for _item in (
    "walkforward.train_bars=1000",
    "walkforward.test_bars=300",
    "walkforward.purge_bars=60",
    "train.n_slices=16",
    "train.batch_size=32",
    "replay.capacity=128",
    "train.chunk_iterations=16",
    "output.plots=false",
    "output.tensorboard=false",
):
    SMALL_FLAGS += ["--set", _item]


def _jdqn(*argv: str, file_size_kib: int | None = None) -> subprocess.CompletedProcess:
    """``python -m jdqn ARGV``, under ``ulimit -f file_size_kib`` when given."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "jdqn", *argv]
    if file_size_kib is not None:
        command = ["bash", "-c", f'ulimit -f {file_size_kib} && exec "$@"', "jdqn", *command]
    return subprocess.run(command, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_a_file_size_limit_at_a_checkpoint_is_one_line_naming_the_run(tmp_path):
    """F5: checkpoint files of ~220 KB under a 100 KB limit (EFBIG on orbax's threads)."""
    out = tmp_path / "runs"
    argv = [
        "walkforward",
        *SMALL_FLAGS,
        "--data",
        str(ES_SAMPLE),
        "--out",
        str(out),
        "--name",
        "f5",
    ]
    done = _jdqn(*argv, file_size_kib=100)
    assert done.returncode == 2, done.stderr[-3000:]
    run = out / "f5.incomplete"
    _assert_one_line_error(
        done.stderr,
        f"{run}: file too large (writing checkpoints/group0/4); fix: free space or fix the file "
        f"system, then resume with: jdqn walkforward --resume {run}",
    )


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        return _stopped(out, ES_SAMPLE, 7, patch)  # checkpoints 4 and 6


def _truncate(step_dir: Path) -> None:
    path = _largest_data_file(step_dir)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_falls_back_without_library_tracebacks(stopped, tmp_path):
    """C2: refused in one line, resumed from step 4; nothing on stderr."""
    run = tmp_path / stopped.name
    shutil.copytree(stopped, run)
    _truncate(run / "checkpoints" / "group0" / "6")
    done = _jdqn("walkforward", "--resume", str(run), "--no-progress")
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert f"jdqn: refused checkpoint {run}/checkpoints/group0/6 cannot be read" in done.stdout
    assert "jdqn: resumed group 0 after epoch 1\n" in done.stdout


@pytest.mark.slow
def test_every_checkpoint_truncated_is_one_line(stopped, tmp_path):
    """C20: exit 2, one line, nothing from the libraries."""
    run = tmp_path / stopped.name
    shutil.copytree(stopped, run)
    for step in ("4", "6"):
        _truncate(run / "checkpoints" / "group0" / step)
    done = _jdqn("walkforward", "--resume", str(run), "--no-progress")
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, "no checkpoint passes verification (steps 6, 4)")


def _finish_after_the_loop_closed() -> None:
    """What orbax's failed save or restore leaves: a tensorstore future awaited on an event
    loop that is closed before the future completes on another thread."""
    import asyncio
    import threading

    import tensorstore as ts

    promise, future = ts.Promise.new()

    async def await_briefly() -> None:
        task = asyncio.ensure_future(future)
        task._log_destroy_pending = False  # type: ignore[attr-defined]  # left pending on purpose
        await asyncio.sleep(0.01)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(await_briefly())
    loop.close()
    completer = threading.Thread(target=promise.set_result, args=(1,))
    completer.start()
    completer.join()


@pytest.mark.parametrize("verbose", [0, 1])
def test_the_closed_loop_reports_of_tensorstore_show_with_verbose_only(monkeypatch, capfd, verbose):
    from jdqn.run import console_log

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    console_log.configure(verbose)
    _finish_after_the_loop_closed()
    err = capfd.readouterr().err
    assert ("RuntimeError: Event loop is closed" in err) == bool(verbose), err
