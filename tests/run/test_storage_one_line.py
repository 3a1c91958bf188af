"""Storage failures and damaged checkpoints through the ``jdqn`` command (issue 49 item 5): one
line naming the run directory the user's --out leads to and the fix, no tracebacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from es_sample import ES_SAMPLE
from test_checkpoint_integrity import _truncate
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
    """F5: checkpoint files of ~220 KB under a 100 KB limit (EFBIG on the checkpoint's thread):
    the first epoch's cannot be written, so there is nothing to resume and nothing is left."""
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
    # No compilation cache: JAX writes its entries in place, so under the limit it would leave a
    # truncated one (100 KiB exactly) in the cache every other test reads, which then warns.
    done = _jdqn(*argv, "--set", "output.compilation_cache=false", file_size_kib=100)
    assert done.returncode == 2, done.stderr[-3000:]
    run = out / "f5.incomplete"
    _assert_one_line_error(
        done.stderr,
        f"{run}/checkpoints/group0/4.npz: file too large; fix: free space or fix the file "
        "system, then run it again",
    )
    assert not out.exists() or not list(out.iterdir())


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        return _stopped(out, ES_SAMPLE, 7, patch)  # checkpoints 4 and 6


@pytest.mark.slow
def test_a_truncated_latest_checkpoint_falls_back_without_library_tracebacks(stopped, tmp_path):
    """C2: refused in one line, resumed from step 4; nothing on stderr."""
    run = tmp_path / stopped.name
    shutil.copytree(stopped, run)
    _truncate(run / "checkpoints" / "group0" / "6.npz")
    done = _jdqn("walkforward", "--resume", str(run), "--no-progress")
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert f"jdqn: refused checkpoint {run}/checkpoints/group0/6.npz cannot be read" in done.stdout
    assert "jdqn: resumed group 0 after epoch 1\n" in done.stdout


@pytest.mark.slow
def test_every_checkpoint_truncated_is_one_line(stopped, tmp_path):
    """C20: exit 2, one line, nothing from the libraries."""
    run = tmp_path / stopped.name
    shutil.copytree(stopped, run)
    for step in ("4", "6"):
        _truncate(run / "checkpoints" / "group0" / f"{step}.npz")
    done = _jdqn("walkforward", "--resume", str(run), "--no-progress")
    assert done.returncode == 2
    _assert_one_line_error(done.stderr, "no checkpoint passes verification (steps 6, 4)")
